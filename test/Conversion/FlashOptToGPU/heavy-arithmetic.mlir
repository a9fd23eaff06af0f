// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu | FileCheck %s
// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu=bytes-per-thread=16 | FileCheck %s --check-prefix=WIDE
// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu="wide-budget=72 wide-registers=96" | FileCheck %s --check-prefix=WIDEREG
// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu="wide-budget=8 wide-registers=96" | FileCheck %s
// RUN: flashopt-opt %s --flashopt-expand-encodings --flashopt-to-gpu="wide-budget=72 wide-registers=96" | flashopt-opt --pass-pipeline='builtin.module(gpu.module(flashopt-convert-to-nvvm))' | FileCheck %s --check-prefix=NVVM

// A bf16 master weight with an i8 correction and a softsign state needs five
// IEEE divisions per element; eight elements of them in flight would need
// more than 64 registers, so each thread takes 4 elements (8-byte accesses
// of the bf16 streams); a group of 32 then spans 8 lanes (offsets 4, 2, 1).
// (The body twice, flashopt-to-gpu{full-warp-path}: each has the butterfly.)
// CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 8 : i64} : vector<4xbf16>
// CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 4 : i64} : vector<4xi8>
// CHECK: gpu.shuffle  xor
// CHECK: gpu.shuffle  xor
// CHECK: gpu.shuffle  xor
// CHECK: } else {
// CHECK: gpu.shuffle  xor
// CHECK: gpu.shuffle  xor
// CHECK: gpu.shuffle  xor
// CHECK-NOT: gpu.shuffle
// CHECK-NOT: flashopt.max_registers
// The width can be forced.
// WIDE: flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 16 : i64} : vector<8xbf16>
// With a wide budget the divisions fit (flashopt-gpu-pipeline: 72 at 96
// registers): 8 elements per thread and a register cap of the kernel's own,
// which flashopt-convert-to-nvvm turns into the kernel's maxnreg.
// WIDEREG: gpu.func @heavy
// WIDEREG-SAME: flashopt.max_registers = 96 : i32
// WIDEREG: flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 16 : i64} : vector<8xbf16>
// NVVM: llvm.func @heavy
// NVVM-SAME: nvvm.maxnreg = 96 : i32
// The full-warp test: one redux.sync (sm_80+).
// NVVM: nvvm.redux.sync and %{{.*}}, %{{.*}} : i32 -> i32
// NVVM-NOT: flashopt.max_registers
flashopt.optimizer @heavy param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.state "m" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %m1 = arith.addf %m, %g : f32
    %d = arith.mulf %m1, %lr : f32
    %t = arith.subf %theta, %d : f32
    flashopt.yield %t, %m1 : f32, f32
  }
}
