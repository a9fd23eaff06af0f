// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-guarded-quantize | FileCheck %s

// In the bounded numerics (docs/NUMERICS.md §8) the exact codes are
// floor(t * N + u) with the dither u. The guarded chains round to nearest
// around it: one dither at offset 1.5 (u - 1/2) per element, added where the
// FlashOptim chain adds nothing (the code is the nearest integer of
// t * N + u - 1/2): inside the softsign FMA, after the sqrt's root. The
// fallback restores u (+ 1/2) and keeps the exact floor. The guard's limit
// is the same as with rounding to nearest.
// CHECK-LABEL: flashopt.kernel @bounded
// CHECK: %[[D:.*]] = flashopt.dither %step {offset = 1.500000e+00 : f32} : f32
// CHECK-NOT: flashopt.dither
// Softsign: y = fma(254 n', 1 / (1 + |n'|), u - 1/2).
// CHECK: flashopt.rcp_approx %{{.*}} : f32
// CHECK: %[[RD:.*]] = flashopt.rcp_approx %{{.*}} : f32
// CHECK: %[[N2:.*]] = arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK: %[[Y:.*]] = math.fma %[[N2]], %[[RD]], %[[D]] : f32
// CHECK: %[[F:.*]] = math.roundeven %[[Y]] : f32
// Sqrt: y = sqrt(v S) + (u - 1/2).
// CHECK: %[[ROOT:.*]] = flashopt.sqrt_approx %{{.*}} : f32
// CHECK: %[[YV:.*]] = arith.addf %[[ROOT]], %[[D]] : f32
// CHECK: math.roundeven %[[YV]] : f32
// CHECK: flashopt.guarded %{{.*}} {limit = 0.499755859 : f32} : i8, i8 -> i8, i8 {
// CHECK: %[[U1:.*]] = arith.addf %[[D]], %{{.*}} : f32
// CHECK: %[[T1:.*]] = arith.addf %{{.*}}, %[[U1]] : f32
// CHECK: math.floor %[[T1]] : f32
// CHECK: %[[U2:.*]] = arith.addf %[[D]], %{{.*}} : f32
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
