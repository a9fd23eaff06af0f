// RUN: flashopt-opt %flashopt_src/lib/Rules/adamw.mlir '--flashopt-gpu-pipeline=chip=sm_90' | FileCheck %s
// RUN: flashopt-opt %flashopt_src/lib/Rules/adamw.mlir '--flashopt-gpu-pipeline=chip=sm_80' | FileCheck %s --check-prefix=SM80

// The GPU pipeline attaches the NVVM target and leaves an LLVM/NVVM-dialect
// kernel with IEEE arithmetic and no libdevice calls.
// CHECK: gpu.module @adamw_gpu [#nvvm.target<O = 3, chip = "sm_90">]
// CHECK: llvm.func @adamw(
// CHECK-SAME: nvvm.kernel
// AdamW's divisions over the 64-register budget: 8 lanes at its own cap
// (the Adam family always takes the wide cap, 104).
// CHECK-SAME: nvvm.maxnreg = 104 : i32
// CHECK-SAME: nvvm.maxntid = array<i32: 256, 1, 1>
// CHECK-NOT: __nv_
// CHECK: llvm.intr.sqrt
// CHECK: nvvm.shfl.sync  bfly
// CHECK-NOT: __nv_
// SM80: #nvvm.target<O = 3, chip = "sm_80">
