// RUN: flashopt-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

// expected-error @+1 {{group size must be a positive power of two, got 24}}
flashopt.kernel @k group_size(24) buffers([]) hypers([]) {
  flashopt.group_body {
  }
}

// -----

// expected-error @+1 {{hyper-parameter "lr" listed twice}}
flashopt.kernel @k group_size(32) buffers([]) hypers(["lr", "lr"]) {
  flashopt.group_body {
  }
}

// -----

// expected-error @+1 {{buffer "p" listed twice}}
flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"p", f32, element, readwrite>, #flashopt.buffer<"p", f32, element, read>]) hypers([]) {
  flashopt.group_body {
  }
}

// -----

// expected-error @+1 {{expects exactly one flashopt.group_body, found 0}}
flashopt.kernel @k group_size(32) buffers([]) hypers([]) {
}

// -----

flashopt.kernel @k group_size(32) buffers([]) hypers([]) {
  // expected-error @+1 {{hyper-parameter "lr" is not listed in the kernel's hypers}}
  %lr = flashopt.hyper "lr" : f32
  flashopt.group_body {
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"p", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    // expected-error @+1 {{buffer index 3 out of range (kernel has 1 buffers)}}
    %p = flashopt.load_element 3 : f32
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"s", f16, group, readwrite>]) hypers([]) {
  flashopt.group_body {
    // expected-error @+1 {{buffer "s" holds one value per group, not per element}}
    %p = flashopt.load_element 0 : f16
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"p", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    // expected-error @+1 {{buffer "p" holds one value per element, not per group}}
    %p = flashopt.load_group 0 : f32
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"p", bf16, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    // expected-error @+1 {{type 'f32' does not match buffer "p" (accessed as 'bf16')}}
    %p = flashopt.load_element 0 : f32
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"c", ui8, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    // expected-error @+1 {{type 'ui8' does not match buffer "c" (accessed as 'i8')}}
    %c = flashopt.load_element 0 : ui8
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"g", f32, element, read>]) hypers([]) {
  flashopt.group_body {
    %g = flashopt.load_element 0 : f32
    // expected-error @+1 {{buffer "g" is read-only}}
    flashopt.store_element 0, %g : f32
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"p", f32, element, readwrite>, #flashopt.buffer<"s", f32, group, readwrite>]) hypers([]) {
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %a = math.absf %p : f32
    // expected-error @+1 {{stored value must be uniform across the group}}
    flashopt.store_group 1, %a : f32
  }
}

// -----

func.func @f(%x: f32) {
  // expected-error @+1 {{expects parent op 'flashopt.group_body'}}
  %m = flashopt.group_max %x : f32
  return
}

// -----

flashopt.kernel @k group_size(32) buffers([]) hypers([]) {
  // expected-error @+1 {{is not allowed in a flashopt.kernel prologue}}
  %x = "test.op"() : () -> f32
  flashopt.group_body {
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"p", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %c = arith.constant 1 : i8
    // expected-error @+1 {{fast value #0 has type 'f32', result 'i8'}}
    %g = flashopt.guarded %p, %p {limit = 0.25 : f32} : f32 -> i8 {
      flashopt.yield %c : i8
    }
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"p", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %g = flashopt.guarded %p, %p {limit = 0.25 : f32} : f32 -> f32 {
      %c = arith.constant 1 : i8
      // expected-error @+1 {{yields 1 values whose types differ from the guarded results}}
      flashopt.yield %c : i8
    }
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"p", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %g = flashopt.guarded %p, %p {limit = 0.25 : f32} : f32 -> f32 {
      // expected-error @+1 {{is not allowed in a guarded fallback (element-wise scalar code only)}}
      %m = flashopt.group_max %p : f32
      flashopt.yield %m : f32
    }
  }
}

// -----

flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>]) hypers([]) {
  %t = flashopt.step_count : i64
  flashopt.group_body {
    // expected-error @+1 {{offset must be 1.0 (a dither in [0, 1)), 1.5 (one in [-0.5, 0.5)) or 0.0 (one in [1, 2)), got 5.000000e-01}}
    %u = flashopt.dither %t {offset = 0.5 : f32} : f32
    flashopt.store_element 0, %u : f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<f32>) grad(f32) {
  %t = flashopt.step_count : i64
  flashopt.update(%theta: f32, %g: f32) {
    // expected-error @+1 {{expects parent op 'flashopt.group_body'}}
    %u = flashopt.dither %t {offset = 1.0 : f32} : f32
    flashopt.yield %theta : f32
  }
}
