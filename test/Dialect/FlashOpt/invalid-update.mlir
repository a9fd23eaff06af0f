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

// expected-error @+1 {{'flashopt.numerics' must be "bounded" or "flashoptim", got "fast"}}
flashopt.optimizer @a param(#flashopt.master<f32>) grad(f32) attributes {flashopt.numerics = "fast"} {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
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
