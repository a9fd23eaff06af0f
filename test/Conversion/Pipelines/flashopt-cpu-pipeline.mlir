// RUN: flashopt-opt %flashopt_src/lib/Rules/adamw.mlir --flashopt-cpu-pipeline | FileCheck %s
// RUN: flashopt-opt %flashopt_src/lib/Rules/adamw.mlir --flashopt-expand-encodings --flashopt-to-cpu --canonicalize --cse --convert-scf-to-cf --arith-expand=include-bf16=true --flashopt-convert-to-llvm --reconcile-unrealized-casts | FileCheck %s

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
// CHECK: llvm.intr.vector.reduce.fmaximum
// CHECK: llvm.intr.masked.load
// CHECK: llvm.return
