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
flashopt.optimizer @quant param(#flashopt.master<f32>) grad(f32) numerics<flashoptim> {
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

// The bounded numerics (the default; docs/NUMERICS.md §8): a dither per
// element and quantized state (the step count added to the prologue when the
// rule has none), the k-th state's at phase k * 3462, in place of 0.5; a
// finite absmax saturates at the scale type's largest value; flashopt.bound
// clamps to [-limit, limit].
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
// CHECK: %[[U2:.*]] = flashopt.dither %[[STEP]] {offset = 1.000000e+00 : f32, phase = 3462 : i32} : f32
// CHECK: math.sqrt
// CHECK: flashopt.group_max
// CHECK: arith.addf %{{.*}}, %[[U2]] : f32
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

// Minifloat codes (docs/NUMERICS.md §2d). Decode: the magnitude's exponent
// and mantissa as f32 bits, subnormals (e3m4) as code * 2^-10, the sign,
// times the scale. Encode: the scale is the least power of two at least the
// absmax over 1.9375 (its bits plus 0x7FFFF, masked), within [2^-126, 2^29]
// (e3m4, bf16), and k = 2^(emax - 127 - E) from the scale's exponent field
// (7 + 127 - field, normal, or 1 << (22 + it), subnormal); the code is the
// bits of |x| * k plus the dither word's top bits (an i32 dither, phase 3462
// for the second state) shifted down to the code's place, at most top; a
// signed code takes x's sign.
// CHECK-LABEL: flashopt.kernel @minifloat
// CHECK: flashopt.group_body {
// CHECK: %[[M:.*]] = flashopt.load_element 2 : i8
// CHECK: %[[MS:.*]] = flashopt.load_group 3 : bf16
// CHECK: %[[C:.*]] = arith.extsi %[[M]] : i8 to i32
// CHECK: %[[MAG:.*]] = math.absi %[[C]] : i32
// CHECK: %[[B:.*]] = arith.addi %[[MAG]], %{{.*}} : i32
// CHECK: %[[SH:.*]] = arith.shli %[[B]], %{{.*}} : i32
// CHECK: %[[NORM:.*]] = arith.bitcast %[[SH]] : i32 to f32
// CHECK: %[[IS:.*]] = arith.cmpi sge, %[[MAG]], %{{.*}} : i32
// CHECK: %[[SF:.*]] = arith.sitofp %[[MAG]] : i32 to f32
// CHECK: %[[SUB:.*]] = arith.mulf %[[SF]], %{{.*}} : f32
// CHECK: %[[V:.*]] = arith.select %[[IS]], %[[NORM]], %[[SUB]] : f32
// CHECK: %[[NEG:.*]] = arith.cmpi slt, %[[C]], %{{.*}} : i32
// CHECK: %[[NV:.*]] = arith.negf %[[V]] : f32
// CHECK: %[[SV:.*]] = arith.select %[[NEG]], %[[NV]], %[[V]] : f32
// CHECK: %[[MSW:.*]] = arith.extf %[[MS]] : bf16 to f32
// CHECK: arith.mulf %[[SV]], %[[MSW]] : f32
// e4m4 (unsigned, zero-free): code 0 decodes as half the smallest
// subnormal, 2^-19 (the subnormals' step is 2^-18); no sign.
// CHECK: flashopt.load_element 4 : i8
// CHECK: %[[VC:.*]] = arith.extui %{{.*}} : i8 to i32
// CHECK-NOT: math.absi
// CHECK: %[[HALF:.*]] = arith.constant 1.90734863E-6 : f32
// CHECK: %[[VSUB:.*]] = arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK: %[[Z:.*]] = arith.cmpi eq, %[[VC]], %{{.*}} : i32
// CHECK: arith.select %[[Z]], %[[HALF]], %[[VSUB]] : f32
// CHECK-NOT: arith.negf
// CHECK: arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK: %[[ABS:.*]] = math.absf %[[X:.*]] : f32
// CHECK: %[[GM:.*]] = flashopt.group_max %[[ABS]] : f32
// CHECK: %[[NF:.*]] = arith.cmpf uge, %[[GM]], %{{.*}} : f32
// CHECK: %[[FM:.*]] = arith.select %[[NF]], %{{.*}}, %[[GM]] : f32
// CHECK: %[[AB:.*]] = arith.bitcast %[[FM]] : f32 to i32
// CHECK: %[[AU:.*]] = arith.addi %[[AB]], %{{.*}}524287{{.*}} : i32
// CHECK: %[[RU:.*]] = arith.andi %[[AU]], %{{.*}}-8388608{{.*}} : i32
// CHECK-DAG: %[[SMAX:.*]] = arith.constant 0x4E000000 : f32
// CHECK-DAG: %[[SMIN:.*]] = arith.constant 1.17549435E-38 : f32
// CHECK: %[[RUF:.*]] = arith.bitcast %[[RU]] : i32 to f32
// CHECK: %[[S1:.*]] = arith.maximumf %[[RUF]], %[[SMIN]] : f32
// CHECK: %[[S:.*]] = arith.minimumf %[[S1]], %[[SMAX]] : f32
// CHECK: %[[SB:.*]] = arith.bitcast %[[S]] : f32 to i32
// CHECK: %[[SFIELD:.*]] = arith.shrui %[[SB]], %{{.*}} : i32
// CHECK: %[[KF:.*]] = arith.subi %{{.*}}134{{.*}}, %[[SFIELD]] : i32
// CHECK: %[[KN:.*]] = arith.shli %[[KF]], %{{.*}} : i32
// CHECK: %[[KS:.*]] = arith.shli %{{.*}}, %{{.*}} : i32
// CHECK: %[[KB:.*]] = arith.select %{{.*}}, %[[KN]], %[[KS]] : i32
// CHECK: %[[K:.*]] = arith.bitcast %[[KB]] : i32 to f32
// CHECK: %[[ST:.*]] = arith.select %[[NF]], %[[GM]], %[[S]] : f32
// CHECK: arith.truncf %[[ST]] : f32 to bf16
// CHECK: %[[R:.*]] = arith.mulf %[[ABS]], %[[K]] : f32
// CHECK: %[[W:.*]] = flashopt.dither %[[STEP:.*]] {offset = 0.000000e+00 : f32} : i32
// CHECK: %[[ADD:.*]] = arith.shrui %[[W]], %{{.*}} : i32
// CHECK: %[[RBITS:.*]] = arith.bitcast %[[R]] : f32 to i32
// CHECK: %[[SUM:.*]] = arith.addi %[[RBITS]], %[[ADD]] : i32
// CHECK: %[[RD:.*]] = arith.shrui %[[SUM]], %{{.*}} : i32
// CHECK: %[[Q:.*]] = arith.minui %[[RD]], %{{.*}} : i32
// CHECK: %[[XNEG:.*]] = arith.cmpf olt, %[[X]], %{{.*}} : f32
// CHECK: %[[NQ:.*]] = arith.subi %{{.*}}, %[[Q]] : i32
// CHECK: %[[SQ:.*]] = arith.select %[[XNEG]], %[[NQ]], %[[Q]] : i32
// CHECK: arith.trunci %[[SQ]] : i32 to i8
// CHECK: flashopt.group_max
// e4m4's scale stops at 2^37, and k's field is 15 + 127 - the scale's.
// CHECK: arith.constant 1.37438953E+11 : f32
// CHECK: arith.constant 142 : i32
// CHECK: flashopt.dither %[[STEP]] {offset = 0.000000e+00 : f32, phase = 3462 : i32} : i32
// CHECK: %[[VQ:.*]] = arith.minui %{{.*}}, %{{.*}} : i32
// CHECK-NEXT: arith.trunci %[[VQ]] : i32 to i8
flashopt.optimizer @minifloat param(#flashopt.master<f32>) grad(f32) {
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = e3m4, scale = bf16>
  flashopt.state "v" : #flashopt.quant<ui8, group = 32, compand = e4m4, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %m: f32, %v: f32) {
    %m1 = arith.addf %m, %g : f32
    %gg = arith.mulf %g, %g : f32
    %v1 = arith.addf %v, %gg : f32
    %t1 = arith.subf %theta, %m1 : f32
    flashopt.yield %t1, %m1, %v1 : f32, f32, f32
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

// -----

// A bound the rule yields itself: lowered in the rule before inlining, in
// both numerics (the clamp in the bounded numerics, the operand itself in
// FlashOptim's).
// CHECK-LABEL: flashopt.kernel @yield_bound_clamped
// CHECK: %[[N:.*]] = arith.negf %[[L:.*]] : f32
// CHECK: %[[X:.*]] = arith.maximumf %{{.*}}, %[[N]] : f32
// CHECK: %[[C:.*]] = arith.minimumf %[[X]], %[[L]] : f32
// CHECK: flashopt.store_element 0, %{{.*}} : f32
// CHECK-NOT: flashopt.bound
flashopt.optimizer @yield_bound_clamped param(#flashopt.master<f32>) grad(f32) {
  %lim = flashopt.hyper "lim" default(1.000000e-02) : f32
  flashopt.update(%theta: f32, %g: f32) {
    %b = flashopt.bound %g, %lim : f32
    flashopt.yield %b : f32
  }
}

// -----

// CHECK-LABEL: flashopt.kernel @yield_bound_identity
// CHECK-NOT: arith.minimumf
// CHECK-NOT: flashopt.bound
// CHECK: flashopt.store_element 0
flashopt.optimizer @yield_bound_identity param(#flashopt.master<f32>) grad(f32) numerics<flashoptim> {
  %lim = flashopt.hyper "lim" default(1.000000e-02) : f32
  flashopt.update(%theta: f32, %g: f32) {
    %b = flashopt.bound %g, %lim : f32
    flashopt.yield %b : f32
  }
}
