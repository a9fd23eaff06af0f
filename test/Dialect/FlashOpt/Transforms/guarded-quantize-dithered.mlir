// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-guarded-quantize | FileCheck %s

// In the bounded numerics (docs/NUMERICS.md §8) the exact codes are
// floor(t * N + u) with the dither u (each state at its own phase, §8.3).
// The guarded chains add one dither at offset 0 (1 + u, no float add) per
// element and phase where the FlashOptim chain adds nothing: inside the softsign FMA, after the sqrt's root, so z = y' + 1 + u
// and the code is floor(z) - 1: the low byte of RD(z + 1.5 * 2^23 - 1)
// (0x4B3FFFFF). The guard keeps z at least delta from an integer:
// -|z - rint(z)| <= -delta. The fallback restores u ((1 + u) - 1) and keeps
// the exact floor.
// CHECK-LABEL: flashopt.kernel @bounded
// CHECK: %[[D:.*]] = flashopt.dither %step {offset = 0.000000e+00 : f32} : f32
// Softsign: z = fma(254 n', 1 / (1 + |n'|), 1 + u).
// CHECK: flashopt.rcp_approx %{{.*}} : f32
// CHECK: %[[RD:.*]] = flashopt.rcp_approx %{{.*}} : f32
// CHECK: %[[N2:.*]] = arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK: %[[Y:.*]] = math.fma %[[N2]], %[[RD]], %[[D]] : f32
// CHECK: %[[F:.*]] = math.roundeven %[[Y]] : f32
// CHECK: %[[M:.*]] = arith.constant 0x4B3FFFFF : f32
// CHECK: %[[S:.*]] = flashopt.add_round_down %[[Y]], %[[M]] : f32
// CHECK: %[[SB:.*]] = arith.bitcast %[[S]] : f32 to i32
// CHECK: %[[CM:.*]] = arith.trunci %[[SB]] : i32 to i8
// CHECK: %[[E:.*]] = arith.subf %[[Y]], %[[F]] : f32
// CHECK: %[[AE:.*]] = math.absf %[[E]] : f32
// CHECK: %[[SLM:.*]] = arith.negf %[[AE]] : f32
// Sqrt: z = sqrt(v S) + 1 + u', u' the second state's dither.
// CHECK: %[[DV:.*]] = flashopt.dither %step {offset = 0.000000e+00 : f32, phase = 3462 : i32} : f32
// CHECK-NOT: flashopt.dither
// CHECK: %[[ROOT:.*]] = flashopt.sqrt_approx %{{.*}} : f32
// CHECK: %[[YV:.*]] = arith.addf %[[ROOT]], %[[DV]] : f32
// CHECK: math.roundeven %[[YV]] : f32
// CHECK: flashopt.add_round_down %[[YV]], %{{.*}} : f32
// CHECK: %[[CV:.*]] = arith.trunci %{{.*}} : i32 to i8
// CHECK: %[[SLV:.*]] = arith.negf %{{.*}} : f32
// CHECK: %[[SL:.*]] = arith.maximumf %[[SLM]], %[[SLV]] : f32
// CHECK: flashopt.guarded %[[SL]], %[[CM]], %[[CV]] {limit = -2.44140625E-4 : f32} : i8, i8 -> i8, i8 {
// CHECK: %[[U1:.*]] = arith.subf %[[D]], %{{.*}} : f32
// CHECK: %[[T1:.*]] = arith.addf %{{.*}}, %[[U1]] : f32
// CHECK: math.floor %[[T1]] : f32
// CHECK: %[[U2:.*]] = arith.subf %[[DV]], %{{.*}} : f32
// CHECK: %[[T2:.*]] = arith.addf %{{.*}}, %[[U2]] : f32
// CHECK: math.floor %[[T2]] : f32
// CHECK: flashopt.yield
flashopt.optimizer @bounded param(#flashopt.master<f32>) grad(f32) {
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
  flashopt.state "v" : #flashopt.quant<ui8, group = 32, compand = sqrt, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32, %v: f32) {
    %m2 = arith.addf %m, %g : f32
    %g2 = arith.mulf %g, %g : f32
    %v2 = arith.addf %v, %g2 : f32
    flashopt.yield %theta, %m2, %v2 : f32, f32, f32
  }
}
