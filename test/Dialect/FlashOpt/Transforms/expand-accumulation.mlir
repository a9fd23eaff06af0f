// RUN: flashopt-opt %s --split-input-file --flashopt-expand-encodings=kernel-kind=accumulate | FileCheck %s --check-prefix=ACC
// RUN: flashopt-opt %s --split-input-file --flashopt-expand-encodings=kernel-kind=step_accumulated | FileCheck %s --check-prefix=SACC
// RUN: flashopt-opt %s --split-input-file --flashopt-expand-encodings=kernel-kind=step_fused | FileCheck %s --check-prefix=FUSED
// RUN: flashopt-opt %s --split-input-file --flashopt-expand-encodings | FileCheck %s --check-prefix=STEP

// The kernels of an optimizer with a gradient accumulator
// (docs/KERNEL-ABI.md "Gradient accumulation"): every kernel has the
// accumulator buffers right after grad, and the pass option `kernel-kind`
// picks which one the pass makes; the kernel carries its kind.

// An f32 accumulator, the accumulate kernel: accum = accum + f32(grad), no
// prologue, no parameter access, every hyper column still listed.
// ACC-LABEL: flashopt.kernel @sgd__accumulate kind<accumulate> group_size(32)
// ACC-SAME: #flashopt.buffer<"param", bf16, element, readwrite>
// ACC-SAME: #flashopt.buffer<"grad", bf16, element, read>
// ACC-SAME: #flashopt.buffer<"accum", f32, element, readwrite>]
// ACC-SAME: hypers(["lr", "grad_scale"])
// ACC: flashopt.group_body
// ACC-NOT: flashopt.load_element 0
// ACC: %[[A:.*]] = flashopt.load_element 2 : f32
// ACC: %[[G:.*]] = flashopt.load_element 1 : bf16
// ACC: %[[GW:.*]] = arith.extf %[[G]] : bf16 to f32
// ACC: %[[S:.*]] = arith.addf %[[A]], %[[GW]] : f32
// ACC: flashopt.store_element 2, %{{.*}} : f32
// ACC-NOT: flashopt.store_element 0

// The step reading the accumulator: g = accum * grad_scale, the micro-batch
// gradient unread, the accumulator zeroed.
// SACC-LABEL: flashopt.kernel @sgd__step_accumulated kind<step_accumulated>
// SACC: %[[SCALE:.*]] = flashopt.hyper "grad_scale"
// SACC: flashopt.group_body
// SACC-NOT: flashopt.load_element 1 :
// SACC: %[[A:.*]] = flashopt.load_element 2 : f32
// SACC: %[[G:.*]] = arith.mulf %[[A]], %[[SCALE]] : f32
// SACC: flashopt.store_element 2, %{{.*}} : f32
// SACC: flashopt.store_element 0

// Without a kind, the step: it reads grad and leaves the accumulator alone.
// STEP-LABEL: flashopt.kernel @sgd group_size
// STEP: flashopt.group_body
// STEP-NOT: flashopt.load_element 2
// STEP-NOT: flashopt.store_element 2
// STEP: }
flashopt.optimizer @sgd param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<f32>) {
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
// FUSED-LABEL: flashopt.kernel @adam__step_fused kind<step_fused>
// FUSED-SAME: #flashopt.buffer<"grad", bf16, element, read>
// FUSED-SAME: #flashopt.buffer<"accum", bf16, element, readwrite>
// FUSED-SAME: #flashopt.buffer<"accum_correction", i8, element, readwrite>
// FUSED: flashopt.group_body
// FUSED-DAG: flashopt.load_element 2 : bf16
// FUSED-DAG: flashopt.load_element 3 : i8
// FUSED-DAG: flashopt.load_element 1 : bf16
// FUSED: arith.addf
// FUSED: math.copysign
// FUSED: arith.fptosi %{{.*}} : f32 to i8
// FUSED: arith.sitofp %{{.*}} : i8 to f32
// FUSED: %[[ZC:.*]] = arith.constant 0 : i8
// FUSED-DAG: flashopt.store_element 2, %{{.*}} : bf16
// FUSED-DAG: flashopt.store_element 3, %[[ZC]] : i8
flashopt.optimizer @adam param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<bf16, correction = i8>) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.update(%theta: f32, %g: f32) {
    %d = arith.mulf %g, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t : f32
  }
}

// -----

// Plain bf16: accumulate narrows the f32 sum to bf16.
// ACC-LABEL: flashopt.kernel @lion__accumulate
// ACC-SAME: #flashopt.buffer<"accum", bf16, element, readwrite>]
// ACC: %[[S:.*]] = arith.addf
// ACC: arith.truncf %[[S]] : f32 to bf16
// ACC: flashopt.store_element 2
flashopt.optimizer @lion param(#flashopt.master<bf16>) grad(bf16) accumulate(#flashopt.master<bf16>) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.update(%theta: f32, %g: f32) {
    %d = arith.mulf %g, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t : f32
  }
}
