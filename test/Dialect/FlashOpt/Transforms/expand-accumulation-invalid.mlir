// RUN: flashopt-opt %s --flashopt-expand-encodings --split-input-file --verify-diagnostics

// expected-error @+1 {{has no accumulator (accumulate(...)), so it has no accumulate kernel}}
flashopt.optimizer @sgd param(#flashopt.master<bf16>) grad(bf16) attributes {flashopt.kernel_kind = "accumulate"} {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// expected-error @+1 {{'flashopt.kernel_kind' must be one of "step", "accumulate", "step_accumulated", "step_fused", got "fused"}}
flashopt.optimizer @sgd param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<f32>) attributes {flashopt.kernel_kind = "fused"} {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}
