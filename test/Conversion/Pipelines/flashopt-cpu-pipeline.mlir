// RUN: flashopt-opt %flashopt_src/lib/Rules/adamw.mlir --flashopt-cpu-pipeline | FileCheck %s
// RUN: flashopt-opt %flashopt_src/lib/Rules/adamw.mlir --flashopt-expand-encodings --flashopt-exact-int-division --flashopt-to-cpu --canonicalize --cse --convert-scf-to-cf --arith-expand=include-bf16=true --flashopt-convert-to-llvm --reconcile-unrealized-casts | FileCheck %s
// RUN: flashopt-gen %flashopt_src/specs/adamw_bf16_m24.json --emit=mlir | flashopt-opt --flashopt-cpu-pipeline | FileCheck %s --check-prefix=FMA
// RUN: flashopt-gen %flashopt_src/specs/adamw_bf16_m24.json --emit=mlir | flashopt-opt '--flashopt-cpu-pipeline=fma=false' | FileCheck %s --check-prefix=NOFMA

// With fma (the default, as flashopt-gen runs it for x86-64-v3) the code
// and correction dequantizations divide through flashopt-exact-int-division's
// exact fma sequence; without (the x86-64 baseline) no fma appears.
// FMA: llvm.intr.fma
// NOFMA-NOT: llvm.intr.fma

// The named pipeline is exactly the passes in sequence, and it leaves only
// the LLVM dialect: a C-ABI function of six i64 arguments, no bf16
// arithmetic (expanded to integer code on the host), IEEE ops only.
// CHECK-LABEL: llvm.func @adamw(
// CHECK-SAME: %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64)
// CHECK-NOT: flashopt.
// CHECK-NOT: arith.
// CHECK-NOT: scf.
// CHECK-NOT: fastmath
// CHECK: llvm.intr.sqrt
// CHECK: llvm.intr.vector.reduce.umax
// CHECK: llvm.intr.masked.load
// CHECK: llvm.return
