// RUN: flashopt-opt %s --flashopt-expand-encodings=kernel-kind=accumulate --split-input-file --verify-diagnostics
// RUN: not flashopt-opt %s --flashopt-expand-encodings=kernel-kind=fused 2>&1 | FileCheck %s --check-prefix=BADKIND
// RUN: not flashopt-opt %s --flashopt-cpu-pipeline=kernel-kind=fused 2>&1 | FileCheck %s --check-prefix=BADKIND

// The kernel kind is a pass option with four values, checked when parsed.
// BADKIND: for the --kernel-kind option: Cannot find option named 'fused'!

// expected-error @+1 {{has no accumulator (accumulate(...)), so it has no accumulate kernel}}
flashopt.optimizer @sgd param(#flashopt.master<bf16>) grad(bf16) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}
