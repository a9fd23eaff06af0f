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
    docs/NUMERICS.md specifies.

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
}

#endif // FLASHOPT_TRANSFORMS_PASSES_TD
