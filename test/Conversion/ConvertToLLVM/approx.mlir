// RUN: flashopt-opt %s --flashopt-convert-to-llvm | FileCheck %s

// On the host flashopt.rcp_approx and flashopt.sqrt_approx are the IEEE
// division and square root (they meet the ops' bounds; the CPU pipeline
// does not run flashopt-guarded-quantize, this keeps flashopt-opt total).
// CHECK-LABEL: llvm.func @f(
// CHECK: %[[ONE:.*]] = llvm.mlir.constant(dense<1.000000e+00> : vector<8xf32>) : vector<8xf32>
// CHECK: %[[R:.*]] = llvm.fdiv %[[ONE]], %{{.*}} : vector<8xf32>
// CHECK: llvm.intr.sqrt(%[[R]]) : (vector<8xf32>) -> vector<8xf32>
// CHECK: llvm.fdiv %{{.*}}, %{{.*}} : f32
func.func @f(%x: vector<8xf32>, %s: f32) -> (vector<8xf32>, f32) {
  %r = flashopt.rcp_approx %x : vector<8xf32>
  %q = flashopt.sqrt_approx %r : vector<8xf32>
  %t = flashopt.rcp_approx %s : f32
  return %q, %t : vector<8xf32>, f32
}
