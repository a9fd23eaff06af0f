//===- FlashOptOps.td - flashopt operations ----------------*- tablegen -*-===//
//
// Part of flashopt. Two layers of operations: the optimizer description
// (optimizer, hyper, state, update) and the target-neutral kernel IR that
// flashopt-expand-encodings produces (kernel, group_body, element and group
// loads and stores, group_max), plus the address-based memory operations that
// the back ends emit (raw_load, raw_store). This file holds the optimizer
// description; FlashOptKernelOps.td, included at its end, the kernel IR and
// the memory operations.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_OPS_TD
#define FLASHOPT_OPS_TD

include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.td"
include "flashopt/Dialect/FlashOpt/IR/FlashOptAttrs.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/IR/CommonTypeConstraints.td"

//===----------------------------------------------------------------------===//
// Optimizer description
//===----------------------------------------------------------------------===//

def FlashOpt_OptimizerOp : FlashOpt_Op<"optimizer", [
    Symbol, IsolatedFromAbove, NoTerminator, SingleBlock,
    NoRegionArguments]> {
  let summary = "An optimizer: hyper-parameters, states, encodings and rule";
  let description = [{
    Defines one optimizer. The body holds, in any order: `flashopt.hyper`
    declarations, per-step scalar math on them (`arith`, `math`,
    `flashopt.step_count`, `flashopt.powi`), one `flashopt.state` per state,
    and exactly one `flashopt.update` whose region computes the new master
    weight and states of one element in f32. `param` says how the master
    weight is stored, `grad` the gradient dtype. The optional `accumulate`
    is the encoding of a gradient accumulator (`#flashopt.master<f32>`,
    `#flashopt.master<bf16, correction = i8>` or `#flashopt.master<bf16>`):
    then every kernel of the optimizer has accumulator buffers, and
    `flashopt-expand-encodings{kernel-kind=...}` can make its accumulate and
    accumulated-step kernels. `numerics` (default `bounded`; `flashoptim`:
    FlashOptim's round-to-nearest codes, `flashopt.bound` the identity;
    docs/NUMERICS.md §8) and `arithmetic` (default `exact`; `fast`: the
    portable fast mode, §7) are the optimizer's modes; its kernels inherit
    `arithmetic`.

    ```mlir
    flashopt.optimizer @sgd param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
      %lr = flashopt.hyper "lr" default(1.000000e-03 : f32) : f32
      flashopt.update(%theta: f32, %g: f32) {
        %d = arith.mulf %g, %lr : f32
        %t = arith.subf %theta, %d : f32
        flashopt.yield %t : f32
      }
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, FlashOpt_MasterAttr:$param,
                       TypeAttr:$grad,
                       OptionalAttr<FlashOpt_MasterAttr>:$accumulate,
                       DefaultValuedAttr<FlashOpt_NumericsAttr,
                         "::mlir::flashopt::Numerics::Bounded">:$numerics,
                       DefaultValuedAttr<FlashOpt_ArithmeticAttr,
                         "::mlir::flashopt::Arithmetic::Exact">:$arithmetic);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $sym_name `param` `(` qualified($param) `)` `grad` `(` $grad `)`
    (`accumulate` `(` qualified($accumulate)^ `)`)?
    (`numerics` `` $numerics^)? (`arithmetic` `` $arithmetic^)?
    attr-dict-with-keyword $body
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
}

def FlashOpt_HyperOp : FlashOpt_Op<"hyper", [
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "A named f32 hyper-parameter, set per parameter group";
  let description = [{
    Declares a hyper-parameter of the enclosing optimizer or kernel and
    yields its value for the current parameter group. A declaration without
    `default` must be set by the user. Booleans are 0.0 / 1.0.

    With `envelope(max of "beta1")` (or `min`) it is instead the running
    maximum (minimum) of another hyper-parameter of the same parameter group
    over every step taken so far, the current one included: the runtime keeps
    it (it cannot be set, it has no default, checkpoints carry it). A rule
    whose bound depends on the history of a hyper-parameter reads it, as
    Adam's update bound does when betas change between steps
    (docs/NUMERICS.md §8.4).

    ```mlir
    %beta1 = flashopt.hyper "beta1" default(0.9 : f32) : f32
    %beta1_max = flashopt.hyper "beta1_max" envelope(max of "beta1") : f32
    ```
  }];
  let arguments = (ins StrAttr:$name, OptionalAttr<F32Attr>:$default_value,
                       OptionalAttr<FlashOpt_Envelope>:$envelope,
                       OptionalAttr<StrAttr>:$envelope_of);
  let results = (outs F32:$result);
  let assemblyFormat = [{
    $name (`default` `(` $default_value^ `)`)?
          (`envelope` `(` $envelope^ `of` $envelope_of `)`)? attr-dict `:`
          type($result)
  }];
  let hasVerifier = 1;
}

def FlashOpt_StepCountOp : FlashOpt_Op<"step_count", [Pure,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "The 1-based number of the step being taken";
  let description = [{
    ```mlir
    %t = flashopt.step_count : i64
    ```
  }];
  let results = (outs I64:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def FlashOpt_PowIOp : FlashOpt_Op<"powi", [Pure]> {
  let summary = "f32 power with a non-negative integer exponent";
  let description = [{
    `base` raised to `exponent`, correctly rounded to f32
    (docs/NUMERICS.md §3): binary exponentiation in double-double arithmetic
    (f64 multiply, add and subtract only), rounded once. Every back end
    computes the same bits. Used for bias corrections, in the kernel
    prologue (once per tensor, never per element).

    ```mlir
    %p = flashopt.powi %beta1, %t : f32, i64
    ```
  }];
  let arguments = (ins F32:$base, I64:$exponent);
  let results = (outs F32:$result);
  let assemblyFormat = "$base `,` $exponent attr-dict `:` type($base) `,` type($exponent)";
}

def FlashOpt_StateOp : FlashOpt_Op<"state", [HasParent<"OptimizerOp">]> {
  let summary = "An optimizer state and its storage encoding";
  let description = [{
    Declares a per-element state of the optimizer. States are passed to the
    update rule in declaration order, after the master weight and the
    gradient. The encoding is any attribute implementing
    StateEncodingAttrInterface: `#flashopt.quant<...>`, `#flashopt.plain<...>`
    or `#flashopt.elided` (only for states marked `elidable(hyper)`: such a
    state may be dropped when that hyper-parameter is 0).

    ```mlir
    flashopt.state "exp_avg" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
    flashopt.state "momentum_buffer" elidable("momentum") : #flashopt.plain<f32>
    ```
  }];
  let arguments = (ins StrAttr:$name, OptionalAttr<StrAttr>:$elidable,
                       FlashOpt_StateEncodingAttr:$encoding);
  let assemblyFormat = [{
    $name (`elidable` `(` $elidable^ `)`)? `:` $encoding attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Whether the state is not stored.
    bool isElided() { return ::llvm::isa<ElidedAttr>(getEncoding()); }
  }];
}

def FlashOpt_UpdateOp : FlashOpt_Op<"update", [
    HasParent<"OptimizerOp">, SingleBlockImplicitTerminator<"YieldOp">,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>]> {
  let summary = "The update rule of one element, in f32";
  let description = [{
    The region's arguments are the decoded master weight, the gradient and
    the decoded states (in declaration order), all f32. It yields the new
    master weight and the new states. Only `arith` and `math` operations on
    f32/i1/integer scalars may appear; they may use the hyper-parameters and
    per-step scalars of the enclosing optimizer. The order of operations is
    the numerics contract: nothing is reassociated or contracted.

    ```mlir
    flashopt.update(%theta: f32, %g: f32, %m: f32) {
      %m1 = arith.mulf %m, %beta : f32
      ...
      flashopt.yield %theta1, %m2 : f32, f32
    }
    ```
  }];
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasRegionVerifier = 1;
}

def FlashOpt_BoundOp : FlashOpt_Op<"bound", [
    Pure, SameOperandsAndResultType, HasParent<"UpdateOp">]> {
  let summary = "A bound on a value that the bounded numerics enforce";
  let description = [{
    `min(max(x, -limit), limit)` (NaN-propagating, as `arith.maximumf` and
    `arith.minimumf`) in the default bounded numerics; `x` itself in the
    FlashOptim numerics (an optimizer with `numerics<flashoptim>`). A rule
    states with it a bound that its exact arithmetic never exceeds, so that
    quantized states cannot make an update the exact rule could not make:
    Adam's update is at most lr times the largest |m_hat| / sqrt(v_hat) that
    exact Adam can reach (docs/NUMERICS.md §8). flashopt-expand-encodings
    lowers it in the rule by one pattern built for the optimizer's numerics
    (`populateBoundLoweringPatterns`) before it inlines the rule into a
    kernel.

    ```mlir
    %upd_b = flashopt.bound %upd, %max_upd : f32
    ```
  }];
  let arguments = (ins F32:$x, F32:$limit);
  let results = (outs F32:$result);
  let assemblyFormat = "$x `,` $limit attr-dict `:` type($x)";
}

def FlashOpt_YieldOp : FlashOpt_Op<"yield", [
    Pure, Terminator, ReturnLike, ParentOneOf<["UpdateOp", "GuardedOp"]>]> {
  let summary = "Yields the results of an update rule or of a guarded fallback";
  let description = [{
    In `flashopt.update`: the new master weight and states (f32). In
    `flashopt.guarded`: the exactly computed values of its results.

    ```mlir
    flashopt.yield %theta_new, %m_new : f32, f32
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$values);
  let builders = [OpBuilder<(ins), [{ /* nothing */ }]>];
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
}

include "flashopt/Dialect/FlashOpt/IR/FlashOptKernelOps.td"

#endif // FLASHOPT_OPS_TD
