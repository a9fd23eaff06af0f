//===- FlashOptDialect.td - flashopt dialect definition ----*- tablegen -*-===//
//
// Part of flashopt. The dialect describes optimizer update rules and how their
// parameters and states are stored.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_DIALECT_TD
#define FLASHOPT_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def FlashOpt_Dialect : Dialect {
  let name = "flashopt";
  let cppNamespace = "::mlir::flashopt";
  let summary = "Memory-efficient optimizer update rules and their storage encodings";
  let description = [{
    The `flashopt` dialect holds two things apart: the *rule* of an optimizer
    (pure f32 scalar math on one element, in `flashopt.update`) and the
    *encodings* of what it reads and writes (a 16-bit parameter with an 8- or
    16-bit correction term, 8-bit companded states with per-group scales, or
    plain floats). `flashopt-expand-encodings` turns an optimizer into
    target-neutral kernel IR (`flashopt.kernel`), which the CPU and GPU back
    ends lower to native code.

    ```mlir
    flashopt.optimizer @adamw param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
      %lr = flashopt.hyper "lr" default(1.0e-3 : f32) : f32
      flashopt.state "exp_avg" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
      flashopt.update(%theta: f32, %g: f32, %m: f32) {
        ...
        flashopt.yield %theta_new, %m_new : f32, f32
      }
    }
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
  let useDefaultAttributePrinterParser = 1;
}

class FlashOpt_Op<string mnemonic, list<Trait> traits = []>
    : Op<FlashOpt_Dialect, mnemonic, traits>;

#endif // FLASHOPT_DIALECT_TD
