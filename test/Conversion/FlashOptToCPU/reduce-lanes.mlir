// RUN: flashopt-opt %s --flashopt-to-cpu="interleave=4 reduce-lanes=16" --canonicalize | FileCheck %s
// RUN: flashopt-opt %s --flashopt-to-cpu="interleave=4" --canonicalize | FileCheck %s --check-prefix=PERGROUP
// RUN: not flashopt-opt %s --flashopt-to-cpu="interleave=4 reduce-lanes=12" 2>&1 | FileCheck %s --check-prefix=BAD

// BAD: error: flashopt-to-cpu: reduce-lanes must be 0 or a power of two, got 12

// reduce-lanes=16: the absmaxes of a run's four groups (32 lanes each) are
// one transposed reduction of their bits. Merge (a, b) and (c, d): the lower
// halves of both against the upper halves; then the two results, segments
// of 8; then fold 32 lanes to 16 (segments of 4); then a butterfly within
// each segment. Group g's maximum is lane 4g.
// CHECK-LABEL: func.func @k(
// CHECK:     scf.for
// CHECK:       %[[A:.*]] = arith.bitcast %{{.*}} : vector<32xf32> to vector<32xi32>
// CHECK:       %[[B:.*]] = arith.bitcast %{{.*}} : vector<32xf32> to vector<32xi32>
// CHECK:       %[[C:.*]] = arith.bitcast %{{.*}} : vector<32xf32> to vector<32xi32>
// CHECK:       %[[D:.*]] = arith.bitcast %{{.*}} : vector<32xf32> to vector<32xi32>
// CHECK-DAG:   %[[ABLO:.*]] = vector.shuffle %[[A]], %[[B]] [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47]
// CHECK-DAG:   %[[ABHI:.*]] = vector.shuffle %[[A]], %[[B]] [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
// CHECK:       %[[AB:.*]] = arith.maxui %[[ABLO]], %[[ABHI]] : vector<32xi32>
// CHECK-DAG:   %[[CDLO:.*]] = vector.shuffle %[[C]], %[[D]] [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 32,
// CHECK-DAG:   %[[CDHI:.*]] = vector.shuffle %[[C]], %[[D]] [16,
// CHECK:       %[[CD:.*]] = arith.maxui %[[CDLO]], %[[CDHI]] : vector<32xi32>
// CHECK-DAG:   %[[LO:.*]] = vector.shuffle %[[AB]], %[[CD]] [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55]
// CHECK-DAG:   %[[HI:.*]] = vector.shuffle %[[AB]], %[[CD]] [8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, 40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63]
// CHECK:       %[[ABCD:.*]] = arith.maxui %[[LO]], %[[HI]] : vector<32xi32>
// CHECK-DAG:   %[[FLO:.*]] = vector.shuffle %[[ABCD]], %[[ABCD]] [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27]
// CHECK-DAG:   %[[FHI:.*]] = vector.shuffle %[[ABCD]], %[[ABCD]] [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31]
// CHECK:       %[[F:.*]] = arith.maxui %[[FLO]], %[[FHI]] : vector<16xi32>
// CHECK:       %[[S2:.*]] = vector.shuffle %[[F]], %[[F]] [2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13]
// CHECK:       %[[M2:.*]] = arith.maxui %[[F]], %[[S2]] : vector<16xi32>
// CHECK:       %[[S1:.*]] = vector.shuffle %[[M2]], %[[M2]] [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14]
// CHECK:       %[[M1:.*]] = arith.maxui %[[M2]], %[[S1]] : vector<16xi32>
// CHECK-DAG:   vector.extract %[[M1]][0] : i32 from vector<16xi32>
// CHECK-DAG:   vector.extract %[[M1]][4] : i32 from vector<16xi32>
// CHECK-DAG:   vector.extract %[[M1]][8] : i32 from vector<16xi32>
// CHECK-DAG:   vector.extract %[[M1]][12] : i32 from vector<16xi32>
// A maximum that is not of absolute values (NaN-propagating float order)
// keeps one reduction per group.
// CHECK-COUNT-4: vector.reduction <maximumf>
// CHECK-NOT:   vector.reduction <maxui>
// CHECK:     }
// The one-group loop after the runs: one reduction per group, as before.
// CHECK:     scf.for
// CHECK:       vector.reduction <maxui>

// PERGROUP-LABEL: func.func @k(
// PERGROUP:     scf.for
// PERGROUP-COUNT-4: vector.reduction <maxui>
// PERGROUP-NOT: vector.shuffle
flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>, #flashopt.buffer<"s", f16, group, readwrite>, #flashopt.buffer<"t", f32, group, readwrite>]) hypers(["lr"]) {
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
    %n = flashopt.group_max %x : f32
    flashopt.store_group 2, %n : f32
    %z = arith.subf %x, %lr : f32
    flashopt.store_element 0, %z : f32
  }
}
