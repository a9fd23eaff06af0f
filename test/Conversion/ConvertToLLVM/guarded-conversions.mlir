// RUN: flashopt-opt %s --flashopt-convert-to-llvm=x86-vector-bits=512 | FileCheck %s --check-prefix=V4
// RUN: flashopt-opt %s --flashopt-convert-to-llvm=x86-vector-bits=256 | FileCheck %s --check-prefix=V3
// RUN: flashopt-opt %s --flashopt-convert-to-llvm=x86-vector-bits=128 | FileCheck %s --check-prefix=SSE
// RUN: flashopt-opt %s --flashopt-convert-to-llvm | FileCheck %s --check-prefix=GENERIC

// The encodes' NaN-guarded conversions, fptosi(select(isnan(a), 0, y)) with
// y NaN whenever a is, as x86's cvttps2dq in register-wide slices (its NaN
// result 0x80000000 is 0 in an i8), then one truncation; AVX-512 folds a
// floor under the guard into cvtps2dq {rd-sae} (rounding argument 9).
// V4-LABEL: llvm.func @codes(
// V4-COUNT-2: llvm.call_intrinsic "llvm.x86.avx512.mask.cvtps2dq.512"
// V4: llvm.trunc %{{.*}} : vector<32xi32> to vector<32xi8>
// V4-COUNT-2: llvm.call_intrinsic "llvm.x86.avx512.mask.cvttps2dq.512"
// V4: llvm.trunc %{{.*}} : vector<32xi32> to vector<32xi8>
// V4-NOT: llvm.fptosi
// V3-LABEL: llvm.func @codes(
// V3: llvm.intr.floor
// V3-COUNT-4: llvm.call_intrinsic "llvm.x86.avx.cvtt.ps2dq.256"
// V3-NOT: llvm.fptosi
// SSE-LABEL: llvm.func @codes(
// SSE-COUNT-8: llvm.call_intrinsic "llvm.x86.sse2.cvttps2dq"
// SSE-NOT: llvm.fptosi
// Not x86 (or not told): the generic conversion and its guard.
// GENERIC-LABEL: llvm.func @codes(
// GENERIC-NOT: llvm.call_intrinsic
// GENERIC: llvm.fcmp "uno"
// GENERIC: llvm.fptosi
module {
  func.func @codes(%x: vector<32xf32>, %s: vector<32xf32>, %p: !llvm.ptr) {
    %zero = arith.constant dense<0.0> : vector<32xf32>
    %half = arith.constant dense<0.5> : vector<32xf32>
    %h = arith.addf %x, %half : vector<32xf32>
    %f = math.floor %h : vector<32xf32>
    %n = arith.cmpf uno, %f, %f : vector<32xf32>
    %g = arith.select %n, %zero, %f : vector<32xi1>, vector<32xf32>
    %code = arith.fptosi %g : vector<32xf32> to vector<32xi8>
    llvm.store %code, %p : vector<32xi8>, !llvm.ptr
    %hs = math.copysign %half, %s : vector<32xf32>
    %ps = arith.addf %s, %hs : vector<32xf32>
    %ns = arith.cmpf uno, %s, %s : vector<32xf32>
    %gs = arith.select %ns, %zero, %ps : vector<32xi1>, vector<32xf32>
    %rho = arith.fptosi %gs : vector<32xf32> to vector<32xi8>
    llvm.store %rho, %p : vector<32xi8>, !llvm.ptr
    return
  }
}

// Three 512-bit slices (six of 256, twelve of 128) do not concatenate
// pairwise: the generic lowering.
// V4-LABEL: llvm.func @odd(
// V4-NOT: llvm.call_intrinsic
// V4: llvm.fptosi
// V3-LABEL: llvm.func @odd(
// V3-NOT: llvm.call_intrinsic
// V3: llvm.fptosi
// SSE-LABEL: llvm.func @odd(
// SSE-NOT: llvm.call_intrinsic
// SSE: llvm.fptosi
module {
  func.func @odd(%x: vector<48xf32>, %p: !llvm.ptr) {
    %zero = arith.constant dense<0.0> : vector<48xf32>
    %n = arith.cmpf uno, %x, %x : vector<48xf32>
    %g = arith.select %n, %zero, %x : vector<48xi1>, vector<48xf32>
    %code = arith.fptosi %g : vector<48xf32> to vector<48xi8>
    llvm.store %code, %p : vector<48xi8>, !llvm.ptr
    return
  }
}
