// RUN: flashopt-opt %s --flashopt-guarded-quantize --split-input-file | FileCheck %s

// A softsign i8 code and a sqrt ui8 code, as flashopt-expand-encodings
// writes them: both become an approximate chain with a guard, in one
// flashopt.guarded whose fallback is the exact chains (docs/NUMERICS.md §2c).
// The sqrt state's absmax is the root of the group's largest radicand by bit
// order (one root per group instead of one per element). The first code's
// store moves after the merged op.
// CHECK-LABEL: flashopt.kernel @codes
// CHECK: %[[M:.*]] = flashopt.load_element 0 : f32
// CHECK: %[[V:.*]] = flashopt.load_element 1 : f32
// CHECK: %[[AM:.*]] = arith.maximumf %{{.*}}, %{{.*}} : f32
// Softsign: R per group (NaN past 2^126), n' = m * R, one rcp of 1 + |n'|.
// CHECK: %[[R:.*]] = flashopt.rcp_approx %[[AM]] : f32
// CHECK: %[[RANGE:.*]] = arith.cmpf olt, %[[AM]], %{{.*}} : f32
// CHECK: %[[RG:.*]] = arith.select %[[RANGE]], %[[R]], %{{.*}} : f32
// CHECK: %[[N:.*]] = arith.mulf %[[M]], %[[RG]] : f32
// CHECK: %[[AN:.*]] = math.absf %[[N]] : f32
// CHECK: %[[DEN:.*]] = arith.addf %{{.*}}, %[[AN]] : f32
// CHECK: %[[RD:.*]] = flashopt.rcp_approx %[[DEN]] : f32
// CHECK: %[[N2:.*]] = arith.mulf %[[N]], %{{.*}} : f32
// CHECK: %[[Y:.*]] = arith.mulf %[[N2]], %[[RD]] : f32
// CHECK: %[[F:.*]] = math.roundeven %[[Y]] : f32
// CHECK: %[[CODE:.*]] = arith.fptosi %{{.*}} : f32 to i8
// CHECK: %[[D:.*]] = arith.subf %[[Y]], %[[F]] : f32
// CHECK: %[[SLACK1:.*]] = math.absf %[[D]] : f32
// Sqrt: the absmax from the radicands, then S = (255 / a)^2 per group.
// CHECK: %[[Z:.*]] = arith.addf %[[V]], %{{.*}} : f32
// CHECK: %[[GV:.*]] = flashopt.group_max %[[Z]] {bits} : f32
// CHECK: %[[ROOT:.*]] = math.sqrt %[[GV]] : f32
// CHECK: %[[AV:.*]] = arith.maximumf %[[ROOT]], %{{.*}} : f32
// CHECK: %[[TRUNC:.*]] = arith.truncf %[[AV]] : f32 to f16
// CHECK: %[[RV:.*]] = flashopt.rcp_approx %[[AV]] : f32
// CHECK: %[[K:.*]] = arith.mulf %{{.*}}, %[[RV]] : f32
// CHECK: %[[KK:.*]] = arith.mulf %[[K]], %[[K]] : f32
// CHECK: %[[S:.*]] = arith.select %{{.*}}, %[[KK]], %{{.*}} : f32
// CHECK: %[[VS:.*]] = arith.mulf %[[V]], %[[S]] : f32
// CHECK: %[[YV:.*]] = flashopt.sqrt_approx %[[VS]] : f32
// CHECK: math.roundeven %[[YV]] : f32
// CHECK: %[[CODEV:.*]] = arith.fptoui %{{.*}} : f32 to i8
// CHECK: %[[SLACK2:.*]] = math.absf %{{.*}} : f32
// CHECK: %[[SLACK:.*]] = arith.maximumf %[[SLACK1]], %[[SLACK2]] : f32
// CHECK: %[[G:.*]]:2 = flashopt.guarded %[[SLACK]], %[[CODE]], %[[CODEV]] {limit = 0.499755859 : f32} : i8, i8 -> i8, i8 {
// CHECK:   arith.divf %[[M]], %[[AM]] : f32
// CHECK:   arith.divf
// CHECK:   arith.fptosi
// CHECK:   %[[SQ:.*]] = math.sqrt %[[V]] : f32
// CHECK:   arith.divf %[[SQ]], %[[AV]] : f32
// CHECK:   arith.fptoui
// CHECK:   flashopt.yield
// CHECK: }
// CHECK-NOT: group_max %{{.*}} : f32
// CHECK: flashopt.store_element 2, %[[G]]#0 : i8
// CHECK: flashopt.store_group 4, %[[TRUNC]] : f16
// CHECK: flashopt.store_element 3, %[[G]]#1 : i8
flashopt.kernel @codes group_size(32) buffers([#flashopt.buffer<"m", f32, element, read>, #flashopt.buffer<"v", f32, element, read>, #flashopt.buffer<"m.codes", i8, element, readwrite>, #flashopt.buffer<"v.codes", ui8, element, readwrite>, #flashopt.buffer<"v.scales", f16, group, readwrite>]) hypers([]) {
  flashopt.group_body {
    %m = flashopt.load_element 0 : f32
    %v = flashopt.load_element 1 : f32
    %am = math.absf %m : f32
    %gm = flashopt.group_max %am : f32
    %floor = arith.constant 9.99999996E-13 : f32
    %a = arith.maximumf %gm, %floor : f32
    %n = arith.divf %m, %a : f32
    %two = arith.constant 2.000000e+00 : f32
    %n2 = arith.mulf %two, %n : f32
    %an = math.absf %n : f32
    %one = arith.constant 1.000000e+00 : f32
    %den = arith.addf %one, %an : f32
    %t = arith.divf %n2, %den : f32
    %c127 = arith.constant 1.270000e+02 : f32
    %s = arith.mulf %t, %c127 : f32
    %half = arith.constant 5.000000e-01 : f32
    %h = arith.addf %s, %half : f32
    %f = math.floor %h : f32
    %nan = arith.cmpf uno, %f, %f : f32
    %zero = arith.constant 0.000000e+00 : f32
    %q = arith.select %nan, %zero, %f : f32
    %code = arith.fptosi %q : f32 to i8
    flashopt.store_element 2, %code : i8
    %y = math.sqrt %v : f32
    %ay = math.absf %y : f32
    %gv = flashopt.group_max %ay : f32
    %av = arith.maximumf %gv, %floor : f32
    %sc = arith.truncf %av : f32 to f16
    %nv = arith.divf %y, %av : f32
    %c255 = arith.constant 2.550000e+02 : f32
    %sv = arith.mulf %nv, %c255 : f32
    %hv = arith.addf %sv, %half : f32
    %fv = math.floor %hv : f32
    %nanv = arith.cmpf uno, %fv, %fv : f32
    %qv = arith.select %nanv, %zero, %fv : f32
    %codev = arith.fptoui %qv : f32 to i8
    flashopt.store_group 4, %sc : f16
    flashopt.store_element 3, %codev : i8
  }
}

// -----

// A linear code, and a sqrt code whose divisor is not the absmax of its
// root: left alone.
// CHECK-LABEL: flashopt.kernel @other
// CHECK-NOT: flashopt.guarded
// CHECK-NOT: rcp_approx
// CHECK-COUNT-2: arith.divf
flashopt.kernel @other group_size(32) buffers([#flashopt.buffer<"x", f32, element, read>, #flashopt.buffer<"c", i8, element, readwrite>, #flashopt.buffer<"d", ui8, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %ax = math.absf %x : f32
    %gm = flashopt.group_max %ax : f32
    %floor = arith.constant 9.99999996E-13 : f32
    %a = arith.maximumf %gm, %floor : f32
    %n = arith.divf %x, %a : f32
    %c127 = arith.constant 1.270000e+02 : f32
    %s = arith.mulf %n, %c127 : f32
    %half = arith.constant 5.000000e-01 : f32
    %h = arith.addf %s, %half : f32
    %f = math.floor %h : f32
    %nan = arith.cmpf uno, %f, %f : f32
    %zero = arith.constant 0.000000e+00 : f32
    %q = arith.select %nan, %zero, %f : f32
    %code = arith.fptosi %q : f32 to i8
    flashopt.store_element 1, %code : i8
    %y = math.sqrt %x : f32
    %nv = arith.divf %y, %a : f32
    %c255 = arith.constant 2.550000e+02 : f32
    %sv = arith.mulf %nv, %c255 : f32
    %hv = arith.addf %sv, %half : f32
    %fv = math.floor %hv : f32
    %nanv = arith.cmpf uno, %fv, %fv : f32
    %qv = arith.select %nanv, %zero, %fv : f32
    %codev = arith.fptoui %qv : f32 to i8
    flashopt.store_element 2, %codev : i8
  }
}

// -----

// The fast mode's softsign code (t = y / fma(|y|, 0.5, a * 0.5), the code
// through one fma, NUMERICS §7): the same divisor, one approximate
// reciprocal, N guarded per group (a < 2^126), the quotient and the fma in
// the fallback.
// CHECK-LABEL: flashopt.kernel @fast
// CHECK: %[[A:.*]] = arith.maximumf %{{.*}}, %{{.*}} : f32
// CHECK: %[[H:.*]] = arith.mulf %[[A]], %{{.*}} : f32
// CHECK: %[[AY:.*]] = math.absf %[[M:.*]] : f32
// CHECK: %[[D:.*]] = math.fma %[[AY]], %{{.*}}, %[[H]] : f32
// CHECK: %[[OK:.*]] = arith.cmpf olt, %[[A]], %{{.*}} : f32
// CHECK: %[[N:.*]] = arith.select %[[OK]], %{{.*}}, %{{.*}} : f32
// CHECK-DAG: %[[YN:.*]] = arith.mulf %[[M]], %[[N]] : f32
// CHECK-DAG: %[[RD:.*]] = flashopt.rcp_approx %[[D]] : f32
// CHECK: %[[Y:.*]] = arith.mulf %[[YN]], %[[RD]] : f32
// CHECK: math.roundeven %[[Y]] : f32
// CHECK: flashopt.guarded %{{.*}}, %{{.*}} {limit = 0.49987793 : f32} : i8 -> i8 {
// CHECK:   arith.divf %[[M]], %[[D]]
// CHECK:   math.fma
// CHECK:   flashopt.yield
flashopt.kernel @fast group_size(32) buffers([#flashopt.buffer<"m", f32, element, read>, #flashopt.buffer<"m.codes", i8, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %m = flashopt.load_element 0 : f32
    %am = math.absf %m : f32
    %gm = flashopt.group_max %am : f32
    %floor = arith.constant 9.99999996E-13 : f32
    %a = arith.maximumf %gm, %floor : f32
    %half = arith.constant 5.000000e-01 : f32
    %h = arith.mulf %a, %half : f32
    %ay = math.absf %m : f32
    %d = math.fma %ay, %half, %h : f32
    %t = arith.divf %m, %d : f32
    %c127 = arith.constant 1.270000e+02 : f32
    %w = math.fma %t, %c127, %half : f32
    %f = math.floor %w : f32
    %nan = arith.cmpf uno, %f, %f : f32
    %zero = arith.constant 0.000000e+00 : f32
    %q = arith.select %nan, %zero, %f : f32
    %code = arith.fptosi %q : f32 to i8
    flashopt.store_element 1, %code : i8
  }
}

// -----

// The previous fast form (n = y * (1 / a), t = 2n / (1 + |n|)) is no longer
// what flashopt-fast-arithmetic writes: left alone.
// CHECK-LABEL: flashopt.kernel @oldfast
// CHECK-NOT: flashopt.guarded
// CHECK-NOT: rcp_approx
flashopt.kernel @oldfast group_size(32) buffers([#flashopt.buffer<"m", f32, element, read>, #flashopt.buffer<"m.codes", i8, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %m = flashopt.load_element 0 : f32
    %am = math.absf %m : f32
    %gm = flashopt.group_max %am : f32
    %floor = arith.constant 9.99999996E-13 : f32
    %a = arith.maximumf %gm, %floor : f32
    %one = arith.constant 1.000000e+00 : f32
    %r = arith.divf %one, %a : f32
    %n = arith.mulf %m, %r : f32
    %two = arith.constant 2.000000e+00 : f32
    %n2 = arith.mulf %two, %n : f32
    %an = math.absf %n : f32
    %den = arith.addf %one, %an : f32
    %t = arith.divf %n2, %den : f32
    %c127 = arith.constant 1.270000e+02 : f32
    %half = arith.constant 5.000000e-01 : f32
    %h = math.fma %t, %c127, %half : f32
    %f = math.floor %h : f32
    %nan = arith.cmpf uno, %f, %f : f32
    %zero = arith.constant 0.000000e+00 : f32
    %q = arith.select %nan, %zero, %f : f32
    %code = arith.fptosi %q : f32 to i8
    flashopt.store_element 1, %code : i8
  }
}
