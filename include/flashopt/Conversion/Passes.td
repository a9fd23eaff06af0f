//===- Passes.td - flashopt conversion passes --------------*- tablegen -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CONVERSION_PASSES_TD
#define FLASHOPT_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def FlashOptToCPU : Pass<"flashopt-to-cpu", "::mlir::ModuleOp"> {
  let summary = "Lower flashopt.kernel to a host function over whole groups";
  let description = [{
    Replaces every `flashopt.kernel` by a `func.func` with the kernel ABI of
    docs/KERNEL-ABI.md (`table, ntensors, hypers, step, group_begin,
    group_end`, all i64). The function walks the tensor table, evaluates the
    kernel prologue once per tensor (hyper-parameters from the tensor's slot),
    and runs the group body once per group with every value a
    `vector<G x T>` (G = group size): full groups unmasked, the partial last
    group of a tensor with masked loads and stores. `flashopt.group_max`
    becomes a `vector.reduction <maximumf>`. With `interleave=N`, runs of N
    full groups share one loop iteration, their bodies interleaved operation
    by operation (independent dependency chains side by side for an
    out-of-order core); the remaining groups take the one-group loop. With
    `reduce-lanes=L` as well, the absmaxes of the N groups (unsigned maxima
    of bits) are one transposed reduction ending in L-lane vectors instead
    of N reductions: the same maxima, about half the shuffles. Memory is accessed with
    `flashopt.raw_load` / `flashopt.raw_store` on the table's addresses.

    ```mlir
    func.func @sgd(%table: i64, %ntensors: i64, %hypers: i64, %step: i64,
                   %group_begin: i64, %group_end: i64) {
      scf.for %t = ... {
        %numel = flashopt.raw_load %table[%i] : i64
        ...
        %p = flashopt.raw_load %base[%e] {alignment = 4} : vector<32xf32>
      }
    }
    ```
  }];
  let dependentDialects = ["::mlir::func::FuncDialect", "::mlir::scf::SCFDialect",
                           "::mlir::vector::VectorDialect", "::mlir::arith::ArithDialect"];
  let options = [
    Option<"interleave", "interleave", "int64_t", /*default=*/"1",
           "Full groups per loop iteration, their bodies interleaved (>= 1)">,
    Option<"reduceLanes", "reduce-lanes", "int64_t", /*default=*/"0",
           "With interleave > 1: reduce the group absmaxes of an iteration's "
           "groups together, down to vectors of this many f32 lanes (the "
           "target's native vector; 0: one reduction per group)">,
  ];
}

def FlashOptConvertToLLVM : Pass<"flashopt-convert-to-llvm", "::mlir::ModuleOp"> {
  let summary = "Lower host kernels (func, arith, math, vector, cf, flashopt.raw_*) to LLVM";
  let description = [{
    One full conversion of the CPU kernels to the LLVM dialect: our
    `flashopt.raw_load`/`raw_store` become `inttoptr` + `getelementptr` +
    `llvm.load`/`llvm.store` (or `llvm.intr.masked.load`/`store` with a zero
    pass-through), together with the upstream arith, math, vector, func,
    cf and ub patterns. Expects scf already lowered to cf and bf16
    arithmetic expanded (`arith-expand{include-bf16}`), as
    `flashopt-cpu-pipeline` arranges. Kernel functions keep their C names and
    become externally visible.

    ```mlir
    %p = flashopt.raw_load %base[%i] {alignment = 4} : vector<32xf32>
    // becomes
    %a = llvm.inttoptr %base : i64 to !llvm.ptr
    %q = llvm.getelementptr %a[%i] : (!llvm.ptr, i64) -> !llvm.ptr, f32
    %p = llvm.load %q {alignment = 4 : i64} : !llvm.ptr -> vector<32xf32>
    ```
  }];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect"];
  let options = [
    Option<"x86VectorBits", "x86-vector-bits", "int64_t", /*default=*/"0",
           "The x86 vector width of the target CPU (512: AVX-512, 256: AVX, "
           "128: SSE2; 0: not x86): NaN-guarded float-to-integer conversions "
           "of the encodes become cvttps2dq (AVX-512: cvtps2dq {rd-sae} for a "
           "floor under the guard), whose NaN result 0x80000000 is 0 in the "
           "stored i8/i16">,
  ];
}

def FlashOptToGPU : Pass<"flashopt-to-gpu", "::mlir::ModuleOp"> {
  let summary = "Lower flashopt.kernel to a multi-tensor gpu.func";
  let description = [{
    Replaces every `flashopt.kernel` by a `gpu.func` (in a `gpu.module`
    named `<kernel>_gpu`) with the kernel ABI of docs/KERNEL-ABI.md. Each
    thread handles W elements, W = 16 bytes / the widest per-element buffer
    (8 for bf16 parameters, 4 for f32), so every per-element access is one
    aligned vector load or store of at most 128 bits; a group of G elements
    spans G/W lanes and `flashopt.group_max` becomes a local
    `vector.reduction` plus a `gpu.shuffle xor` butterfly over those lanes.
    Blocks of `block-size` threads walk all groups of all tensors with a
    warp-uniform grid-stride loop: lanes past the end are predicated, never
    returned early, so every lane reaches every shuffle. Each group finds its
    tensor by binary search in the tensor table, so one launch steps every
    tensor. Tails use masked accesses only in the thread that holds them.

    ```mlir
    gpu.module @sgd_gpu {
      gpu.func @sgd(%table: i64, %ntensors: i64, %hypers: i64, %step: i64,
                    %group_begin: i64, %group_end: i64) kernel
          attributes {known_block_size = array<i32: 256, 1, 1>} {
        ...
        %m = gpu.shuffle xor %v, 2, 32 : f32
        ...
      }
    }
    ```
  }];
  let options = [
    Option<"blockSize", "block-size", "int64_t", /*default=*/"256",
           "Threads per block (a multiple of 32)">,
    Option<"bytesPerThread", "bytes-per-thread", "int64_t", /*default=*/"0",
           "Bytes of the widest per-element stream each thread moves per "
           "access (16 = 128-bit accesses; 0 = 16 unless the per-element "
           "arithmetic is heavy, then 8)">,
    Option<"heavyBudget", "heavy-budget", "int64_t", /*default=*/"24",
           "With bytes-per-thread 0: the largest elements per thread times "
           "IEEE divisions and square roots per element kept at 16 bytes "
           "per access (flashopt-gpu-pipeline sets it per chip)">,
    Option<"wideBudget", "wide-budget", "int64_t", /*default=*/"0",
           "With bytes-per-thread 0: a kernel over heavy-budget keeps 16 bytes "
           "per access when elements per thread times its IEEE divisions and "
           "square roots fit this, with wide-registers registers (0: never)">,
    Option<"wideRegisters", "wide-registers", "int64_t", /*default=*/"0",
           "The register cap of such a kernel (flashopt.max_registers on its "
           "gpu.func, read by flashopt-convert-to-nvvm)">,
    Option<"fullWarpPath", "full-warp-path", "bool", /*default=*/"true",
           "Emit the group body twice: without predicates when every lane of "
           "the warp holds a full vector (a warp-wide AND, gpu.subgroup_reduce), "
           "with a plain-or-masked choice per access otherwise">,
    Option<"sharedBases", "shared-bases", "bool", /*default=*/"true",
           "In the full-warp body: each buffer's base address loaded once "
           "for the body, not once per access">,
  ];
  let dependentDialects = ["::mlir::gpu::GPUDialect", "::mlir::scf::SCFDialect",
                           "::mlir::vector::VectorDialect", "::mlir::arith::ArithDialect"];
}

def FlashOptConvertToNVVM : Pass<"flashopt-convert-to-nvvm", "::mlir::gpu::GPUModuleOp"> {
  let summary = "Lower GPU kernels to NVVM with IEEE arithmetic and no libdevice";
  let description = [{
    flashopt's own GPU → NVVM conversion. Unlike `convert-gpu-to-nvvm`, math
    operations become LLVM intrinsics rather than libdevice calls, so the PTX
    has IEEE `sqrt.rn.f32` and `div.rn.f32`, native `max`/`min`/`abs`/
    `cvt.rmi`, and no `__nv_*` symbol (no dependence on finding libdevice).
    `flashopt.raw_load`/`raw_store` become global-memory (address space 1)
    loads and stores. Options: `ftz` flushes f32 subnormals
    (`denormal-fp-math-f32 = preserve-sign`), `triton-compat` uses
    `div.full.f32` and `sqrt.approx.f32` like FlashOptim's Triton kernels;
    both change the numerics and are off by default.

    ```mlir
    %r = math.sqrt %x : f32
    // becomes
    %r = llvm.intr.sqrt(%x) : (f32) -> f32      // sqrt.rn.f32 in PTX
    ```
  }];
  let options = [
    Option<"ftz", "ftz", "bool", /*default=*/"false",
           "Flush f32 subnormals to zero (not the numerics contract)">,
    Option<"tritonCompat", "triton-compat", "bool", /*default=*/"false",
           "Approximate division and square root as FlashOptim's Triton "
           "kernels do (not the numerics contract)">,
    Option<"maxRegisters", "max-registers", "int64_t", /*default=*/"64",
           "Register budget per thread (.maxnreg); 0 leaves it to ptxas">,
  ];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect", "::mlir::NVVM::NVVMDialect"];
}

#endif // FLASHOPT_CONVERSION_PASSES_TD
