// RUN: flashopt-opt %s | flashopt-opt | FileCheck %s
// RUN: flashopt-opt %s --mlir-print-op-generic | flashopt-opt | FileCheck %s

// CHECK-LABEL: flashopt.optimizer @adam_like
// CHECK-SAME: param(#flashopt.master<bf16, correction = i8>) grad(bf16)
flashopt.optimizer @adam_like param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
  // CHECK: %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  // CHECK: %beta = flashopt.hyper "beta" : f32
  %beta = flashopt.hyper "beta" : f32
  // CHECK: %step = flashopt.step_count : i64
  %t = flashopt.step_count : i64
  // CHECK: flashopt.powi %beta, %step : f32, i64
  %p = flashopt.powi %beta, %t : f32, i64
  // CHECK: flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
  // CHECK: flashopt.state "v" : #flashopt.quant<ui8, group = 32, compand = sqrt, scale = bf16>
  flashopt.state "v" : #flashopt.quant<ui8, group = 32, compand = sqrt, scale = bf16>
  // CHECK: flashopt.state "w" : #flashopt.plain<f16>
  flashopt.state "w" : #flashopt.plain<f16>
  // CHECK: flashopt.state "m2" : #flashopt.quant<i8, group = 32, compand = e3m4, scale = bf16>
  flashopt.state "m2" : #flashopt.quant<i8, group = 32, compand = e3m4, scale = bf16>
  // CHECK: flashopt.state "v2" : #flashopt.quant<ui8, group = 32, compand = e4m4, scale = f32>
  flashopt.state "v2" : #flashopt.quant<ui8, group = 32, compand = e4m4, scale = f32>
  // CHECK: flashopt.update(%theta: f32, %grad: f32, %m: f32, %v: f32, %w: f32, %m2: f32, %v2: f32) {
  flashopt.update(%theta: f32, %g: f32, %m: f32, %v: f32, %w: f32, %m2: f32, %v2: f32) {
    // CHECK: arith.mulf %grad, %lr : f32
    %d = arith.mulf %g, %lr : f32
    %n = arith.subf %theta, %d : f32
    // CHECK: flashopt.yield %{{.*}}, %m, %v, %w, %m2, %v2 : f32, f32, f32, f32, f32, f32
    flashopt.yield %n, %m, %v, %w, %m2, %v2 : f32, f32, f32, f32, f32, f32
  }
}

// CHECK-LABEL: flashopt.optimizer @plain_f32
// CHECK-SAME: param(#flashopt.master<f32>) grad(f32)
flashopt.optimizer @plain_f32 param(#flashopt.master<f32>) grad(f32) {
  %lr = flashopt.hyper "lr" default(1.000000e-02) : f32
  // CHECK: flashopt.state "momentum_buffer" elidable("lr") : #flashopt.elided
  flashopt.state "momentum_buffer" elidable("lr") : #flashopt.elided
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %d = arith.mulf %g, %lr : f32
    %n = arith.subf %theta, %d : f32
    flashopt.yield %n, %m : f32, f32
  }
}

// CHECK-LABEL: flashopt.optimizer @fp16_i16
// CHECK-SAME: param(#flashopt.master<f16, correction = i16>) grad(f32)
flashopt.optimizer @fp16_i16 param(#flashopt.master<f16, correction = i16>) grad(f32) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// The modes (typed attributes; the defaults, bounded and exact, are not
// printed) and the bound of the bounded numerics.
// CHECK-LABEL: flashopt.optimizer @bounded_update
// CHECK-SAME: grad(f32) numerics<flashoptim> arithmetic<fast> {
flashopt.optimizer @bounded_update param(#flashopt.master<f32>) grad(f32) numerics<flashoptim> arithmetic<fast> {
  %lim = flashopt.hyper "lim" default(1.000000e-02) : f32
  flashopt.update(%theta: f32, %g: f32) {
    // CHECK: %[[B:.*]] = flashopt.bound %grad, %lim : f32
    %b = flashopt.bound %g, %lim : f32
    %n = arith.subf %theta, %b : f32
    flashopt.yield %n : f32
  }
}

// CHECK-LABEL: flashopt.optimizer @defaults
// CHECK-SAME: grad(f32) {
flashopt.optimizer @defaults param(#flashopt.master<f32>) grad(f32) numerics<bounded> arithmetic<exact> {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// CHECK-LABEL: flashopt.kernel @dithered kind<step_accumulated> group_size(32)
// CHECK-SAME: hypers([]) arithmetic<fast> {
flashopt.kernel @dithered kind<step_accumulated> group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>]) hypers([]) arithmetic<fast> {
  %t = flashopt.step_count : i64
  flashopt.group_body {
    // CHECK: flashopt.dither %{{.*}} {offset = 1.000000e+00 : f32} : f32
    %u = flashopt.dither %t {offset = 1.0 : f32} : f32
    // CHECK: flashopt.dither %{{.*}} {offset = 1.500000e+00 : f32} : f32
    %h = flashopt.dither %t {offset = 1.5 : f32} : f32
    %s = arith.addf %u, %h : f32
    flashopt.store_element 0, %s : f32
  }
}

// CHECK-LABEL: flashopt.kernel @k group_size(32)
// CHECK-SAME: buffers([#flashopt.buffer<"param", f32, element, readwrite>, #flashopt.buffer<"s.scales", f16, group, readwrite>, #flashopt.buffer<"grad", f32, element, read>])
// CHECK-SAME: hypers(["lr"])
flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>, #flashopt.buffer<"s.scales", f16, group, readwrite>, #flashopt.buffer<"grad", f32, element, read>]) hypers(["lr"]) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  // CHECK: flashopt.group_body {
  flashopt.group_body {
    // CHECK: flashopt.load_element 0 : f32
    %p = flashopt.load_element 0 : f32
    // CHECK: flashopt.load_group 1 : f16
    %s = flashopt.load_group 1 : f16
    %a = math.absf %p : f32
    // CHECK: flashopt.group_max %{{.*}} : f32
    %m = flashopt.group_max %a : f32
    %mh = arith.truncf %m : f32 to f16
    // CHECK: flashopt.store_group 1, %{{.*}} : f16
    flashopt.store_group 1, %mh : f16
    // CHECK: flashopt.group_max %{{.*}} {bits} : f32
    %mb = flashopt.group_max %p {bits} : f32
    // CHECK: flashopt.rcp_approx %{{.*}} : f32
    %r = flashopt.rcp_approx %mb : f32
    // CHECK: flashopt.sqrt_approx %{{.*}} : f32
    %q = flashopt.sqrt_approx %r : f32
    // CHECK: %[[G:.*]] = flashopt.guarded %{{.*}}, %{{.*}} {limit = 2.500000e-01 : f32} : f32 -> f32 {
    // CHECK:   flashopt.yield %{{.*}} : f32
    %g = flashopt.guarded %a, %q {limit = 0.25 : f32} : f32 -> f32 {
      %e = math.sqrt %r : f32
      flashopt.yield %e : f32
    }
    // CHECK: flashopt.store_element 0, %{{.*}} : f32
    flashopt.store_element 0, %g : f32
  }
}

// CHECK-LABEL: func.func @raw
func.func @raw(%base: i64, %i: index, %mask: vector<8xi1>, %v: vector<8xbf16>) -> vector<8xbf16> {
  // CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 16 : i64} : vector<8xbf16>
  %a = flashopt.raw_load %base[%i] {alignment = 16} : vector<8xbf16>
  // CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] mask(%{{.*}} : vector<8xi1>) : vector<8xbf16>
  %b = flashopt.raw_load %base[%i] mask(%mask : vector<8xi1>) : vector<8xbf16>
  // CHECK: flashopt.raw_store %{{.*}}, %{{.*}}[%{{.*}}] mask(%{{.*}} : vector<8xi1>) {alignment = 2 : i64} : vector<8xbf16>
  flashopt.raw_store %a, %base[%i] mask(%mask : vector<8xi1>) {alignment = 2} : vector<8xbf16>
  return %b : vector<8xbf16>
}

// -----

// A gradient accumulator (bf16 + i8) round-trips.
// CHECK-LABEL: flashopt.optimizer @with_accumulator
// CHECK-SAME: grad(bf16) accumulate(#flashopt.master<bf16, correction = i8>) {
flashopt.optimizer @with_accumulator param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<bf16, correction = i8>) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}

// -----

// CHECK-LABEL: func.func @table
func.func @table(%k: i8, %v: vector<8xi8>) -> (f32, vector<8xf32>) {
  // CHECK: flashopt.table_lookup %{{.*}} {table = dense<2.500000e-01> : tensor<256xf32>} : i8 -> f32
  %a = flashopt.table_lookup %k {table = dense<0.25> : tensor<256xf32>} : i8 -> f32
  // CHECK: flashopt.table_lookup %{{.*}} {table = dense<2.500000e-01> : tensor<256xf32>} : vector<8xi8> -> vector<8xf32>
  %b = flashopt.table_lookup %v {table = dense<0.25> : tensor<256xf32>} : vector<8xi8> -> vector<8xf32>
  return %a, %b : f32, vector<8xf32>
}
