// RUN: flashopt-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

// expected-error @+1 {{gradient type must be bf16, f16 or f32, got 'i8'}}
flashopt.optimizer @a param(#flashopt.master<bf16>) grad(i8) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// expected-error @+1 {{expects exactly one flashopt.update, found 0}}
flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  %lr = flashopt.hyper "lr" : f32
}

// -----

// expected-error @+1 {{expects exactly one flashopt.update, found 2}}
flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  %lr = flashopt.hyper "lr" : f32
  // expected-error @+1 {{hyper-parameter "lr" declared twice}}
  %lr2 = flashopt.hyper "lr" : f32
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  flashopt.state "m" : #flashopt.plain<f32>
  // expected-error @+1 {{state "m" declared twice}}
  flashopt.state "m" : #flashopt.plain<f32>
  flashopt.update(%theta: f32, %g: f32, %m: f32, %m2: f32) {
    flashopt.yield %theta, %m, %m2 : f32, f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
  // expected-error @+1 {{quantized states must share one group size: "m" has 32, "v" has 64}}
  flashopt.state "v" : #flashopt.quant<ui8, group = 64, compand = sqrt, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32, %v: f32) {
    flashopt.yield %theta, %m, %v : f32, f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{state "m" is elidable on an unknown hyper-parameter "momentum"}}
  flashopt.state "m" elidable("momentum") : #flashopt.plain<f32>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{state "m" is elided but not declared elidable}}
  flashopt.state "m" : #flashopt.elided
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{state name must be an identifier, got "exp avg"}}
  flashopt.state "exp avg" : #flashopt.plain<f32>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{hyper-parameter name must be an identifier, got "1lr"}}
  %lr = flashopt.hyper "1lr" : f32
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{default value of "lr" must be finite}}
  %lr = flashopt.hyper "lr" default(0x7F800000) : f32
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

func.func @f() {
  // expected-error @+1 {{expects parent op 'flashopt.optimizer' or 'flashopt.kernel'}}
  %lr = flashopt.hyper "lr" : f32
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{expects parent op 'flashopt.optimizer' or 'flashopt.kernel'}}
  %t = flashopt.step_count : i64
  return
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{is not allowed in a flashopt.optimizer body}}
  %x = "test.unknown"() : () -> f32
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{operations in an optimizer body must work on scalars, but 'arith.constant' has a result of type 'vector<4xf32>'}}
  %c = arith.constant dense<1.0> : vector<4xf32>
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// expected-error @+1 {{accumulator must be #flashopt.master<f32>, #flashopt.master<bf16, correction = i8> or #flashopt.master<bf16>, got #flashopt.master<f16>}}
flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<f16>) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}
