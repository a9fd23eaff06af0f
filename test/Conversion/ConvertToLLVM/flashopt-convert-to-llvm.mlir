// RUN: flashopt-opt %s --flashopt-convert-to-llvm | FileCheck %s

// Raw accesses become inttoptr + getelementptr + (masked) loads and stores
// in address space 0, with their alignment; masked loads pass zeros through.
// bf16 data moves as i16 (no bf16 vectors reach the host back end, which
// would legalize them through __truncsfbf2 calls).
// CHECK-LABEL: llvm.func @f(
// CHECK-SAME: %[[BASE:[a-z0-9]+]]: i64, %[[I:[a-z0-9]+]]: i64, %[[M:[a-z0-9]+]]: vector<8xi1>)
// CHECK: %[[P:.*]] = llvm.inttoptr %[[BASE]] : i64 to !llvm.ptr
// CHECK: %[[Q:.*]] = llvm.getelementptr inbounds %[[P]][%[[I]]] : (!llvm.ptr, i64) -> !llvm.ptr, i16
// CHECK: %[[V:.*]] = llvm.load %[[Q]] {alignment = 16 : i64} : !llvm.ptr -> vector<8xi16>
// CHECK: llvm.bitcast %[[V]] : vector<8xi16> to vector<8xbf16>
// CHECK: %[[Z:.*]] = llvm.mlir.zero : vector<8xi16>
// CHECK: llvm.intr.masked.load %{{.*}}, %[[M]], %[[Z]] {alignment = 2 : i32}
// CHECK: llvm.bitcast %{{.*}} : vector<8xbf16> to vector<8xi16>
// CHECK: llvm.intr.masked.store %{{.*}}, %{{.*}}, %[[M]] {alignment = 2 : i32}
// CHECK: llvm.getelementptr inbounds %{{.*}}[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i64
// CHECK: llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr -> i64
// CHECK: llvm.getelementptr inbounds %{{.*}}[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, f32
// CHECK: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr -> f32
func.func @f(%base: i64, %i: index, %m: vector<8xi1>) -> i64 {
  %v = flashopt.raw_load %base[%i] {alignment = 16} : vector<8xbf16>
  %w = flashopt.raw_load %base[%i] mask(%m : vector<8xi1>) {alignment = 2} : vector<8xbf16>
  flashopt.raw_store %v, %base[%i] mask(%m : vector<8xi1>) {alignment = 2} : vector<8xbf16>
  %n = flashopt.raw_load %base[%i] {alignment = 8} : i64
  %f = flashopt.raw_load %base[%i] {alignment = 4} : f32
  return %n : i64
}
