// RUN: flashopt-opt %s --flashopt-to-gpu | FileCheck %s

// flashopt.dither on the GPU (docs/NUMERICS.md §8). With carried prologue
// values (a flashopt.powi in the prologue), the record-uniform part, element
// offset * (12367 << 18) + (H(step) << 18), is computed in the record lookup
// (once per record and lane: the step's hash x ^= x >> 16, x *= 0x21F0AAAD,
// x ^= x >> 15, x *= 0x735A2D97, x ^= x >> 15, its top 14 bits) and carried
// by the loop; a worker adds its index times 12367 << 18 and no longer reads
// the offset. Offset 0 gives 1 + u itself: no float add.
// CHECK-LABEL: gpu.func @carried(
// CHECK: scf.for {{.*}} iter_args(
// CHECK: scf.if %{{.*}} -> (
// CHECK: %[[OFFW:.*]] = arith.addi %{{.*}}, %c3 : index
// CHECK: %[[OFF:.*]] = flashopt.raw_load %{{.*}}[%[[OFFW]]] {alignment = 8 : i64} : i64
// CHECK-DAG: %[[OFF32:.*]] = arith.trunci %[[OFF]] : i64 to i32
// CHECK-DAG: %[[T32:.*]] = arith.trunci %{{.*}} : i64 to i32
// CHECK: %[[X1:.*]] = arith.shrui %[[T32]], %{{.*}} : i32
// CHECK: %[[X2:.*]] = arith.xori %[[T32]], %[[X1]] : i32
// CHECK: %[[X3:.*]] = arith.muli %[[X2]], %{{.*}}569420461{{.*}} : i32
// CHECK: arith.xori
// CHECK: arith.muli %{{.*}}, %{{.*}}1935289751{{.*}} : i32
// CHECK: %[[X6:.*]] = arith.xori
// CHECK: %[[TM:.*]] = arith.andi %[[X6]], %{{.*}}-262144{{.*}} : i32
// CHECK: %[[OM:.*]] = arith.muli %[[OFF32]], %{{.*}}-1053032448{{.*}} : i32
// CHECK: %[[BASE:.*]] = arith.addi %[[OM]], %[[TM]] : i32
// CHECK: scf.yield {{.*}}, %[[BASE]] : {{.*}}i32
// CHECK: } else {
// CHECK-NOT: %c3 : index
// CHECK: %[[FIRST:.*]] = arith.index_castui %{{.*}} : index to i32
// CHECK: %[[IM:.*]] = arith.muli %[[FIRST]], %{{.*}} : i32
// CHECK: %[[H0:.*]] = arith.addi %[[IM]], %{{[0-9]+}}#5 : i32
// CHECK: %[[HB:.*]] = vector.broadcast %[[H0]] : i32 to vector<4xi32>
// CHECK: %[[H:.*]] = arith.addi %[[HB]], %{{.*}} : vector<4xi32>
// CHECK: %[[S:.*]] = arith.shrui %[[H]], %{{.*}} : vector<4xi32>
// CHECK: %[[BITS:.*]] = arith.addi %[[S]], %{{.*}} : vector<4xi32>
// CHECK: %[[W:.*]] = arith.bitcast %[[BITS]] : vector<4xi32> to vector<4xf32>
// CHECK-NOT: arith.subf %[[W]]
// CHECK: arith.addf %{{.*}}, %[[W]] : vector<4xf32>
flashopt.kernel @carried group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>]) hypers(["beta"]) {
  %t = flashopt.step_count : i64
  %beta = flashopt.hyper "beta" : f32
  %bt = flashopt.powi %beta, %t : f32, i64
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %u = flashopt.dither %t {offset = 0.0 : f32} : f32
    %q = arith.mulf %p, %bt : f32
    %s = arith.addf %q, %u : f32
    flashopt.store_element 0, %s : f32
  }
}

// Without carried values the worker reads the offset and hashes the step
// itself, as on the CPU.
// CHECK-LABEL: gpu.func @recomputed(
// CHECK: %[[W3:.*]] = arith.addi %{{.*}}, %c3 : index
// CHECK-NEXT: %[[OFF:.*]] = flashopt.raw_load %{{.*}}[%[[W3]]] {alignment = 8 : i64} : i64
// CHECK: %[[FIRST:.*]] = arith.index_castui %{{.*}} : index to i32
// CHECK-NEXT: %[[OFF32:.*]] = arith.trunci %[[OFF]] : i64 to i32
// CHECK: arith.addi %[[FIRST]], %[[OFF32]] : i32
// CHECK: arith.subf %{{.*}}, %{{.*}} : vector<4xf32>
flashopt.kernel @recomputed group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>]) hypers([]) {
  %t = flashopt.step_count : i64
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %u = flashopt.dither %t {offset = 1.5 : f32} : f32
    %s = arith.addf %p, %u : f32
    flashopt.store_element 0, %s : f32
  }
}

// -----

// Dithers of two step operands (4-bit states' streams, docs/NUMERICS.md
// §2e: t and t + 0x9E3779B9): one carried record-uniform part per stream,
// each from its own hash of its step.
// CHECK-LABEL: gpu.func @streams(
// CHECK: scf.for {{.*}} -> (index, index, index, index, f32, i32, i32)
// CHECK: %[[T1:.*]] = arith.addi %{{.*}}, %{{.*}}2654435769{{.*}} : i64
// CHECK: arith.muli %{{.*}}, %{{.*}}1935289751{{.*}} : i32
// CHECK: arith.muli %{{.*}}, %{{.*}}1935289751{{.*}} : i32
// CHECK: scf.yield {{.*}} : index, index, index, index, f32, i32, i32
flashopt.kernel @streams group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>]) hypers(["beta"]) {
  %t = flashopt.step_count : i64
  %c = arith.constant 2654435769 : i64
  %t1 = arith.addi %t, %c : i64
  %beta = flashopt.hyper "beta" : f32
  %bt = flashopt.powi %beta, %t : f32, i64
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %u = flashopt.dither %t {offset = 0.0 : f32} : f32
    %v = flashopt.dither %t1 {offset = 0.0 : f32} : f32
    %q = arith.mulf %p, %bt : f32
    %s = arith.addf %q, %u : f32
    %w = arith.addf %s, %v : f32
    flashopt.store_element 0, %w : f32
  }
}
