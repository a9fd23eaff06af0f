// RUN: flashopt-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{parameter type must be bf16, f16 or f32, got f64}}
flashopt.optimizer @a param(#flashopt.master<f64>) grad(bf16) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// expected-error @+1 {{correction must be i8 or i16, got i32}}
flashopt.optimizer @a param(#flashopt.master<bf16, correction = i32>) grad(bf16) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// expected-error @+1 {{f32 parameters take no correction term}}
flashopt.optimizer @a param(#flashopt.master<f32, correction = i8>) grad(f32) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{quantized storage must be i8, ui8, i4 or ui4, got i16}}
  flashopt.state "m" : #flashopt.quant<i16, group = 32, compand = none, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{group size must be a power of two in [16, 128], got 48}}
  flashopt.state "m" : #flashopt.quant<i8, group = 48, compand = none, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{group size must be a power of two in [16, 128], got 256}}
  flashopt.state "m" : #flashopt.quant<i8, group = 256, compand = none, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{scale type must be f16, bf16 or f32, got i8}}
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = none, scale = i8>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{softsign compander needs signed (i8) storage}}
  flashopt.state "m" : #flashopt.quant<ui8, group = 32, compand = softsign, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{sqrt compander needs unsigned (ui8) storage}}
  flashopt.state "v" : #flashopt.quant<i8, group = 32, compand = sqrt, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %v: f32) {
    flashopt.yield %theta, %v : f32, f32
  }
}

// -----

// The minifloat codes (docs/NUMERICS.md §2d): e3m4 is a sign and 7 bits.
flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{e3m4 compander needs signed (i8) storage}}
  flashopt.state "m" : #flashopt.quant<ui8, group = 32, compand = e3m4, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

// 4-bit codes (docs/NUMERICS.md §2e): a 4-bit minifloat needs 4-bit storage,
// an 8-bit compander 8-bit storage, and the signedness follows the format.
flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{e2m1 compander needs signed (i4) storage, got i8}}
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = e2m1, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{e3m1 compander needs unsigned (ui4) storage, got i4}}
  flashopt.state "v" : #flashopt.quant<i4, group = 32, compand = e3m1, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %v: f32) {
    flashopt.yield %theta, %v : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{softsign compander needs signed (i8) storage, got i4}}
  flashopt.state "m" : #flashopt.quant<i4, group = 32, compand = softsign, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{e4m4 compander needs unsigned (ui8) storage, got ui4}}
  flashopt.state "v" : #flashopt.quant<ui4, group = 32, compand = e4m4, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %v: f32) {
    flashopt.yield %theta, %v : f32, f32
  }
}

// -----

// e4m4 is 8 bits of a non-negative state.
flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{e4m4 compander needs unsigned (ui8) storage}}
  flashopt.state "v" : #flashopt.quant<i8, group = 32, compand = e4m4, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %v: f32) {
    flashopt.yield %theta, %v : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+2 {{expected ::mlir::flashopt::Compander to be one of: none, softsign, sqrt, e3m4, e4m4}}
  // expected-error @+1 {{failed to parse FlashOpt_QuantAttr parameter 'compand'}}
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = e4m3, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{plain storage must be f32, bf16 or f16, got i8}}
  flashopt.state "m" : #flashopt.plain<i8>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

flashopt.optimizer @a param(#flashopt.master<bf16>) grad(bf16) {
  // expected-error @+1 {{attribute 'encoding' failed to satisfy constraint: a state encoding (#flashopt.quant, #flashopt.plain, #flashopt.elided or another attribute implementing StateEncodingAttrInterface)}}
  flashopt.state "m" : #flashopt.buffer<"m", f32, element, readwrite>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    flashopt.yield %theta, %m : f32, f32
  }
}

// -----

// expected-error @+1 {{buffer name must not be empty}}
flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
  }
}

// -----

// expected-error @+1 {{buffer element type must be one of bf16, f16, f32, i8, ui8, i16, i4, ui4, got f64}}
flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"p", f64, element, readwrite>]) hypers([]) {
  flashopt.group_body {
  }
}
