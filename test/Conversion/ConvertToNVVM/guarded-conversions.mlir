// RUN: flashopt-opt %s -split-input-file --pass-pipeline='builtin.module(gpu.module(flashopt-convert-to-nvvm))' | FileCheck %s

// The encodes' NaN-guarded conversions, fptosi(select(isnan(a), 0, y)) with
// y NaN whenever a is, become one PTX cvt per element (NaN -> 0 is the
// cvt's own rule); a floor right under the guard folds into cvt.rmi.
// CHECK-LABEL: llvm.func @codes(
// CHECK-COUNT-4: llvm.call_intrinsic "llvm.nvvm.f2i.rm"({{.*}}) : (f32) -> i32
// CHECK-NOT: llvm.fptosi
// CHECK-COUNT-4: llvm.call_intrinsic "llvm.nvvm.f2ui.rm"({{.*}}) : (f32) -> i32
// CHECK-NOT: llvm.fptoui
// CHECK: llvm.call_intrinsic "llvm.nvvm.f2i.rz"({{.*}}) : (f32) -> i32
// CHECK-NEXT: llvm.trunc %{{.*}} : i32 to i16
// CHECK: llvm.return
module attributes {gpu.container_module} {
  gpu.module @m {
    llvm.func @codes(%x: vector<4xf32>, %s: f32, %p: !llvm.ptr, %q: !llvm.ptr, %r: !llvm.ptr) {
      %zero = arith.constant dense<0.0> : vector<4xf32>
      %lo = arith.constant dense<-127.0> : vector<4xf32>
      %hi = arith.constant dense<127.0> : vector<4xf32>
      %half = arith.constant dense<0.5> : vector<4xf32>
      // A signed code: floor(clamp(x + 0.5)), guarded on the floor.
      %h = arith.addf %x, %half : vector<4xf32>
      %c0 = arith.maximumf %h, %lo : vector<4xf32>
      %c1 = arith.minimumf %c0, %hi : vector<4xf32>
      %f = math.floor %c1 : vector<4xf32>
      %n = arith.cmpf uno, %f, %f : vector<4xf32>
      %g = arith.select %n, %zero, %f : vector<4xi1>, vector<4xf32>
      %code = arith.fptosi %g : vector<4xf32> to vector<4xi8>
      llvm.store %code, %p : vector<4xi8>, !llvm.ptr
      // The same value as an unsigned code.
      %u = arith.select %n, %zero, %f : vector<4xi1>, vector<4xf32>
      %ucode = arith.fptoui %u : vector<4xf32> to vector<4xi8>
      llvm.store %ucode, %q : vector<4xi8>, !llvm.ptr
      // A scalar correction: s + copysign(0.5, s), truncated.
      %sh = arith.constant 0.5 : f32
      %z = arith.constant 0.0 : f32
      %hs = math.copysign %sh, %s : f32
      %ps = arith.addf %s, %hs : f32
      %ns = arith.cmpf uno, %s, %s : f32
      %gs = arith.select %ns, %z, %ps : f32
      %rho = arith.fptosi %gs : f32 to i16
      llvm.store %rho, %r : i16, !llvm.ptr
      llvm.return
    }
  }
}

// -----

// Not a guard the cvt can replace: the guarded value need not be NaN when
// the tested one is (maxnumf drops a NaN), the guard's value is not 0, or
// the test is on another value. Each stays a select and an fptosi.
// CHECK-LABEL: llvm.func @kept(
// CHECK-NOT: llvm.call_intrinsic
// CHECK-COUNT-3: llvm.fptosi
// CHECK: llvm.return
module attributes {gpu.container_module} {
  gpu.module @m2 {
    llvm.func @kept(%x: f32, %y: f32, %p: !llvm.ptr) {
      %z = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
      %lo = arith.constant -127.0 : f32
      %m = arith.maxnumf %x, %lo : f32
      %n = arith.cmpf uno, %x, %x : f32
      %a = arith.select %n, %z, %m : f32
      %ca = arith.fptosi %a : f32 to i8
      llvm.store %ca, %p : i8, !llvm.ptr
      %b = arith.select %n, %one, %x : f32
      %cb = arith.fptosi %b : f32 to i8
      llvm.store %cb, %p : i8, !llvm.ptr
      %c = arith.select %n, %z, %y : f32
      %cc = arith.fptosi %c : f32 to i8
      llvm.store %cc, %p : i8, !llvm.ptr
      llvm.return
    }
  }
}
