// RUN: flashopt-opt %s --flashopt-exact-group-division --split-input-file | FileCheck %s

// The quantization division by the group absmax: one reciprocal of the
// (scaled) absmax per group, then per element a multiply by the scale, one
// by the reciprocal and two FMA residual corrections (docs/NUMERICS.md §2b).
// CHECK-LABEL: flashopt.kernel @quant
// CHECK: %[[M:.*]] = flashopt.group_max
// CHECK: %[[A:.*]] = arith.maximumf %[[M]], %{{.*}} : f32
// CHECK: %[[BIG:.*]] = arith.cmpf ogt, %[[A]], %{{.*}} : f32
// CHECK: %[[S:.*]] = arith.select %[[BIG]], %{{.*}}, %{{.*}} : f32
// CHECK: %[[AS:.*]] = arith.mulf %[[A]], %[[S]] : f32
// CHECK: %[[R:.*]] = arith.divf %{{.*}}, %[[AS]] : f32
// CHECK: %[[NA:.*]] = arith.negf %[[AS]] : f32
// CHECK: %[[Y:.*]] = arith.mulf %[[X:.*]], %[[S]] : f32
// CHECK: %[[Q0:.*]] = arith.mulf %[[Y]], %[[R]] : f32
// CHECK: %[[E0:.*]] = math.fma %[[Q0]], %[[NA]], %[[Y]] : f32
// CHECK: %[[Q1:.*]] = math.fma %[[E0]], %[[R]], %[[Q0]] : f32
// CHECK: %[[E1:.*]] = math.fma %[[Q1]], %[[NA]], %[[Y]] : f32
// CHECK: %[[Q:.*]] = math.fma %[[E1]], %[[R]], %[[Q1]] : f32
// CHECK-NOT: arith.divf
// CHECK: flashopt.store_element 0, %[[Q]]
flashopt.kernel @quant group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %abs = math.absf %x : f32
    %m = flashopt.group_max %abs : f32
    %c = arith.constant 1.000000e-12 : f32
    %a = arith.maximumf %m, %c : f32
    %n = arith.divf %x, %a : f32
    flashopt.store_element 0, %n : f32
  }
}

// -----

// Not the absmax of the dividend (|y| <= a unknown), or not a group maximum:
// the division stays.
// CHECK-LABEL: flashopt.kernel @other
// CHECK-COUNT-2: arith.divf
// CHECK-NOT: math.fma
flashopt.kernel @other group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"y", f32, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %y = flashopt.load_element 1 : f32
    %abs = math.absf %y : f32
    %m = flashopt.group_max %abs : f32
    %n = arith.divf %x, %m : f32
    %k = arith.divf %x, %y : f32
    flashopt.store_element 0, %n : f32
    flashopt.store_element 1, %k : f32
  }
}
