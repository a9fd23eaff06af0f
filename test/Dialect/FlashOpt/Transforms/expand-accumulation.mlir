// RUN: flashopt-opt %s --flashopt-expand-encodings --split-input-file | FileCheck %s

// The kernels of an optimizer with a gradient accumulator
// (docs/KERNEL-ABI.md "Gradient accumulation"): every kernel has the
// accumulator buffers right after grad, and `flashopt.kernel_kind` picks
// which one the pass makes.

// An f32 accumulator, the accumulate kernel: accum = accum + f32(grad), no
// prologue, no parameter access, every hyper column still listed.
// CHECK-LABEL: flashopt.kernel @sgd__accumulate group_size(32)
// CHECK-SAME: #flashopt.buffer<"param", bf16, element, readwrite>
// CHECK-SAME: #flashopt.buffer<"grad", bf16, element, read>
// CHECK-SAME: #flashopt.buffer<"accum", f32, element, readwrite>]
// CHECK-SAME: hypers(["lr", "grad_scale"])
// CHECK-SAME: flashopt.kernel_kind = "accumulate"
// CHECK: flashopt.group_body
// CHECK-NOT: flashopt.load_element 0
// CHECK: %[[A:.*]] = flashopt.load_element 2 : f32
// CHECK: %[[G:.*]] = flashopt.load_element 1 : bf16
// CHECK: %[[GW:.*]] = arith.extf %[[G]] : bf16 to f32
// CHECK: %[[S:.*]] = arith.addf %[[A]], %[[GW]] : f32
// CHECK: flashopt.store_element 2, %{{.*}} : f32
// CHECK-NOT: flashopt.store_element 0
flashopt.optimizer @sgd param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<f32>) attributes {flashopt.kernel_kind = "accumulate"} {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.update(%theta: f32, %g: f32) {
    %d = arith.mulf %g, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t : f32
  }
}

// -----

// The step reading the accumulator: g = accum * grad_scale, the micro-batch
// gradient unread, the accumulator zeroed.
// CHECK-LABEL: flashopt.kernel @sgd__step_accumulated
// CHECK-SAME: flashopt.kernel_kind = "step_accumulated"
// CHECK: %[[SCALE:.*]] = flashopt.hyper "grad_scale"
// CHECK: flashopt.group_body
// CHECK-NOT: flashopt.load_element 1 :
// CHECK: %[[A:.*]] = flashopt.load_element 2 : f32
// CHECK: %[[G:.*]] = arith.mulf %[[A]], %[[SCALE]] : f32
// CHECK: flashopt.store_element 2, %{{.*}} : f32
// CHECK: flashopt.store_element 0
flashopt.optimizer @sgd param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<f32>) attributes {flashopt.kernel_kind = "step_accumulated"} {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.update(%theta: f32, %g: f32) {
    %d = arith.mulf %g, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t : f32
  }
}

// -----

// bf16 + i8: the accumulator is decoded and encoded like a master weight;
// the fused step adds the micro-batch gradient and makes the same
// encode -> decode round trip in registers (two master-weight decodes, one
// encode: a copysign of the rounded correction), and zeroes both buffers.
// CHECK-LABEL: flashopt.kernel @adam__step_fused
// CHECK-SAME: #flashopt.buffer<"grad", bf16, element, read>
// CHECK-SAME: #flashopt.buffer<"accum", bf16, element, readwrite>
// CHECK-SAME: #flashopt.buffer<"accum_correction", i8, element, readwrite>
// CHECK-SAME: flashopt.kernel_kind = "step_fused"
// CHECK: flashopt.group_body
// CHECK-DAG: flashopt.load_element 2 : bf16
// CHECK-DAG: flashopt.load_element 3 : i8
// CHECK-DAG: flashopt.load_element 1 : bf16
// CHECK: arith.addf
// CHECK: math.copysign
// CHECK: arith.fptosi %{{.*}} : f32 to i8
// CHECK: arith.sitofp %{{.*}} : i8 to f32
// CHECK: %[[ZC:.*]] = arith.constant 0 : i8
// CHECK-DAG: flashopt.store_element 2, %{{.*}} : bf16
// CHECK-DAG: flashopt.store_element 3, %[[ZC]] : i8
flashopt.optimizer @adam param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<bf16, correction = i8>) attributes {flashopt.kernel_kind = "step_fused"} {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.update(%theta: f32, %g: f32) {
    %d = arith.mulf %g, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t : f32
  }
}

// -----

// Plain bf16: accumulate narrows the f32 sum to bf16.
// CHECK-LABEL: flashopt.kernel @lion__accumulate
// CHECK-SAME: #flashopt.buffer<"accum", bf16, element, readwrite>]
// CHECK: %[[S:.*]] = arith.addf
// CHECK: arith.truncf %[[S]] : f32 to bf16
// CHECK: flashopt.store_element 2
flashopt.optimizer @lion param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<bf16>) attributes {flashopt.kernel_kind = "accumulate"} {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.update(%theta: f32, %g: f32) {
    %d = arith.mulf %g, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t : f32
  }
}

// -----

// Without a kind, the step: it reads grad and leaves the accumulator alone.
// CHECK-LABEL: flashopt.kernel @sgd group_size
// CHECK-NOT: flashopt.kernel_kind
// CHECK: flashopt.group_body
// CHECK-NOT: flashopt.load_element 2
// CHECK-NOT: flashopt.store_element 2
// CHECK: }
flashopt.optimizer @sgd param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<f32>) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.update(%theta: f32, %g: f32) {
    %d = arith.mulf %g, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t : f32
  }
}
