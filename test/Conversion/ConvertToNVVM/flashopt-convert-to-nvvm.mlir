// RUN: flashopt-opt %s --pass-pipeline='builtin.module(gpu.module(flashopt-convert-to-nvvm))' | FileCheck %s
// RUN: flashopt-opt %s --pass-pipeline='builtin.module(gpu.module(flashopt-convert-to-nvvm{ftz=true}))' | FileCheck %s --check-prefix=FTZ
// RUN: flashopt-opt %s --pass-pipeline='builtin.module(gpu.module(flashopt-convert-to-nvvm{triton-compat=true}))' | FileCheck %s --check-prefix=TRITON

// Math becomes LLVM intrinsics, never libdevice calls; raw accesses are
// global-memory (address space 1) loads and stores.
// CHECK-NOT: __nv_
// CHECK-LABEL: llvm.func @k(
// CHECK-SAME: nvvm.kernel
// CHECK: nvvm.read.ptx.sreg.tid.x
// CHECK: llvm.inttoptr %{{.*}} : i64 to !llvm.ptr<1>
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xf32>
// CHECK: llvm.intr.sqrt(%{{.*}}) : (vector<4xf32>) -> vector<4xf32>
// CHECK: llvm.fdiv %{{.*}}, %{{.*}} : vector<4xf32>
// CHECK: llvm.intr.floor
// CHECK: llvm.intr.copysign
// CHECK: llvm.intr.vector.reduce.fmaximum
// CHECK: nvvm.shfl.sync  bfly
// CHECK: llvm.intr.maximum
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<4xf32>, !llvm.ptr<1>
// CHECK-NOT: __nv_
// FTZ: llvm.func @k(
// FTZ-SAME: denormal_fp_math_f32 = "preserve-sign"
// TRITON: llvm.intr.sqrt(%{{.*}}) {fastmathFlags = #llvm.fastmath<contract, afn>}
// TRITON: llvm.fdiv %{{.*}}, %{{.*}} {fastmathFlags = #llvm.fastmath<contract>}
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%base: i64, %n: i64) kernel {
      %tid = gpu.thread_id x
      %c4 = arith.constant 4 : index
      %i = arith.muli %tid, %c4 : index
      %v = flashopt.raw_load %base[%i] {alignment = 16} : vector<4xf32>
      %s = math.sqrt %v : vector<4xf32>
      %d = arith.divf %v, %s : vector<4xf32>
      %f = math.floor %d : vector<4xf32>
      %c = math.copysign %f, %v : vector<4xf32>
      %r = vector.reduction <maximumf>, %c : vector<4xf32> into f32
      %off = arith.constant 1 : i32
      %w = arith.constant 32 : i32
      %sh, %ok = gpu.shuffle xor %r, %off, %w : f32
      %m = arith.maximumf %r, %sh : f32
      %mv = vector.broadcast %m : f32 to vector<4xf32>
      %o = arith.addf %c, %mv : vector<4xf32>
      flashopt.raw_store %o, %base[%i] {alignment = 16} : vector<4xf32>
      gpu.return
    }
  }
}
