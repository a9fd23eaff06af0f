//===- Passes.td - flashopt dialect transformations --------*- tablegen -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_TRANSFORMS_PASSES_TD
#define FLASHOPT_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def FlashOptExpandEncodings : Pass<"flashopt-expand-encodings", "::mlir::ModuleOp"> {
  let summary = "Turn optimizers into target-neutral kernel IR";
  let description = [{
    Replaces every `flashopt.optimizer` by a `flashopt.kernel` of the same
    name. The kernel's buffers are the optimizer's storage in ABI order
    (param, correction, grad, then per state codes + scales or the plain
    buffer). Its prologue is the optimizer's per-step scalar code; its group
    body decodes every input (master-weight correction, dequantization with
    the inverse compander, widening), inlines the update rule, and encodes
    every output (narrowing + correction encode; group absmax with
    `flashopt.group_max` → compander → codes + scale), exactly as
    docs/NUMERICS.md specifies. `flashopt.bound` is lowered there for the
    optimizer's `numerics`; the kernel inherits its `arithmetic`.

    `kernel-kind` picks which of an optimizer's kernels is made
    (docs/KERNEL-ABI.md "Gradient accumulation"): `step` (the default),
    or, for an optimizer with an accumulator, `accumulate`,
    `step_accumulated` or `step_fused`; the kernel's name is the
    optimizer's plus the kind's suffix, and it carries the kind.

    Input:
    ```mlir
    flashopt.optimizer @sgd param(#flashopt.master<f32>) grad(f32) {
      %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
      flashopt.update(%theta: f32, %g: f32) {
        %d = arith.mulf %g, %lr : f32
        %t = arith.subf %theta, %d : f32
        flashopt.yield %t : f32
      }
    }
    ```
    Output:
    ```mlir
    flashopt.kernel @sgd group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>,
        #flashopt.buffer<"grad", f32, element, read>]) hypers(["lr"]) {
      %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
      flashopt.group_body {
        %0 = flashopt.load_element 0 : f32
        %1 = flashopt.load_element 1 : f32
        %2 = arith.mulf %1, %lr : f32
        %3 = arith.subf %0, %2 : f32
        flashopt.store_element 0, %3 : f32
      }
    }
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
  let options = [
    Option<"kernelKind", "kernel-kind", "::mlir::flashopt::KernelKind",
           /*default=*/"::mlir::flashopt::KernelKind::Step",
           "Which kernel of each optimizer to make",
           [{::llvm::cl::values(
             clEnumValN(::mlir::flashopt::KernelKind::Step, "step",
                        "the step kernel (the default)"),
             clEnumValN(::mlir::flashopt::KernelKind::Accumulate, "accumulate",
                        "adds a micro-batch's gradient to the accumulator"),
             clEnumValN(::mlir::flashopt::KernelKind::StepAccumulated,
                        "step_accumulated",
                        "steps on the accumulated gradient, zeroes it"),
             clEnumValN(::mlir::flashopt::KernelKind::StepFused, "step_fused",
                        "adds the last micro-batch in registers and steps"))}]>,
    Option<"subnormalFreeCodes", "subnormal-free-codes", "bool",
           /*default=*/"false",
           "Encode minifloat codes without subnormal products (same bits; "
           "x86 takes a microcode assist for each: the CPU pipeline sets it)">
  ];
}

def FlashOptDecodeTables : Pass<"flashopt-decode-tables", "::mlir::ModuleOp"> {
  let summary = "Functions of an 8-bit code that divide, take a root or take four operations become a 256-entry table";
  let description = [{
    Decoding a quantized state computes a float from its 8-bit code and
    constants alone: softsign momentum `t / (2 - |t|)` with `t = k / 127`,
    the square-root-companded variance `(k / 255)^2`, the correction term's
    `k / 127`, a minifloat code's value (its exponent, mantissa and sign in
    integer operations). Inside a `flashopt.group_body`, every float value
    that depends only on one 8-bit `flashopt.load_element` and constants,
    whose computation contains an `arith.divf` or `math.sqrt` or takes at
    least four operations, and that is used by
    something depending on more than the code, is replaced by
    `flashopt.table_lookup` of the code. The table is the computation itself
    evaluated for all 256 codes by the operations' own constant folders
    (IEEE binary32, round to nearest even: MLIR's `arith`/`math` folders), so
    the result is bit-identical by construction; the conformance tests hold
    every kernel to the scalar reference, which still computes. A value whose
    computation does not fold for every code is left alone.

    Run after flashopt-fast-arithmetic (a fast kernel's table holds what it
    computes) and before flashopt-exact-int-division. The GPU pipeline runs
    it: a table read costs an address and one cached load where the softsign
    decode costs two IEEE divisions.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

def FlashOptExactIntDivision : Pass<"flashopt-exact-int-division", "::mlir::ModuleOp"> {
  let summary = "Correctly rounded division of small integers by constants, without a divide";
  let description = [{
    Dequantization and the master-weight correction divide an integer code
    by a constant (`code / 127`, `code / 255`, `rho / 32767`). Such an
    `arith.divf (arith.sitofp|uitofp %k : iN), C` (N <= 16) is rewritten to
    the reciprocal-and-residual sequence

    ```mlir
    %q0 = arith.mulf %x, %r          // r = RN(1 / C)
    %e  = math.fma %nq0, %C, %x      // -q0 * C + x, exact
    %q  = math.fma %e, %r, %q0
    ```

    when, and only when, the pass has checked for every one of the 2^N
    possible numerators (IEEE arithmetic on APFloat) that it yields exactly
    the correctly rounded quotient: the result is bit-identical to the
    division it replaces. A fused multiply-add and a multiply are cheaper
    than an IEEE division. Run it only for targets with a hardware FMA:
    flashopt-gen does so for x86-64-v3 (flashopt-cpu-pipeline{fma=true});
    a baseline x86-64 kernel keeps its divisions, and the GPU pipeline does
    not run it until it is measured on a device.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

def FlashOptUniformDivision : Pass<"flashopt-uniform-division", "::mlir::ModuleOp"> {
  let summary = "Divisions by a per-step value in binary64, without a divide per element";
  let description = [{
    Replaces an f32 `arith.divf %x, %c` inside a `flashopt.group_body`
    whose divisor is defined outside the body (a per-step scalar such as
    Adam's bias correction `1 - powi(beta, t)`) or is a constant by
    binary64 arithmetic: `R = 1.0 / extf(%c)` once before the group body
    (at compile time for a constant), and per element `p = extf(%x) * R`,
    `p = copysign((p + K) - K, p)` with K = 1.5 * 2^-124 (it puts a
    quotient that is an exact tie of the f32 subnormal grid exactly on the
    tie), and `truncf(p)`. The result is the correctly rounded f32 quotient
    for every x and c, special values included (docs/NUMERICS.md §3b); a
    constant divisor with |c| < 2 has no ties and skips the middle step.
    flashopt-gen runs it for the GPU only (where `div.rn.f32` is ~10 SASS
    per element, this 6); on the CPU `vdivps` measured faster.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

def FlashOptGuardedQuantize : Pass<"flashopt-guarded-quantize", "::mlir::ModuleOp"> {
  let summary = "8-bit softsign and sqrt codes from approximate arithmetic, guarded, with an exact fallback";
  let description = [{
    A quantization code is `floor(w)`, w = RN(RN(t * N) + 0.5), N = 127 or
    255. An approximation y' of RN(t * N) within a proven bound E gives the
    same code wherever y' is farther than E (plus the rounding of w) from
    the half-integers. This pass rewrites the softsign code
    `floor(2n / (1 + |n|) * 127 + 0.5)`, n = y / a, and the sqrt code
    `floor(sqrt(v) / a * 255 + 0.5)` of flashopt-expand-encodings into

    - softsign: `R = rcp_approx(a)` per group (NaN when a >= 2^126),
      `n' = y * R`, `y' = (n' * 254) * rcp_approx(1 + |n'|)`;
    - sqrt: the group absmax as `sqrt(group_max(v + 0.0) {bits})` (one
      correctly rounded root per group instead of one per element, the
      same bits), `S = (255 * rcp_approx(a))^2` per group (NaN when
      a >= 2^60), `y' = sqrt_approx(v * S)`;

    and the fast mode's softsign code `floor(fma(t, 127, 0.5))` (n = y *
    (1 / a) kept) into `y' = (n * 254) * rcp_approx(1 + |n|)`; then
    `code = rint(y')` with the guard `|y' - rint(y')| <= 0.5 - delta`
    (delta = 2^-13 softsign, 2^-12 sqrt; NaN fails), and wraps the codes of
    a group body in one
    `flashopt.guarded` (the larger slack against the smaller limit) whose
    fallback region is the original exact chains. The bounds, the guard's
    proof, special values and fallback rates are in docs/NUMERICS.md §2c.
    flashopt-gen runs it for the GPU (a MUFU instead of a div.rn or sqrt.rn
    per element; sm_90 AdamW-24 148.0 -> 121.4 SASS per element).
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

def FlashOptExactGroupDivision : Pass<"flashopt-exact-group-division", "::mlir::ModuleOp"> {
  let summary = "Quantization divisions by the group absmax as one reciprocal per group";
  let description = [{
    Every quantized state divides each element by its group's absmax
    (`n = y / a`, a = max(group_max(|y|), 1e-12)). This pass replaces such an
    `arith.divf %y, %a` (the pattern is matched, so |y| <= a is known) by
    one IEEE reciprocal per group, `r = 1 / A` with `A = a * s`
    (s = 2^-64 where a > 2^126, else 1, so that r is a normal number),
    and per element `Y = y * s`, `q0 = Y * r` and two FMA residual
    corrections `q1 = fma(fma(-q0, A, Y), r, q0)`,
    `q = fma(fma(-q1, A, Y), r, q1)`. docs/NUMERICS.md §2b proves the codes
    bit-identical to the division's (the quotient itself is the correctly
    rounded one wherever a code depends on it). Needs a hardware FMA:
    flashopt-gen runs it for x86-64-v3/v4 and the GPU, not for the
    baseline x86-64 flavour.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

def FlashOptFastArithmetic : Pass<"flashopt-fast-arithmetic", "::mlir::ModuleOp"> {
  let summary = "The portable fast mode: divisions by uniform values as reciprocal multiplies, uniform factors folded, products fused into FMAs";
  let description = [{
    Acts on every `flashopt.kernel` with `arithmetic<fast>` (a spec's
    `"arithmetic": "fast"`, through its optimizer's `arithmetic<fast>`;
    `exact`, the default, leaves a kernel alone). First, in the group body, the two softsign quotients become one
    division each (the same real function, fewer roundings): the encode
    `2n / (1 + |n|)`, `n = y / a` (a uniform), becomes
    `y / fma(|y|, 0.5, a * 0.5)`, and the decode `t / (2 - |t|)`,
    `t = q / N` (N uniform), becomes `q / (2N - |q|)`, where the
    intermediate has no other use. Then an f32 division of a per-element value by a
    value that is uniform across the group (defined in the prologue, a
    constant, or computed from `flashopt.group_max` / `flashopt.load_group`
    results only) becomes a multiply by its IEEE reciprocal, computed once
    where the divisor is defined. The quotient is rounded twice instead of
    once (at most 1.5 ulp off, docs/NUMERICS.md §7), identically on every
    back end. Per-element divisions and square roots stay IEEE.

    After the first contraction below, a softsign decode quotient
    `q / (C - |q|)` (an 8-bit code, C a constant in [129, 1024]) and the
    next per-element division `x / d` whose divisor does not depend on it
    share one reciprocal: `r = 1 / (d0 * d)`, `q * (d * r)`, `x * (d0 * r)`
    (one division instead of two; docs/NUMERICS.md §7, 1a, gives the range
    where this matches the two quotients within a few ulp).

    Then three contractions, in this order, on per-element values (u, u1,
    u2 uniform): `sqrt(x * u)` becomes `sqrt(x) * sqrt(u)` where the body
    also takes `sqrt(x)`; `(x * u1) * u2` becomes `x * (u1 * u2)` when the
    inner product has one use (the uniform product computed once, in the
    prologue or after the later factor in the body); and a product with one
    use that an `addf`/`subf` consumes becomes `math.fma` (`a*b - c` as
    `fma(a, b, -c)`, `c - a*b` as `fma(-a, b, c)`; the left operand's
    product when both are products).

    ```mlir
    %bc = arith.subf %one, %p : f32            // prologue
    flashopt.group_body {
      %mh = arith.divf %m, %bc : f32
    ```
    becomes
    ```mlir
    %bc = arith.subf %one, %p : f32
    %r = arith.divf %c1, %bc : f32             // once per tensor
    flashopt.group_body {
      %mh = arith.mulf %m, %r : f32
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

#endif // FLASHOPT_TRANSFORMS_PASSES_TD
