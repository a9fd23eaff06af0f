// RUN: flashopt-opt %s --flashopt-expand-encodings --split-input-file | FileCheck %s

// f32 parameters and a plain f32 state: no decode beyond loads, the rule is
// inlined in order, the prologue stays outside the group body.
// CHECK-LABEL: flashopt.kernel @sgd_f32 group_size(32)
// CHECK-SAME: buffers([#flashopt.buffer<"param", f32, element, readwrite>, #flashopt.buffer<"grad", f32, element, read>, #flashopt.buffer<"m", f32, element, readwrite>])
// Every kernel gets the gradient's scale as its last hyper-parameter.
// CHECK-SAME: hypers(["lr", "mu", "grad_scale"])
// CHECK: %[[LR:.*]] = flashopt.hyper "lr"
// CHECK: %[[MU:.*]] = flashopt.hyper "mu"
// CHECK: %[[GS:.*]] = flashopt.hyper "grad_scale" default(1.000000e+00) : f32
// CHECK: flashopt.group_body {
// CHECK:   %[[P:.*]] = flashopt.load_element 0 : f32
// CHECK:   %[[G0:.*]] = flashopt.load_element 1 : f32
// CHECK:   %[[G:.*]] = arith.mulf %[[G0]], %[[GS]] : f32
// CHECK:   %[[M:.*]] = flashopt.load_element 2 : f32
// CHECK:   %[[MM:.*]] = arith.mulf %[[M]], %[[MU]] : f32
// CHECK:   %[[MN:.*]] = arith.addf %[[MM]], %[[G]] : f32
// CHECK:   %[[D:.*]] = arith.mulf %[[MN]], %[[LR]] : f32
// CHECK:   %[[T:.*]] = arith.subf %[[P]], %[[D]] : f32
// A stored NaN is canonical: an f32 NaN (one unordered compare) -> 0x7FFFFFFF.
// CHECK:   %[[TB:.*]] = arith.bitcast %[[T]] : f32 to i32
// CHECK:   %[[TN:.*]] = arith.cmpf uno, %[[T]], %[[T]] : f32
// CHECK:   %[[TC:.*]] = arith.select %[[TN]], %{{.*}}, %[[TB]] : i32
// CHECK:   %[[TS:.*]] = arith.bitcast %[[TC]] : i32 to f32
// CHECK:   flashopt.store_element 0, %[[TS]] : f32
// CHECK:   arith.bitcast %[[MN]] : f32 to i32
// CHECK:   flashopt.store_element 2, %{{.*}} : f32
// CHECK-NOT: flashopt.optimizer
flashopt.optimizer @sgd_f32 param(#flashopt.master<f32>) grad(f32) {
  %lr = flashopt.hyper "lr" default(1.000000e-01) : f32
  %mu = flashopt.hyper "mu" default(9.000000e-01) : f32
  flashopt.state "m" : #flashopt.plain<f32>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %mm = arith.mulf %m, %mu : f32
    %mn = arith.addf %mm, %g : f32
    %d = arith.mulf %mn, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t, %mn : f32, f32
  }
}

// -----

// bf16 + i8 correction: decode ρ/127 * 2^-8 times 2^(F' - 127) built from
// the exponent field (F' = clamp(F, 1, 254), moved to the f32 exponent's
// place), encode the residual times 2^(128 - F') (0x7F800000 - (F' << 23))
// and 2^7 N clamped to [-N, N], with RTNE narrowing and round half away from
// zero (docs/NUMERICS.md §1).
// CHECK-LABEL: flashopt.kernel @ecc
// CHECK-SAME: #flashopt.buffer<"param", bf16, element, readwrite>, #flashopt.buffer<"correction", i8, element, readwrite>, #flashopt.buffer<"grad", bf16, element, read>
// CHECK: %[[P:.*]] = flashopt.load_element 0 : bf16
// CHECK: %[[R:.*]] = flashopt.load_element 1 : i8
// CHECK: arith.extf %[[P]] : bf16 to f32
// CHECK: arith.sitofp %[[R]] : i8 to f32
// CHECK: arith.constant 1.270000e+02 : f32
// CHECK: %[[C:.*]] = arith.divf
// CHECK: %[[C8:.*]] = arith.mulf %[[C]], %{{.*}} : f32
// The field in the f32 exponent's place: the widened θ' masked.
// CHECK: %[[PW:.*]] = arith.extf %[[P]] : bf16 to f32
// CHECK: %[[PB:.*]] = arith.bitcast %[[PW]] : f32 to i32
// CHECK: arith.constant 2139095040 : i32
// CHECK: arith.andi %[[PB]], %{{.*}} : i32
// CHECK: arith.constant 8388608 : i32
// CHECK: arith.maxui
// CHECK: arith.constant 2130706432 : i32
// CHECK: arith.minui
// CHECK: %[[S:.*]] = arith.bitcast {{.*}} : i32 to f32
// CHECK: arith.mulf %[[C8]], %[[S]] : f32
// CHECK: %[[NEW:.*]] = arith.truncf %[[WIDE:.*]] : f32 to bf16
// CHECK: arith.constant 2139095040 : i32
// CHECK: arith.subi
// CHECK: arith.constant 1.625600e+04 : f32
// CHECK: arith.constant -1.270000e+02 : f32
// CHECK: arith.maximumf
// CHECK: arith.constant 1.270000e+02 : f32
// CHECK: %[[SN:.*]] = arith.minimumf
// Round half away from zero: s + copysign(0.5, s), truncated by the fptosi.
// CHECK: %[[HALF:.*]] = math.copysign %{{.*}}, %[[SN]] : f32
// CHECK: %[[PH:.*]] = arith.addf %[[SN]], %[[HALF]] : f32
// CHECK-NOT: math.floor
// CHECK: %[[UNO:.*]] = arith.cmpf uno, %[[SN]], %[[SN]] : f32
// CHECK: %[[G:.*]] = arith.select %[[UNO]], %{{.*}}, %[[PH]] : f32
// CHECK: %[[RHO:.*]] = arith.fptosi %[[G]] : f32 to i8
// A bf16 rounding is a NaN exactly when its f32 operand is: the NaN test is
// on the f32 value.
// CHECK: %[[NB:.*]] = arith.bitcast %[[NEW]] : bf16 to i16
// CHECK: %[[NN:.*]] = arith.cmpf uno, %[[WIDE]], %[[WIDE]] : f32
// CHECK: arith.select %[[NN]], %{{.*}}, %[[NB]] : i16
// CHECK: flashopt.store_element 0, %{{.*}} : bf16
// CHECK: flashopt.store_element 1, %[[RHO]] : i8
flashopt.optimizer @ecc param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
  flashopt.update(%theta: f32, %g: f32) {
    %t = arith.subf %theta, %g : f32
    flashopt.yield %t : f32
  }
}

// -----

// Companded 8-bit states in FlashOptim's numerics: softsign inverse on
// decode, group absmax via flashopt.group_max, 1e-12 floor, f16 scale,
// floor(x*N + 0.5) codes.
// CHECK-LABEL: flashopt.kernel @quant
// CHECK-SAME: #flashopt.buffer<"m.codes", i8, element, readwrite>, #flashopt.buffer<"m.scales", f16, group, readwrite>, #flashopt.buffer<"v.codes", ui8, element, readwrite>, #flashopt.buffer<"v.scales", bf16, group, readwrite>
// CHECK: %[[MC:.*]] = flashopt.load_element 2 : i8
// CHECK: %[[MS:.*]] = flashopt.load_group 3 : f16
// CHECK: arith.sitofp %[[MC]] : i8 to f32
// CHECK: arith.constant 2.000000e+00 : f32
// CHECK: %[[VC:.*]] = flashopt.load_element 4 : i8
// CHECK: %[[VS:.*]] = flashopt.load_group 5 : bf16
// CHECK: arith.uitofp %[[VC]] : i8 to f32
// CHECK: arith.constant 2.550000e+02 : f32
// CHECK: %[[ABS:.*]] = math.absf
// CHECK: %[[GM:.*]] = flashopt.group_max %[[ABS]] : f32
// CHECK: %[[A:.*]] = arith.maximumf %[[GM]], %{{.*}} : f32
// CHECK: %[[S:.*]] = arith.truncf %[[A]] : f32 to f16
// No clamp to [-127, 127]: |t| <= 1 keeps floor(t*127 + 0.5) there
// (NUMERICS §2); the floor sits next to the NaN guard.
// CHECK-NOT: arith.m{{(ax|in)}}imumf
// CHECK: %[[FL:.*]] = math.floor
// CHECK-NEXT: %[[FN:.*]] = arith.cmpf uno, %[[FL]], %[[FL]] : f32
// CHECK: %[[Q:.*]] = arith.select %[[FN]], %{{.*}}, %[[FL]] : f32
// CHECK: arith.fptosi %[[Q]] : f32 to i8
// CHECK: arith.bitcast %[[S]] : f16 to i16
// CHECK: flashopt.store_group 3, %{{.*}} : f16
// CHECK: flashopt.store_element 2
// CHECK: math.sqrt
// CHECK: flashopt.group_max
// CHECK: arith.truncf {{.*}} : f32 to bf16
// Unsigned codes of a square root (never negative): no clamp either.
// CHECK-NOT: arith.m{{(ax|in)}}imumf
// CHECK: math.floor
// CHECK: arith.fptoui {{.*}} : f32 to i8
// CHECK: flashopt.store_group 5
// CHECK: flashopt.store_element 4
flashopt.optimizer @quant param(#flashopt.master<f32>) grad(f32) attributes {flashopt.numerics = "flashoptim"} {
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
  flashopt.state "v" : #flashopt.quant<ui8, group = 32, compand = sqrt, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %m: f32, %v: f32) {
    %m1 = arith.addf %m, %g : f32
    %gg = arith.mulf %g, %g : f32
    %v1 = arith.addf %v, %gg : f32
    %b = flashopt.bound %theta, %g : f32
    flashopt.yield %b, %m1, %v1 : f32, f32, f32
  }
}

// -----

// The bounded numerics (the default; docs/NUMERICS.md §8): one dither per
// element (the step count added to the prologue when the rule has none),
// shared by the codes in place of 0.5; a finite absmax saturates at the
// scale type's largest value; flashopt.bound clamps to [-limit, limit].
// CHECK-LABEL: flashopt.kernel @bounded
// CHECK: %[[STEP:.*]] = flashopt.step_count : i64
// CHECK: flashopt.group_body {
// CHECK: %[[BN:.*]] = arith.negf %[[LIM:.*]] : f32
// CHECK: %[[BMAX:.*]] = arith.maximumf %{{.*}}, %[[BN]] : f32
// CHECK: %[[BMIN:.*]] = arith.minimumf %[[BMAX]], %[[LIM]] : f32
// CHECK: arith.bitcast %[[BMIN]] : f32 to i32
// CHECK: flashopt.store_element 0
// CHECK: %[[U:.*]] = flashopt.dither %[[STEP]] {offset = 1.000000e+00 : f32} : f32
// CHECK: %[[GM:.*]] = flashopt.group_max
// CHECK: %[[A:.*]] = arith.maximumf %[[GM]], %{{.*}} : f32
// CHECK: %[[INF:.*]] = arith.cmpf oeq, %[[A]], %{{.*}} : f32
// CHECK: %[[SAT:.*]] = arith.minimumf %[[A]], %{{.*}} : f32
// CHECK: %[[ST:.*]] = arith.select %[[INF]], %[[A]], %[[SAT]] : f32
// CHECK: arith.truncf %[[ST]] : f32 to f16
// CHECK: %[[H:.*]] = arith.addf %{{.*}}, %[[U]] : f32
// CHECK: math.floor %[[H]] : f32
// CHECK: math.sqrt
// CHECK: flashopt.group_max
// CHECK: arith.addf %{{.*}}, %[[U]] : f32
// CHECK-NOT: flashopt.dither
flashopt.optimizer @bounded param(#flashopt.master<f32>) grad(f32) {
  %lim = arith.constant 2.000000e+00 : f32
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
  flashopt.state "v" : #flashopt.quant<ui8, group = 32, compand = sqrt, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32, %v: f32) {
    %m1 = arith.addf %m, %g : f32
    %gg = arith.mulf %g, %g : f32
    %v1 = arith.addf %v, %gg : f32
    %t1 = arith.subf %theta, %m1 : f32
    %b = flashopt.bound %t1, %lim : f32
    flashopt.yield %b, %m1, %v1 : f32, f32, f32
  }
}

// -----

// An elided state reads as 0.0 and is not stored.
// CHECK-LABEL: flashopt.kernel @elided
// CHECK-SAME: buffers([#flashopt.buffer<"param", f16, element, readwrite>, #flashopt.buffer<"grad", f16, element, read>])
// CHECK: flashopt.group_body
// CHECK: arith.constant 0.000000e+00 : f32
// CHECK-NOT: flashopt.store_element 2
flashopt.optimizer @elided param(#flashopt.master<f16>) grad(f16) {
  %mu = flashopt.hyper "momentum" default(0.000000e+00) : f32
  flashopt.state "m" elidable("momentum") : #flashopt.elided
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %t = arith.subf %theta, %g : f32
    flashopt.yield %t, %m : f32, f32
  }
}

// -----

// Unsigned codes of a value that can be negative (compand none): the clamp
// at 0 stays, and only it.
// CHECK-LABEL: flashopt.kernel @unsigned_linear
// CHECK: flashopt.group_max
// CHECK: arith.maximumf
// CHECK: %[[Z:.*]] = arith.maximumf %{{.*}}, %{{.*}} : f32
// CHECK-NEXT: %[[FL:.*]] = math.floor %[[Z]] : f32
// CHECK-NOT: arith.minimumf
// CHECK: arith.fptoui {{.*}} : f32 to i8
flashopt.optimizer @unsigned_linear param(#flashopt.master<f32>) grad(f32) {
  flashopt.state "m" : #flashopt.quant<ui8, group = 32, compand = none, scale = f32>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %m1 = arith.addf %m, %g : f32
    flashopt.yield %theta, %m1 : f32, f32
  }
}
