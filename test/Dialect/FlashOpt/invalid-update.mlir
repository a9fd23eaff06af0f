// RUN: flashopt-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  flashopt.state "m" : #flashopt.plain<f32>
  // expected-error @+1 {{expects 3 block arguments (master weight, gradient and 1 states), found 2}}
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta, %g : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{block argument #1 must be f32, found 'f16'}}
  flashopt.update(%theta: f32, %g: f16) {
    flashopt.yield %theta : f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  flashopt.state "m" : #flashopt.plain<f32>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    // expected-error @+1 {{must yield 2 values (master weight and 1 states), found 1}}
    flashopt.yield %theta : f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  flashopt.update(%theta: f32, %g: f32) {
    // expected-error @+1 {{is not allowed in an update rule (only scalar arith and math operations and flashopt.bound)}}
    %x = "test.op"(%theta) : (f32) -> f32
    flashopt.yield %x : f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  flashopt.update(%theta: f32, %g: f32) {
    // expected-error @+1 {{operations in an update rule must work on scalars, but 'arith.constant' has a result of type 'vector<2xf32>'}}
    %c = arith.constant dense<2.0> : vector<2xf32>
    flashopt.yield %theta : f32
  }
}

// -----

func.func @f() {
  // expected-error @+1 {{expects parent op 'flashopt.optimizer'}}
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{expects parent op 'flashopt.optimizer'}}
  flashopt.state "m" : #flashopt.plain<f32>
  return
}

// -----

// The modes are typed attributes, checked when parsed.
// expected-error @+2 {{expected ::mlir::flashopt::Numerics to be one of: bounded, flashoptim}}
// expected-error @+1 {{failed to parse FlashOpt_NumericsAttr parameter 'value'}}
flashopt.optimizer @a param(#flashopt.master<f32>) grad(f32) numerics<fast> {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// expected-error @+1 {{attribute 'arithmetic' failed to satisfy constraint: the arithmetic of an optimizer or kernel (exact or fast}}
flashopt.optimizer @a param(#flashopt.master<f32>) grad(f32) attributes {arithmetic = "fast"} {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// The string attributes that once carried the modes are refused, not
// ignored.
// expected-error @+1 {{carries the string attribute 'flashopt.numerics', which is no longer read; the mode is written numerics<bounded|flashoptim>}}
flashopt.optimizer @a param(#flashopt.master<f32>) grad(f32) attributes {flashopt.numerics = "flashoptim"} {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// expected-error @+1 {{carries the string attribute 'flashopt.kernel_kind'}}
flashopt.optimizer @a param(#flashopt.master<f32>) grad(f32) attributes {flashopt.kernel_kind = "accumulate"} {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// expected-error @+2 {{expected ::mlir::flashopt::KernelKind to be one of: step, accumulate, step_accumulated, step_fused}}
// expected-error @+1 {{failed to parse FlashOpt_KernelKindAttr parameter 'value'}}
flashopt.kernel @k kind<fused> group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
  }
}

// -----

// expected-error @+1 {{carries the string attribute 'flashopt.arithmetic', which is no longer read; the mode is written arithmetic<exact|fast>}}
flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>]) hypers([]) attributes {flashopt.arithmetic = "fast"} {
  flashopt.group_body {
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>]) hypers([]) {
  %l = arith.constant 1.0 : f32
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    // expected-error @+1 {{expects parent op 'flashopt.update'}}
    %b = flashopt.bound %p, %l : f32
    flashopt.store_element 0, %b : f32
  }
}
