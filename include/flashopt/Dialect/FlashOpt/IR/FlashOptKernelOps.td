//===- FlashOptKernelOps.td - flashopt kernel IR ----------*- tablegen -*-===//
//
// Part of flashopt. The second layer of operations: the target-neutral
// kernel IR that flashopt-expand-encodings makes (flashopt.kernel, its group
// body and the operations inside it) and the address-based memory operations
// of the back ends. Included by FlashOptOps.td, which holds the optimizer
// description.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_KERNEL_OPS_TD
#define FLASHOPT_KERNEL_OPS_TD


//===----------------------------------------------------------------------===//
// Kernel IR (target-neutral)
//===----------------------------------------------------------------------===//

def FlashOpt_KernelOp : FlashOpt_Op<"kernel", [
    Symbol, IsolatedFromAbove, NoTerminator, SingleBlock, NoRegionArguments]> {
  let summary = "A target-neutral optimizer step kernel";
  let description = [{
    The output of `flashopt-expand-encodings`. `buffers` lists the per-tensor
    buffers in ABI order, `hypers` the hyper-parameter table columns. The
    body is a prologue of per-tensor scalar math (hyper-parameters, step
    count, powi, arith) followed by exactly one `flashopt.group_body`, whose
    scalar code runs for every element of every group of `group_size`
    elements. Back ends map the group body onto vector lanes
    (flashopt-to-cpu, flashopt-to-gpu). `kind` says which of its optimizer's
    kernels it is (default `step`), `arithmetic` whether
    `flashopt-fast-arithmetic` rewrites it (`fast`; default `exact`).

    ```mlir
    flashopt.kernel @sgd_f32 group_size(32)
        buffers([#flashopt.buffer<"param", f32, element, readwrite>,
                 #flashopt.buffer<"grad", f32, element, read>])
        hypers(["lr"]) {
      %lr = flashopt.hyper "lr" default(1.000000e-03 : f32) : f32
      flashopt.group_body {
        %p = flashopt.load_element 0 : f32
        %g = flashopt.load_element 1 : f32
        %d = arith.mulf %g, %lr : f32
        %n = arith.subf %p, %d : f32
        flashopt.store_element 0, %n : f32
      }
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, I64Attr:$group_size,
                       TypedArrayAttrBase<FlashOpt_BufferAttr, "kernel buffers">:$buffers,
                       StrArrayAttr:$hypers,
                       DefaultValuedAttr<FlashOpt_KernelKindAttr,
                         "::mlir::flashopt::KernelKind::Step">:$kind,
                       DefaultValuedAttr<FlashOpt_ArithmeticAttr,
                         "::mlir::flashopt::Arithmetic::Exact">:$arithmetic);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $sym_name (`kind` `` $kind^)? `group_size` `(` $group_size `)`
    `buffers` `(` $buffers `)` `hypers` `(` $hypers `)`
    (`arithmetic` `` $arithmetic^)? attr-dict-with-keyword $body
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The buffer attribute at `index`.
    BufferAttr getBuffer(int64_t index) {
      return ::llvm::cast<BufferAttr>(getBuffers()[index]);
    }
    /// Index of a hyper-parameter in the hyper table, or -1.
    int64_t getHyperIndex(::llvm::StringRef name);
  }];
}

def FlashOpt_GroupBodyOp : FlashOpt_Op<"group_body", [
    HasParent<"KernelOp">, NoTerminator, SingleBlock, NoRegionArguments]> {
  let summary = "Scalar code run for every element of every group";
  let description = [{
    Values computed here are per element, except those derived only from
    `flashopt.group_max`, `flashopt.load_group` and values defined outside
    the body: those are uniform across the group. Elements past the end of a
    tensor read as zero, take no part in `flashopt.group_max` and are not
    stored.

    ```mlir
    flashopt.group_body {
      %x = flashopt.load_element 3 : f32
      %a = math.absf %x : f32
      %m = flashopt.group_max %a : f32
      flashopt.store_group 4, %m : f32
    }
    ```
  }];
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "attr-dict-with-keyword $body";
}

class FlashOpt_BufferAccessOp<string mnemonic, list<Trait> traits = []>
    : FlashOpt_Op<mnemonic, !listconcat(traits, [HasParent<"GroupBodyOp">])> {
  let hasVerifier = 1;
}

def FlashOpt_LoadElementOp : FlashOpt_BufferAccessOp<"load_element"> {
  let summary = "Loads this element of a per-element buffer";
  let description = [{
    ```mlir
    %p = flashopt.load_element 0 : bf16
    ```
  }];
  let arguments = (ins I64Attr:$buffer);
  let results = (outs AnyType:$result);
  let assemblyFormat = "$buffer attr-dict `:` type($result)";
}

def FlashOpt_StoreElementOp : FlashOpt_BufferAccessOp<"store_element"> {
  let summary = "Stores this element of a per-element buffer";
  let description = [{
    ```mlir
    flashopt.store_element 0, %p : bf16
    ```
  }];
  let arguments = (ins I64Attr:$buffer, AnyType:$value);
  let assemblyFormat = "$buffer `,` $value attr-dict `:` type($value)";
}

def FlashOpt_LoadGroupOp : FlashOpt_BufferAccessOp<"load_group"> {
  let summary = "Loads this group's value of a per-group buffer";
  let description = [{
    ```mlir
    %s = flashopt.load_group 4 : f16
    ```
  }];
  let arguments = (ins I64Attr:$buffer);
  let results = (outs AnyType:$result);
  let assemblyFormat = "$buffer attr-dict `:` type($result)";
}

def FlashOpt_StoreGroupOp : FlashOpt_BufferAccessOp<"store_group"> {
  let summary = "Stores this group's value of a per-group buffer";
  let description = [{
    The value must be uniform across the group.

    ```mlir
    flashopt.store_group 4, %s : f16
    ```
  }];
  let arguments = (ins I64Attr:$buffer, AnyType:$value);
  let assemblyFormat = "$buffer `,` $value attr-dict `:` type($value)";
}

def FlashOpt_GroupMaxOp : FlashOpt_Op<"group_max", [Pure, SameOperandsAndResultType, HasParent<"GroupBodyOp">]> {
  let summary = "NaN-propagating maximum over the valid elements of the group";
  let description = [{
    The result is uniform across the group. Max is order-independent, so
    every back end's reduction tree gives the same bits.

    With `bits`, the maximum of the operands' bit patterns read as unsigned
    integers: the IEEE order for non-negative values and NaNs with a clear
    sign bit (NaNs above +inf), while any value with its sign bit set (a
    negative number, -0, a negative NaN) is above all of those.
    flashopt-guarded-quantize uses it to take a square root after the
    maximum instead of before: sqrt of that maximum is NaN exactly when some
    element's root is NaN (docs/NUMERICS.md §2c).

    ```mlir
    %amax = flashopt.group_max %abs : f32
    %vmax = flashopt.group_max %v {bits} : f32
    ```
  }];
  let arguments = (ins F32:$value, UnitAttr:$bits);
  let results = (outs F32:$result);
  let assemblyFormat = "$value attr-dict `:` type($value)";
}

def FlashOpt_DitherOp : FlashOpt_Op<"dither", [
    Pure, HasParent<"GroupBodyOp">]> {
  let summary = "This element's rounding offset";
  let description = [{
    `u - (offset - 1)` with u = h / 2^14, h = (i * 12367 + H(t) + phase) mod
    2^14, where i is the element's index in its tensor (the record's element
    offset, docs/KERNEL-ABI.md, plus the index in the record), t the `step`
    operand (the step count), both taken modulo 2^32 first, H(t) the top 14
    bits of a 32-bit integer hash of t (x ^= x >> 16, x *= 0x21F0AAAD,
    x ^= x >> 15, x *= 0x735A2D97, x ^= x >> 15), and `phase` a constant of
    the state being rounded (0 unless given). u is a multiple of 2^-14 in
    [0, 1 - 2^-14]; `offset` 1.0 gives u and 1.5 gives u - 1/2, both
    exactly. (Computed as the f32 whose bits are `((h << 18) >> 9) |
    0x3F800000`, which is 1 + u, minus `offset`; `offset` 0.0 gives 1 + u
    itself.) With an `i32` result it is the word `h << 18` itself (h in the
    top 14 bits, `offset` 0.0), which the minifloat codes add to the bits
    they round (docs/NUMERICS.md §2d).

    Across the elements of one step the offsets are a rotation by 12367 /
    2^14 (about 1/rho, the plastic number's): neighbours are spread as
    evenly as a rotation allows. Over the steps of one element they are
    the hash's, independent of the state's own dynamics: a rotation in time
    resonated with a decaying state on a fixed grid of codes (docs/NUMERICS.md
    §8.3). The bounded numerics round every 8-bit state code with it,
    `floor(t * N + u)` in place of `floor(t * N + 1/2)` (§8), so that a code
    rounds up with the probability of its fraction: codes are unbiased and
    decay like the exact state; the states of one element use phases 3462
    apart (u shifted by 0.2113, which makes the average covariance of their
    rounding errors zero). Every back end computes the same bits. A
    per-element value (never uniform); i * 12367 varies, H(t) + phase is
    uniform (the lowerings compute it once per record or worker).

    ```mlir
    %u = flashopt.dither %step {offset = 1.000000e+00 : f32} : f32
    %w = flashopt.dither %step {offset = 0.000000e+00 : f32, phase = 3462 : i32} : i32
    ```
  }];
  let arguments = (ins I64:$step, F32Attr:$offset,
                       DefaultValuedAttr<I32Attr, "0">:$phase);
  let results = (outs AnyTypeOf<[F32, I32]>:$result);
  let assemblyFormat = "$step attr-dict `:` type($result)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// h's multiplier of the element index, times 2^18 (32-bit arithmetic).
    static constexpr uint32_t kElementMultiplier = 12367u << 18;
    /// The phase between the states of one optimizer: round(0.2113 * 2^14),
    /// the offset α with α(1 − α)/2 = 1/12 (docs/NUMERICS.md §8.3).
    static constexpr int32_t kStatePhase = 3462;
    /// phase · 2^18, what the phase adds to the word (32-bit arithmetic).
    uint32_t getPhaseWord() { return uint32_t(getPhase()) << 18; }
    /// H(t) << 18 for an i32 step count: the step's part of the word.
    static ::mlir::Value emitStepWord(::mlir::OpBuilder &b,
                                      ::mlir::Location loc,
                                      ::mlir::Value stepI32);
  }];
}

def FlashOpt_TableLookupOp : FlashOpt_Op<"table_lookup", [
    Pure, ElementwiseMappable, SameOperandsAndResultShape]> {
  let summary = "A float function of a narrow integer, read from a constant table";
  let description = [{
    `table[zext(index)]`: the bit pattern of an 8-bit index selects one of
    the table's 256 floats. It stands for a
    computation that depends only on an 8-bit code and constants, folded at
    compile time for every code (flashopt-decode-tables), so it is
    bit-identical to that computation by construction. Elementwise: a vector
    of codes gives a vector of values.

    ```mlir
    %v = flashopt.table_lookup %code {table = dense<[...]> : tensor<256xf32>} : i8 -> f32
    ```
  }];
  let arguments = (ins AnyTypeOf<[I8, VectorOfRankAndType<[1], [I8]>]>:$index,
                       ElementsAttr:$table);
  let results = (outs AnyTypeOf<[F32, VectorOfRankAndType<[1], [F32]>]>:$result);
  let assemblyFormat = "$index attr-dict `:` type($index) `->` type($result)";
  let hasVerifier = 1;
}

def FlashOpt_RcpApproxOp : FlashOpt_Op<"rcp_approx", [
    Pure, ElementwiseMappable, SameOperandsAndResultType]> {
  let summary = "An approximate reciprocal: within 1 ulp of 1/x";
  let description = [{
    For a normal `x` whose reciprocal is normal, any value within one ulp of
    the exact `1 / x` (not necessarily the one nearest it); subnormal
    operands and results may be flushed to (sign-preserving) zero. The GPU gives it one
    `rcp.approx.ftz.f32` (MUFU.RCP, "maximum ulp error is 1 across the full
    range of inputs" in the PTX ISA); other targets may compute `1 / x`
    exactly. Only `flashopt-guarded-quantize` creates it, with an operand in
    [1, 2], where its error bound is part of a proof (docs/NUMERICS.md §2c).

    ```mlir
    %r = flashopt.rcp_approx %d : f32
    ```
  }];
  let arguments = (ins AnyTypeOf<[F32, VectorOfRankAndType<[1], [F32]>]>:$x);
  let results = (outs AnyTypeOf<[F32, VectorOfRankAndType<[1], [F32]>]>:$result);
  let assemblyFormat = "$x attr-dict `:` type($x)";
}

def FlashOpt_SqrtApproxOp : FlashOpt_Op<"sqrt_approx", [
    Pure, ElementwiseMappable, SameOperandsAndResultType]> {
  let summary = "An approximate square root: relative error at most 2^-23 (normal operands)";
  let description = [{
    For a positive finite `x`, any value within a relative 2^-23 of the
    exact square root; a subnormal operand may be flushed to zero first
    (then the result is a zero: at most 2^-63 from the root); +0 gives +0,
    -0 gives -0, +inf gives +inf, anything negative or NaN gives NaN. The
    GPU gives it one `sqrt.approx.ftz.f32` (MUFU.SQRT; the bound is the PTX
    ISA's); other targets may compute the correctly rounded root, which
    meets it. Only
    `flashopt-guarded-quantize` creates it (docs/NUMERICS.md §2c).

    ```mlir
    %y = flashopt.sqrt_approx %x : f32
    ```
  }];
  let arguments = (ins AnyTypeOf<[F32, VectorOfRankAndType<[1], [F32]>]>:$x);
  let results = (outs AnyTypeOf<[F32, VectorOfRankAndType<[1], [F32]>]>:$result);
  let assemblyFormat = "$x attr-dict `:` type($x)";
}

def FlashOpt_AddRoundDownOp : FlashOpt_Op<"add_round_down", [
    Pure, ElementwiseMappable, SameOperandsAndResultType]> {
  let summary = "IEEE binary32 addition rounded toward negative infinity";
  let description = [{
    `x + y` rounded once toward -inf (IEEE 754 roundTowardNegative: an exact
    zero sum is -0 unless both operands are +0; a finite overflow gives the
    largest finite value; NaN in, NaN out). The GPU gives it one
    `add.rm.f32` (FADD.RM); other targets emulate it from the
    round-to-nearest sum and its exact error. `flashopt-guarded-quantize`
    adds 1.5 * 2^23 - 1 to a dithered code's approximation z, so that the
    sum's low byte is floor(z) - 1, the code (docs/NUMERICS.md §8).

    ```mlir
    %s = flashopt.add_round_down %z, %m : f32
    ```
  }];
  let arguments = (ins AnyTypeOf<[F32, VectorOfRankAndType<[1], [F32]>]>:$x,
                       AnyTypeOf<[F32, VectorOfRankAndType<[1], [F32]>]>:$y);
  let results = (outs AnyTypeOf<[F32, VectorOfRankAndType<[1], [F32]>]>:$result);
  let assemblyFormat = "$x `,` $y attr-dict `:` type($x)";
}

def FlashOpt_GuardedOp : FlashOpt_Op<"guarded", [
    HasParent<"GroupBodyOp">, SingleBlock, RecursiveMemoryEffects]> {
  let summary = "A cheap result where a guard proves it exact, else the region's";
  let description = [{
    Per element: the `fast` operands where `slack <= limit` (an ordered
    compare: a NaN slack fails), else the values the region yields. The
    region is the exact computation (it may use any value of the enclosing
    group body); the guard is a proof obligation of the pass that builds the
    op: wherever it holds, `fast` equals what the region would yield, bit
    for bit. So the op always means the region's values, and a back end may
    evaluate the region only for the elements whose guard fails. The
    group-body lowering tests all of a worker's lanes at once (the maximum
    of their slacks) and runs the region lane by lane behind that test.

    ```mlir
    %code = flashopt.guarded %slack, %fast {limit = 0.4998 : f32} : i8 -> i8 {
      ...
      flashopt.yield %exact : i8
    }
    ```
  }];
  let arguments = (ins F32:$slack, F32Attr:$limit, Variadic<AnyType>:$fast);
  let results = (outs Variadic<AnyType>:$results);
  let regions = (region SizedRegion<1>:$fallback);
  let assemblyFormat =
      "$slack `,` $fast attr-dict `:` type($fast) `->` type($results) $fallback";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Address-based memory operations (back-end IR)
//===----------------------------------------------------------------------===//

def FlashOpt_RawLoadOp : FlashOpt_Op<"raw_load", [
    MemoryEffects<[MemRead]>]> {
  let summary = "Loads a scalar or vector from a byte address plus an element index";
  let description = [{
    Loads from `base + index * sizeof(element)`, `base` being an i64 byte
    address. With a `mask`, masked-off vector lanes are not read and yield
    zero. `alignment` is the byte alignment the access may assume.

    ```mlir
    %v = flashopt.raw_load %base[%i] {alignment = 16} : vector<8xbf16>
    %w = flashopt.raw_load %base[%i] mask(%m) {alignment = 2} : vector<8xbf16>
    ```
  }];
  let arguments = (ins I64:$base, Index:$index, Optional<VectorOfRankAndType<[1], [I1]>>:$mask,
                       DefaultValuedAttr<I64Attr, "1">:$alignment);
  let results = (outs AnyType:$result);
  let assemblyFormat = [{
    $base `[` $index `]` (`mask` `(` $mask^ `:` type($mask) `)`)? attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

def FlashOpt_RawStoreOp : FlashOpt_Op<"raw_store", [
    MemoryEffects<[MemWrite]>]> {
  let summary = "Stores a scalar or vector to a byte address plus an element index";
  let description = [{
    ```mlir
    flashopt.raw_store %v, %base[%i] {alignment = 16} : vector<8xbf16>
    ```
  }];
  let arguments = (ins AnyType:$value, I64:$base, Index:$index,
                       Optional<VectorOfRankAndType<[1], [I1]>>:$mask,
                       DefaultValuedAttr<I64Attr, "1">:$alignment);
  let assemblyFormat = [{
    $value `,` $base `[` $index `]` (`mask` `(` $mask^ `:` type($mask) `)`)? attr-dict `:` type($value)
  }];
  let hasVerifier = 1;
}

#endif // FLASHOPT_KERNEL_OPS_TD
