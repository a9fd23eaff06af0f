// RUN: flashopt-opt %s --flashopt-to-cpu=interleave=2 --canonicalize | FileCheck %s
// RUN: not flashopt-opt %s --flashopt-to-cpu=interleave=0 2>&1 | FileCheck %s --check-prefix=BAD

// BAD: error: flashopt-to-cpu: interleave must be >= 1, got 0

// interleave=2: runs of two full groups per iteration of a first loop, their
// bodies interleaved operation by operation (each operation for group g,
// then for g+1), then the one-group loop (full or masked) for the rest.
// CHECK-LABEL: func.func @k(
// CHECK:   scf.if
// CHECK:     %[[NUMEL:.*]] = arith.index_cast %{{.*}} : i64 to index
// CHECK:     %[[LO:.*]] = arith.index_cast %{{.*}} : i64 to index
// CHECK:     %[[HI:.*]] = arith.index_cast %{{.*}} : i64 to index
// Full groups of the tensor, capped by this worker's range.
// CHECK:     %[[FULL:.*]] = arith.divui %[[NUMEL]], %c32
// CHECK:     %[[HIFULL:.*]] = arith.minsi %[[HI]], %[[FULL]]
// CHECK:     %[[SPAN:.*]] = arith.subi %[[HIFULL]], %[[LO]]
// CHECK:     %[[POS:.*]] = arith.maxsi %[[SPAN]], %c0
// CHECK:     %[[RUNS:.*]] = arith.divui %[[POS]], %c2
// CHECK:     %[[LEN:.*]] = arith.muli %[[RUNS]], %c2
// CHECK:     %[[END:.*]] = arith.addi %[[LO]], %[[LEN]]
// CHECK:     scf.for %[[G:.*]] = %[[LO]] to %[[END]] step %c2 {
// CHECK:       %[[E0:.*]] = arith.muli %[[G]], %c32
// CHECK:       %[[G1:.*]] = arith.addi %[[G]], %c1
// CHECK:       %[[E1:.*]] = arith.muli %[[G1]], %c32
// CHECK:       %[[P0:.*]] = flashopt.raw_load %{{.*}}[%[[E0]]] {alignment = 4 : i64} : vector<32xf32>
// CHECK:       %[[P1:.*]] = flashopt.raw_load %{{.*}}[%[[E1]]] {alignment = 4 : i64} : vector<32xf32>
// CHECK:       flashopt.raw_load %{{.*}}[%[[G]]] {alignment = 2 : i64} : f16
// CHECK:       flashopt.raw_load %{{.*}}[%[[G1]]] {alignment = 2 : i64} : f16
// CHECK:       arith.mulf %[[P0]]
// CHECK:       arith.mulf %[[P1]]
// CHECK:       vector.reduction <maxui>
// CHECK:       vector.reduction <maxui>
// No masks: every group of a run is full.
// CHECK-NOT:   mask
// CHECK:       flashopt.raw_store %{{.*}}, %{{.*}}[%[[E0]]] {alignment = 4 : i64} : vector<32xf32>
// CHECK:       flashopt.raw_store %{{.*}}, %{{.*}}[%[[E1]]] {alignment = 4 : i64} : vector<32xf32>
// CHECK:       flashopt.raw_store %{{.*}}, %{{.*}}[%[[G]]] {alignment = 2 : i64} : f16
// CHECK:       flashopt.raw_store %{{.*}}, %{{.*}}[%[[G1]]] {alignment = 2 : i64} : f16
// CHECK:     }
// The rest: one group per iteration, full or masked.
// CHECK:     scf.for %[[H:.*]] = %[[END]] to %[[HI]] step %c1 {
// CHECK:       %[[E:.*]] = arith.muli %[[H]], %c32
// CHECK:       scf.if
// CHECK:         flashopt.raw_load %{{.*}}[%[[E]]] {alignment = 4 : i64} : vector<32xf32>
// CHECK:       } else {
// CHECK:         flashopt.raw_load %{{.*}}[%[[E]]] mask(%{{.*}} : vector<32xi1>)
// CHECK: return
flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>, #flashopt.buffer<"s", f16, group, readwrite>]) hypers(["lr"]) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %s = flashopt.load_group 1 : f16
    %sf = arith.extf %s : f16 to f32
    %x = arith.mulf %p, %sf : f32
    %a = math.absf %x : f32
    %m = flashopt.group_max %a : f32
    %mh = arith.truncf %m : f32 to f16
    flashopt.store_group 1, %mh : f16
    %z = arith.subf %x, %lr : f32
    flashopt.store_element 0, %z : f32
  }
}
