// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu | FileCheck %s
// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu=block-size=128 | FileCheck %s --check-prefix=B128

// bf16 parameters and light arithmetic (two divisions per element): 16
// bytes = 8 elements per thread, a group of 32 spans 4 lanes, so the group
// max is a 2-step xor butterfly (offsets 2, 1).
// CHECK: module attributes {gpu.container_module}
// CHECK: gpu.module @adam_like_gpu
// CHECK: gpu.func @adam_like(%{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64) kernel
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// CHECK: gpu.thread_id x
// CHECK: gpu.block_id x
// CHECK: gpu.grid_dim x
// Warp-uniform grid-stride loop; lanes past the end are predicated.
// CHECK: scf.for
// CHECK: arith.cmpi ult
// Binary search of the tensor table.
// CHECK: scf.while
// Each per-element access: one aligned 16-byte vector load when the thread's
// 8 elements are all valid, a masked load otherwise.
// CHECK: scf.if
// CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 16 : i64} : vector<8xbf16>
// CHECK: } else {
// CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] mask(%{{.*}} : vector<8xi1>) {alignment = 2 : i64} : vector<8xbf16>
// CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 8 : i64} : vector<8xi8>
// The thread's part of the group max, then the parameter store (phase 0),
// then the butterfly across the group's lanes.
// CHECK: vector.reduction <maxui>
// CHECK: flashopt.raw_store %{{.*}}, %{{.*}}[%{{.*}}] {alignment = 16 : i64} : vector<8xbf16>
// The absmax crosses lanes as the i32 bits of |x| (unsigned max), like the
// CPU's reduction.
// CHECK: arith.bitcast %{{.*}} : f32 to i32
// CHECK: gpu.shuffle  xor %{{.*}}, %{{.*}}, %{{.*}} : i32
// CHECK: arith.maxui
// CHECK: gpu.shuffle  xor
// CHECK: arith.maxui
// CHECK: arith.bitcast %{{.*}} : i32 to f32
// Only the group's first lane stores the scale.
// CHECK: scf.if
// CHECK: flashopt.raw_store %{{.*}}, %{{.*}}[%{{.*}}] {alignment = 2 : i64} : f16
// CHECK: flashopt.raw_store %{{.*}}, %{{.*}}[%{{.*}}] {alignment = 8 : i64} : vector<8xi8>
// CHECK: gpu.return
// B128: known_block_size = array<i32: 128, 1, 1>
flashopt.optimizer @adam_like param(#flashopt.master<bf16>) grad(bf16) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = none, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %m1 = arith.addf %m, %g : f32
    %d = arith.mulf %m1, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t, %m1 : f32, f32
  }
}
