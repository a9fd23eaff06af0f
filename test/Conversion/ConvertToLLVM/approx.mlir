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

// flashopt.add_round_down on the host: the nearest sum, its exact error
// (TwoSum), one step down where the error is negative, -0 for an exact zero
// sum (+0 only from two +0), the largest finite value for a finite overflow.
// CHECK-LABEL: llvm.func @down(
// CHECK: %[[S:.*]] = llvm.fadd %[[X:.*]], %[[Y:.*]] : vector<4xf32>
// CHECK: %[[BB:.*]] = llvm.fsub %[[S]], %[[X]] : vector<4xf32>
// CHECK: llvm.fcmp "olt"
// CHECK: llvm.select
// CHECK: 2139095039
// CHECK-NOT: nvvm
func.func @down(%x: vector<4xf32>, %y: vector<4xf32>) -> vector<4xf32> {
  %s = flashopt.add_round_down %x, %y : vector<4xf32>
  return %s : vector<4xf32>
}
