// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-decode-tables --split-input-file | FileCheck %s

// The softsign momentum decode: t = k / 127, t / (2 - |t|), then times the
// group's scale. The code's part becomes one table read (256 entries, folded
// in IEEE binary32: code 1 -> 0x3B81848E, 2 -> 0x3C020820, -128 ->
// 0xBF820820, written little-endian), the scale multiply stays, and the
// divisions are gone.
// CHECK-LABEL: flashopt.kernel @softsign
// CHECK: %[[K:.*]] = flashopt.load_element 0 : i8
// CHECK: %[[S:.*]] = flashopt.load_group 1 : f32
// CHECK: %[[T:.*]] = flashopt.table_lookup %[[K]] {table = dense<"0x000000008E84813B2008023C
// CHECK-SAME: 200882BF
// CHECK-SAME: : tensor<256xf32>} : i8 -> f32
// CHECK-NOT: arith.divf
// CHECK: %[[V:.*]] = arith.mulf %[[T]], %[[S]] : f32
// CHECK: flashopt.store_element 2, %[[V]] : f32
flashopt.kernel @softsign group_size(32) buffers([#flashopt.buffer<"m.codes", i8, element, read>, #flashopt.buffer<"m.scales", f32, group, read>, #flashopt.buffer<"out", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %k = flashopt.load_element 0 : i8
    %s = flashopt.load_group 1 : f32
    %x = arith.sitofp %k : i8 to f32
    %c127 = arith.constant 127.0 : f32
    %t = arith.divf %x, %c127 : f32
    %a = math.absf %t : f32
    %c2 = arith.constant 2.0 : f32
    %d = arith.subf %c2, %a : f32
    %y = arith.divf %t, %d : f32
    %v = arith.mulf %y, %s : f32
    flashopt.store_element 2, %v : f32
  }
}

// -----

// The fast mode's reciprocal of a constant (computed in the body) is part
// of the code's computation: t = k * RN(1/127) is folded with it.
// CHECK-LABEL: flashopt.kernel @fast_reciprocal
// CHECK: flashopt.table_lookup
// CHECK-NOT: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK: flashopt.store_element
flashopt.kernel @fast_reciprocal group_size(32) buffers([#flashopt.buffer<"m.codes", i8, element, read>, #flashopt.buffer<"out", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %k = flashopt.load_element 0 : i8
    %x = arith.sitofp %k : i8 to f32
    %one = arith.constant 1.0 : f32
    %c127 = arith.constant 127.0 : f32
    %r = arith.divf %one, %c127 : f32
    %t = arith.mulf %x, %r : f32
    %a = math.absf %t : f32
    %c2 = arith.constant 2.0 : f32
    %d = arith.subf %c2, %a : f32
    %y = arith.divf %t, %d : f32
    flashopt.store_element 1, %y : f32
  }
}

// -----

// Left alone: a code function without a division or root (a multiply is
// cheaper than a table read), one that depends on a second element (the
// gradient), a 16-bit code, and one that does not fold for every code
// (math.sqrt of a negative code is not folded).
// CHECK-LABEL: flashopt.kernel @untouched
// CHECK-NOT: flashopt.table_lookup
// CHECK: arith.mulf
// CHECK: arith.divf
// CHECK: arith.divf
// CHECK: math.sqrt
// CHECK-NOT: flashopt.table_lookup
flashopt.kernel @untouched group_size(32) buffers([#flashopt.buffer<"c", i8, element, read>, #flashopt.buffer<"g", f32, element, read>, #flashopt.buffer<"w", i16, element, read>, #flashopt.buffer<"out", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %k = flashopt.load_element 0 : i8
    %g = flashopt.load_element 1 : f32
    %w = flashopt.load_element 2 : i16
    %x = arith.sitofp %k : i8 to f32
    %half = arith.constant 0.5 : f32
    %a = arith.mulf %x, %half : f32
    %b = arith.divf %x, %g : f32
    %wx = arith.sitofp %w : i16 to f32
    %c = arith.constant 3.0 : f32
    %e = arith.divf %wx, %c : f32
    %r = math.sqrt %x : f32
    %s1 = arith.addf %a, %b : f32
    %s2 = arith.addf %e, %r : f32
    %s = arith.addf %s1, %s2 : f32
    flashopt.store_element 3, %s : f32
  }
}

// -----

// A minifloat code's value (docs/NUMERICS.md §2d, e3m4): its exponent and
// mantissa as f32 bits, a subnormal as code * 2^-10, its sign: no division,
// but seven operations of the code alone, so one table read (code 1 ->
// 2^-10 = 0x3A800000, 16 -> 2^-6 = 0x3C800000, 127 -> 1.9375 = 0x3FF80000,
// -127 -> 0xBFF80000 at entry 129, -128 never stored).
// CHECK-LABEL: flashopt.kernel @m
// CHECK: %[[K:.*]] = flashopt.load_element 2 : i8
// CHECK: %[[T:.*]] = flashopt.table_lookup %[[K]] {table = dense<"0x000000000000803A0000003B
// CHECK-SAME: 0000F83F
// CHECK-SAME: 0000F8BF
// CHECK-SAME: : tensor<256xf32>} : i8 -> f32
// CHECK-NOT: math.absi
// CHECK: arith.mulf %[[T]], %{{.*}} : f32
flashopt.optimizer @m param(#flashopt.master<f32>) grad(f32) {
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = e3m4, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %m1 = arith.addf %m, %g : f32
    flashopt.yield %theta, %m1 : f32, f32
  }
}
