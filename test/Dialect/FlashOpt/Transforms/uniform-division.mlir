// RUN: flashopt-opt %s --flashopt-uniform-division --split-input-file | FileCheck %s

// A division by a per-step scalar (defined before the group body): one
// binary64 reciprocal before the body, and per element a widening, a
// binary64 multiply, the snap of its magnitude to a multiple of 2^-176
// below 2^-126 (K = 1.5 * 2^-124 = 7.05e-38), one rounding to f32, and the
// product's sign bit (from its high word) put back (docs/NUMERICS.md §3b).
// Two divisions by the same scalar share the reciprocal.
// CHECK-LABEL: flashopt.kernel @bias
// CHECK: %[[BC:.*]] = arith.subf
// CHECK: %[[BCD:.*]] = arith.extf %[[BC]] : f32 to f64
// CHECK: %[[R:.*]] = arith.divf %{{.*}}, %[[BCD]] : f64
// CHECK-NOT: arith.divf
// CHECK: flashopt.group_body
// CHECK: %[[X:.*]] = flashopt.load_element 0 : f32
// CHECK: %[[XD:.*]] = arith.extf %[[X]] : f32 to f64
// CHECK: %[[P:.*]] = arith.mulf %[[XD]], %[[R]] : f64
// CHECK: %[[K:.*]] = arith.constant 7.052966104933725E-38 : f64
// CHECK: %[[A:.*]] = math.absf %[[P]] : f64
// CHECK: %[[UP:.*]] = arith.addf %[[A]], %[[K]] : f64
// CHECK: %[[SN:.*]] = arith.subf %[[UP]], %[[K]] : f64
// CHECK: %[[QM:.*]] = arith.truncf %[[SN]] : f64 to f32
// CHECK: %[[PB:.*]] = arith.bitcast %[[P]] : f64 to i64
// CHECK: %[[HI:.*]] = arith.shrui %[[PB]], %{{.*}} : i64
// CHECK: %[[HI32:.*]] = arith.trunci %[[HI]] : i64 to i32
// CHECK: %[[SIGN:.*]] = arith.andi %[[HI32]], %{{.*}} : i32
// CHECK: %[[QB:.*]] = arith.bitcast %[[QM]] : f32 to i32
// CHECK: %[[OR:.*]] = arith.ori %[[QB]], %[[SIGN]] : i32
// CHECK: %[[Q:.*]] = arith.bitcast %[[OR]] : i32 to f32
// CHECK: %[[YD:.*]] = arith.extf %{{.*}} : f32 to f64
// CHECK: arith.mulf %[[YD]], %[[R]] : f64
// CHECK-NOT: arith.divf
// CHECK: flashopt.store_element 0, %[[Q]]
flashopt.kernel @bias group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"y", f32, element, readwrite>]) hypers(["beta"]) {
  %beta = flashopt.hyper "beta" default(0.9) : f32
  %one = arith.constant 1.000000e+00 : f32
  %bc = arith.subf %one, %beta : f32
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %y = flashopt.load_element 1 : f32
    %q = arith.divf %x, %bc : f32
    %k = arith.divf %y, %bc : f32
    flashopt.store_element 0, %q : f32
    flashopt.store_element 1, %k : f32
  }
}

// -----

// A constant divisor: the binary64 reciprocal is folded at compile time
// (1/1.5 correctly rounded to binary64) and placed before the body; |c| < 2
// has no tie to snap to. A constant of 3e38 keeps the snap.
// CHECK-LABEL: flashopt.kernel @constant
// CHECK-DAG: %[[R:.*]] = arith.constant 0.66666666666666663 : f64
// CHECK-DAG: %[[RB:.*]] = arith.constant 3.333333327224716E-39 : f64
// CHECK: flashopt.group_body
// CHECK: %[[XD:.*]] = arith.extf %{{.*}} : f32 to f64
// CHECK: %[[P:.*]] = arith.mulf %[[XD]], %[[R]] : f64
// CHECK-NEXT: arith.truncf %[[P]] : f64 to f32
// CHECK: %[[PBIG:.*]] = arith.mulf %{{.*}}, %[[RB]] : f64
// CHECK: math.absf %[[PBIG]]
// CHECK: arith.addf
// CHECK-NOT: arith.divf
flashopt.kernel @constant group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %c = arith.constant 1.500000e+00 : f32
    %q = arith.divf %x, %c : f32
    %big = arith.constant 3.000000e+38 : f32
    %qb = arith.divf %q, %big : f32
    flashopt.store_element 0, %qb : f32
  }
}

// -----

// Divisors that vary per element (or per group) stay divisions, as do
// divisions outside a group body and f64 divisions.
// CHECK-LABEL: flashopt.kernel @varying
// CHECK: arith.divf %{{.*}}, %{{.*}} : f64
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK: flashopt.group_body
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK-NOT: arith.extf
flashopt.kernel @varying group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"y", f32, element, readwrite>]) hypers(["lr", "initial_lr"]) {
  %lr = flashopt.hyper "lr" default(1.0e-3) : f32
  %ilr = flashopt.hyper "initial_lr" default(1.0e-3) : f32
  %lrd = arith.extf %lr : f32 to f64
  %ilrd = arith.extf %ilr : f32 to f64
  %rd = arith.divf %lrd, %ilrd : f64
  %ratio = arith.divf %lr, %ilr : f32
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %y = flashopt.load_element 1 : f32
    %abs = math.absf %y : f32
    %m = flashopt.group_max %abs : f32
    %q = arith.divf %x, %y : f32
    %n = arith.divf %y, %m : f32
    %s = arith.mulf %q, %ratio : f32
    flashopt.store_element 0, %s : f32
    flashopt.store_element 1, %n : f32
  }
}
