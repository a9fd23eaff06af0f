// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu | FileCheck %s
// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu=full-warp-path=false | FileCheck %s --check-prefix=ONE
// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu=shared-bases=false | FileCheck %s --check-prefix=OWN

// f32 streams: 4 elements per thread (one 128-bit access), a group of 32
// spans 8 lanes: a 3-step butterfly with offsets 4, 2, 1. The body twice:
// unpredicated when the whole warp holds full vectors (one warp-wide AND),
// then with a plain-or-masked choice per access; each has the butterfly.
// CHECK: %[[ALL:.*]] = gpu.subgroup_reduce  and %{{.*}} uniform : (i32) -> i32
// CHECK: %[[FULL:.*]] = arith.cmpi ne, %[[ALL]]
// CHECK: scf.if %[[FULL]] {
// CHECK-NOT: scf.if
// Each buffer's base is loaded once for the body (flashopt-to-gpu{shared-bases}):
// the parameter's store reuses the base its load read.
// CHECK: %[[THETA:.*]] = flashopt.raw_load %arg0[%{{.*}}] {alignment = 8 : i64} : i64
// CHECK-NEXT: flashopt.raw_load %[[THETA]][%{{.*}}] {alignment = 16 : i64} : vector<4xf32>
// CHECK: vector.reduction <maxui>
// CHECK: flashopt.raw_store %{{.*}}, %[[THETA]][%{{.*}}] {alignment = 16 : i64} : vector<4xf32>
// CHECK: %[[C4:.*]] = arith.constant 4 : i32
// CHECK: gpu.shuffle  xor %{{.*}}, %[[C4]]
// CHECK: %[[C2:.*]] = arith.constant 2 : i32
// CHECK: gpu.shuffle  xor %{{.*}}, %[[C2]]
// CHECK: %[[C1:.*]] = arith.constant 1 : i32
// CHECK: gpu.shuffle  xor %{{.*}}, %[[C1]]
// CHECK: } else {
// CHECK: scf.if %{{.*}} -> (vector<4xf32>) {
// CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 16 : i64} : vector<4xf32>
// CHECK: gpu.shuffle  xor
// CHECK: gpu.shuffle  xor
// CHECK: gpu.shuffle  xor
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.return
// Without shared bases (flashopt-gen's first fallback where ptxas spills):
// the store loads its base again.
// OWN: gpu.subgroup_reduce
// OWN: %[[B:.*]] = flashopt.raw_load %arg0[%[[W:.*]]] {alignment = 8 : i64} : i64
// OWN-NEXT: flashopt.raw_load %[[B]][%{{.*}}] {alignment = 16 : i64} : vector<4xf32>
// OWN: %[[B2:.*]] = flashopt.raw_load %arg0[%{{.*}}] {alignment = 8 : i64} : i64
// OWN: %[[B3:.*]] = flashopt.raw_load %arg0[%{{.*}}] {alignment = 8 : i64} : i64
// OWN: %[[B4:.*]] = flashopt.raw_load %arg0[%{{.*}}] {alignment = 8 : i64} : i64
// OWN: %[[BS:.*]] = flashopt.raw_load %arg0[%{{.*}}] {alignment = 8 : i64} : i64
// OWN-NEXT: flashopt.raw_store %{{.*}}, %[[BS]][%{{.*}}] {alignment = 16 : i64} : vector<4xf32>
// Without the full-warp copy (what flashopt-gen falls back to where ptxas
// spills with it): one body, predicated per access.
// ONE-NOT: gpu.subgroup_reduce
// ONE: scf.if %{{.*}} -> (vector<4xf32>) {
// ONE: gpu.shuffle  xor
// ONE: gpu.shuffle  xor
// ONE: gpu.shuffle  xor
// ONE-NOT: gpu.shuffle
// ONE: gpu.return
flashopt.optimizer @f32_quant param(#flashopt.master<f32>) grad(f32) {
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f32>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %m1 = arith.addf %m, %g : f32
    %t = arith.subf %theta, %m1 : f32
    flashopt.yield %t, %m1 : f32, f32
  }
}
