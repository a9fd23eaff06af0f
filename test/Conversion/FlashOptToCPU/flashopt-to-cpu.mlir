// RUN: flashopt-opt %s --flashopt-to-cpu | FileCheck %s

// The kernel ABI: six i64 arguments (table, ntensors, hypers, step,
// group_begin, group_end); a loop over the tensor table, the prologue once
// per tensor, one vector<32 x T> per group, masked accesses only for the
// partial last group.
// CHECK-LABEL: func.func @k(
// CHECK-SAME: %[[TABLE:[a-z0-9]+]]: i64, %[[NT:[a-z0-9]+]]: i64, %[[HYP:[a-z0-9]+]]: i64, %[[STEP:[a-z0-9]+]]: i64, %[[GB:[a-z0-9]+]]: i64, %[[GE:[a-z0-9]+]]: i64)
// CHECK: scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step
// CHECK:   %[[REC:.*]] = arith.muli %[[T]], %c6
// CHECK:   %[[NUMEL:.*]] = flashopt.raw_load %[[TABLE]][%{{.*}}] {alignment = 8 : i64} : i64
// CHECK:   arith.maxsi %[[GB]]
// CHECK:   arith.minsi %[[GE]]
// CHECK:   scf.if
// CHECK:     %[[LR:.*]] = flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 4 : i64} : f32
// flashopt.powi once per tensor, in the prologue: double-double squaring in
// f64, one narrowing to f32 (docs/NUMERICS.md §3), never in the group loop.
// CHECK:     arith.extf %{{.*}} : f32 to f64
// CHECK:     scf.while
// CHECK:     arith.truncf %{{.*}} : f64 to f32
// CHECK-NOT: f64
// CHECK:     scf.for %[[G:.*]] =
// CHECK-NOT: f64
// CHECK:       %[[E:.*]] = arith.muli %[[G]], %c32
// CHECK:       scf.if
// CHECK:         flashopt.raw_load %{{.*}}[%[[E]]] {alignment = 4 : i64} : vector<32xf32>
// CHECK:         flashopt.raw_load %{{.*}}[%[[G]]] {alignment = 2 : i64} : f16
// The absmax of non-negative floats: an unsigned max of their bits.
// CHECK:         %[[BITS:.*]] = arith.bitcast %{{.*}} : vector<32xf32> to vector<32xi32>
// CHECK:         %[[MAX:.*]] = vector.reduction <maxui>, %[[BITS]] : vector<32xi32> into i32
// CHECK:         arith.bitcast %[[MAX]] : i32 to f32
// CHECK:         flashopt.raw_store %{{.*}}, %{{.*}}[%[[E]]] {alignment = 4 : i64} : vector<32xf32>
// CHECK:         flashopt.raw_store %{{.*}}, %{{.*}}[%[[G]]] {alignment = 2 : i64} : f16
// CHECK:       } else {
// CHECK:         %[[MASK:.*]] = arith.cmpi slt
// CHECK:         flashopt.raw_load %{{.*}}[%[[E]]] mask(%[[MASK]] : vector<32xi1>) {alignment = 4 : i64} : vector<32xf32>
// Lanes past the end read as +0.0 (never above an absolute value).
// CHECK:         arith.select %{{.*}}, %{{.*}}, %[[ZERO:.*]] : vector<32xi1>, vector<32xf32>
// CHECK:         vector.reduction <maxui>
// CHECK:         flashopt.raw_store %{{.*}}, %{{.*}}[%[[E]]] mask(%{{.*}} : vector<32xi1>)
// CHECK:         flashopt.raw_store %{{.*}}, %{{.*}}[%[[G]]] {alignment = 2 : i64} : f16
// CHECK: return
flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>, #flashopt.buffer<"s", f16, group, readwrite>]) hypers(["lr", "beta"]) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  %beta = flashopt.hyper "beta" default(9.000000e-01) : f32
  %t = flashopt.step_count : i64
  %b = flashopt.powi %beta, %t : f32, i64
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %s = flashopt.load_group 1 : f16
    %sf = arith.extf %s : f16 to f32
    %x = arith.mulf %p, %sf : f32
    %y = arith.mulf %x, %b : f32
    %a = math.absf %y : f32
    %m = flashopt.group_max %a : f32
    %mh = arith.truncf %m : f32 to f16
    flashopt.store_group 1, %mh : f16
    %z = arith.subf %y, %lr : f32
    flashopt.store_element 0, %z : f32
  }
}

// A group maximum of values that may be negative keeps the NaN-propagating
// float reduction, with -inf in the lanes past the end.
// CHECK-LABEL: func.func @signed_max(
// CHECK:         vector.reduction <maximumf>
// CHECK:       } else {
// CHECK:         arith.select %{{.*}}, %{{.*}}, %{{.*}} : vector<32xi1>, vector<32xf32>
// CHECK:         vector.reduction <maximumf>
flashopt.kernel @signed_max group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>, #flashopt.buffer<"s", f32, group, readwrite>]) hypers([]) {
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %m = flashopt.group_max %p : f32
    flashopt.store_group 1, %m : f32
    flashopt.store_element 0, %p : f32
  }
}
