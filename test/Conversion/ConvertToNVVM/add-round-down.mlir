// RUN: flashopt-opt %s --pass-pipeline='builtin.module(gpu.module(flashopt-convert-to-nvvm))' | FileCheck %s

// flashopt.add_round_down on the GPU: one add.rm.f32 (FADD.RM) per lane.
// CHECK-LABEL: llvm.func @k(
// CHECK-COUNT-4: llvm.call_intrinsic "llvm.nvvm.add.rm.f"
// CHECK-NOT: llvm.fadd
module attributes {gpu.container_module} {
  gpu.module @t {
    gpu.func @k(%base: i64) kernel {
      %tid = gpu.thread_id x
      %x = flashopt.raw_load %base[%tid] {alignment = 16} : vector<4xf32>
      %m = arith.constant dense<0x4B3FFFFF> : vector<4xf32>
      %s = flashopt.add_round_down %x, %m : vector<4xf32>
      flashopt.raw_store %s, %base[%tid] {alignment = 16} : vector<4xf32>
      gpu.return
    }
  }
}
