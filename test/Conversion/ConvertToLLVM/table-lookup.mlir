// RUN: flashopt-opt %s --flashopt-convert-to-llvm | FileCheck %s

// On the host a table read is one masked gather (every lane on) from an
// internal constant global in address space 0; a scalar code is one load.
// (The CPU pipeline does not run flashopt-decode-tables: docs/PERFORMANCE.md
// measured the gathers slower than the divisions they replace.)
// CHECK: llvm.mlir.global internal constant @__flashopt_table_{{[0-9a-f]+}}(dense<2.500000e-01> : tensor<256xf32>) {addr_space = 0 : i32, alignment = 16 : i64}
// CHECK-LABEL: llvm.func @f(
// CHECK: %[[T:.*]] = llvm.mlir.addressof @__flashopt_table_{{[0-9a-f]+}} : !llvm.ptr
// CHECK: %[[I:.*]] = llvm.zext %{{.*}} : vector<8xi8> to vector<8xi32>
// CHECK: %[[P:.*]] = llvm.getelementptr inbounds %[[T]][%[[I]]] : (!llvm.ptr, vector<8xi32>) -> vector<8x!llvm.ptr>, f32
// CHECK: llvm.intr.masked.gather %[[P]], %{{.*}}, %{{.*}} {alignment = 4 : i32} : (vector<8x!llvm.ptr>, vector<8xi1>, vector<8xf32>) -> vector<8xf32>
// CHECK: llvm.zext %{{.*}} : i8 to i32
// CHECK: llvm.load %{{.*}} invariant {alignment = 4 : i64} : !llvm.ptr -> f32
func.func @f(%v: vector<8xi8>, %k: i8) -> (vector<8xf32>, f32) {
  %a = flashopt.table_lookup %v {table = dense<0.25> : tensor<256xf32>} : vector<8xi8> -> vector<8xf32>
  %b = flashopt.table_lookup %k {table = dense<0.25> : tensor<256xf32>} : i8 -> f32
  return %a, %b : vector<8xf32>, f32
}
