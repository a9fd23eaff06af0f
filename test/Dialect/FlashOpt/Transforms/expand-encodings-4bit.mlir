// RUN: flashopt-opt %s --flashopt-expand-encodings | FileCheck %s
// RUN: flashopt-opt %s '--flashopt-expand-encodings=subnormal-free-codes=true' | FileCheck %s --check-prefix=SF

// 4-bit states (docs/NUMERICS.md §2e): packed i4/ui4 buffers accessed as i8
// (the raw nibble loaded, 0..15, which a signed decode sign-extends from bit
// 3 itself; the stored code's low 4 bits kept), each state's dither its own
// stream, the hash of t + k * 0x9E3779B9 at phase 0, where 8-bit states
// share H(t) at phases 3462 apart.
// CHECK-LABEL: flashopt.kernel @four_bit
// CHECK-SAME: #flashopt.buffer<"m.codes", i4, element, readwrite>
// CHECK-SAME: #flashopt.buffer<"m.scales", bf16, group, readwrite>
// CHECK-SAME: #flashopt.buffer<"v.codes", ui4, element, readwrite>
// CHECK: %[[STEP:.*]] = flashopt.step_count : i64
// CHECK: %[[C:.*]] = arith.constant 2654435769 : i64
// CHECK: %[[STEP1:.*]] = arith.addi %[[STEP]], %[[C]] : i64
// CHECK: flashopt.group_body
// CHECK: %[[MC:.*]] = flashopt.load_element 2 : i8
// CHECK: %[[MZ:.*]] = arith.extui %[[MC]] : i8 to i32
// CHECK: %[[MS:.*]] = arith.shli %[[MZ]], %{{.*}} : i32
// CHECK: arith.shrsi %[[MS]], %{{.*}} : i32
// CHECK: %[[VC:.*]] = flashopt.load_element 4 : i8
// CHECK: arith.extui %[[VC]] : i8 to i32
// e2m1: a sign and 3 bits, the top magnitude code 7.
// CHECK: flashopt.dither %[[STEP]] {offset = 0.000000e+00 : f32} : i32
// CHECK: arith.minui %{{.*}}, %{{.*}}7{{.*}} : i32
// CHECK: %[[MQ:.*]] = arith.trunci %{{.*}} : i32 to i8
// CHECK: flashopt.store_element 2, %[[MQ]] : i8
// e3m1: 4 bits, top code 15; the second state's own stream, phase 0.
// CHECK: flashopt.dither %[[STEP1]] {offset = 0.000000e+00 : f32} : i32
// CHECK: arith.minui %{{.*}}, %{{.*}}15{{.*}} : i32
// CHECK: %[[VQ:.*]] = arith.trunci %{{.*}} : i32 to i8
// CHECK: flashopt.store_element 4, %[[VQ]] : i8
flashopt.optimizer @four_bit param(#flashopt.master<f32>) grad(f32) {
  flashopt.state "m" : #flashopt.quant<i4, group = 32, compand = e2m1, scale = bf16>
  flashopt.state "v" : #flashopt.quant<ui4, group = 32, compand = e3m1, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %m: f32, %v: f32) {
    %m1 = arith.addf %m, %g : f32
    %gg = arith.mulf %g, %g : f32
    %v1 = arith.addf %v, %gg : f32
    %t1 = arith.subf %theta, %m1 : f32
    flashopt.yield %t1, %m1, %v1 : f32, f32, f32
  }
}

// subnormal-free-codes (the CPU pipeline): r' = |x| * k * 2^24, exact and
// normal (k * 2^24 from the exponent field plus 24), gives the normal codes'
// bits less 24 << 23; below 2^-102 (r an f32 subnormal) the bits are
// r' * 2^125 rounded to an integer by + 2^23 - 2^23 (capped at 2^23 first):
// the same bits as the product |x| * k, without producing a subnormal.
// SF-LABEL: flashopt.kernel @four_bit
// SF: %[[KF:.*]] = arith.addi %{{.*}}, %c24_i32 : i32
// SF: %[[KB:.*]] = arith.shli %[[KF]], %{{.*}} : i32
// SF: %[[KP:.*]] = arith.bitcast %[[KB]] : i32 to f32
// SF: %[[RP:.*]] = arith.mulf %{{.*}}, %[[KP]] : f32
// SF: %[[RB:.*]] = arith.bitcast %[[RP]] : f32 to i32
// SF: %[[NB:.*]] = arith.subi %[[RB]], %{{.*}}201326592{{.*}} : i32
// SF: %[[T:.*]] = arith.mulf %[[RP]], %{{.*}} : f32
// SF: %[[TC:.*]] = arith.minnumf %[[T]], %{{.*}} : f32
// SF: %[[A:.*]] = arith.addf %[[TC]], %[[MAGIC:.*]] : f32
// SF: %[[RT:.*]] = arith.subf %[[A]], %[[MAGIC]] : f32
// SF: %[[SB:.*]] = arith.fptoui %[[RT]] : f32 to i32
// SF: %[[LIM:.*]] = arith.constant 1.97215226E-31 : f32
// SF: %[[SUB:.*]] = arith.cmpf olt, %[[RP]], %[[LIM]] : f32
// SF: arith.select %[[SUB]], %[[SB]], %[[NB]] : i32
// SF: flashopt.dither
