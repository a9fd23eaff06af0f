// RUN: flashopt-opt %s --pass-pipeline='builtin.module(gpu.module(flashopt-convert-to-nvvm))' | FileCheck %s

// A table read: one internal constant global per distinct table in the GPU
// module (address space 1), and per lane an invariant load (PTX
// ld.global.nc) of the entry the zero-extended code selects.
// CHECK-LABEL: gpu.module @t
// CHECK: llvm.mlir.global internal constant @__flashopt_table_{{[0-9a-f]+}}(dense<{{.*}}> : tensor<256xf32>) {addr_space = 1 : i32, alignment = 16 : i64}
// CHECK-NOT: llvm.mlir.global
// CHECK: llvm.func @k(
// CHECK: llvm.mlir.addressof @__flashopt_table_{{[0-9a-f]+}} : !llvm.ptr<1>
// CHECK: llvm.zext %{{.*}} : i8 to i32
// CHECK: llvm.getelementptr inbounds %{{.*}}[%{{.*}}] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, f32
// CHECK: llvm.load %{{.*}} invariant {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK: llvm.insertelement
// CHECK-COUNT-3: llvm.load %{{.*}} invariant
module attributes {gpu.container_module} {
  gpu.module @t {
    gpu.func @k(%base: i64) kernel {
      %tid = gpu.thread_id x
      %c = flashopt.raw_load %base[%tid] {alignment = 4} : vector<4xi8>
      %v = flashopt.table_lookup %c {table = dense<0.5> : tensor<256xf32>} : vector<4xi8> -> vector<4xf32>
      %w = flashopt.table_lookup %c {table = dense<0.5> : tensor<256xf32>} : vector<4xi8> -> vector<4xf32>
      %s = arith.addf %v, %w : vector<4xf32>
      flashopt.raw_store %s, %base[%tid] {alignment = 16} : vector<4xf32>
      gpu.return
    }
  }
}
