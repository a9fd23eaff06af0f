// RUN: flashopt-opt %s --flashopt-fast-arithmetic --split-input-file --verify-diagnostics | FileCheck %s

// A division by a per-tensor scalar of the prologue: one IEEE reciprocal
// there, a multiply per element; by a constant: the same (the canonicalizer
// folds 1/N later). Per-element divisors and square roots stay IEEE
// (docs/NUMERICS.md §7).
// CHECK-LABEL: flashopt.kernel @fast
// CHECK: %[[BC:.*]] = arith.subf
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[RBC:.*]] = arith.divf %[[ONE]], %[[BC]] : f32
// CHECK: flashopt.group_body
// CHECK: %[[X:.*]] = flashopt.load_element 0 : f32
// CHECK: %[[D:.*]] = flashopt.load_element 1 : f32
// CHECK: %[[N:.*]] = arith.constant 1.270000e+02 : f32
// CHECK-NEXT: %[[ONE2:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[RN:.*]] = arith.divf %[[ONE2]], %[[N]] : f32
// CHECK: %[[U:.*]] = arith.mulf %[[X]], %[[RBC]] : f32
// CHECK: %[[V:.*]] = arith.mulf %[[X]], %[[RN]] : f32
// CHECK: %[[Q:.*]] = arith.divf %[[U]], %[[D]] : f32
// CHECK: math.sqrt %[[Q]] : f32
// The same divisor twice: one reciprocal.
// CHECK: arith.mulf %[[D]], %[[RBC]] : f32
// CHECK-NOT: arith.divf
// CHECK: flashopt.store_element
flashopt.kernel @fast group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"d", f32, element, read>]) hypers(["beta"]) attributes {flashopt.arithmetic = "fast"} {
  %beta = flashopt.hyper "beta" default(9.000000e-01) : f32
  %one = arith.constant 1.000000e+00 : f32
  %bc = arith.subf %one, %beta : f32
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %d = flashopt.load_element 1 : f32
    %n = arith.constant 1.270000e+02 : f32
    %u = arith.divf %x, %bc : f32
    %v = arith.divf %x, %n : f32
    %q = arith.divf %u, %d : f32
    %s = math.sqrt %q : f32
    %w = arith.divf %d, %bc : f32
    %a = arith.addf %s, %v : f32
    %b = arith.addf %a, %w : f32
    flashopt.store_element 0, %b : f32
  }
}

// -----

// Uniform operands only (per tensor, per group): IEEE, untouched. A group's
// absmax divides each element through one reciprocal per group.
// CHECK-LABEL: flashopt.kernel @uniform
// CHECK: %[[M:.*]] = flashopt.group_max
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[R:.*]] = arith.divf %[[ONE]], %[[M]] : f32
// CHECK: math.sqrt %[[M]] : f32
// CHECK: arith.divf %{{.*}}, %[[M]] : f32
// CHECK: arith.mulf %{{.*}}, %[[R]] : f32
flashopt.kernel @uniform group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>]) hypers([]) attributes {flashopt.arithmetic = "fast"} {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %abs = math.absf %x : f32
    %m = flashopt.group_max %abs : f32
    %s = math.sqrt %m : f32
    %k = arith.divf %s, %m : f32
    %n = arith.divf %x, %m : f32
    %o = arith.addf %n, %k : f32
    flashopt.store_element 0, %o : f32
  }
}

// -----

// Exact kernels (no attribute, or "exact") keep their IEEE operations.
// CHECK-LABEL: flashopt.kernel @exact
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK-NOT: arith.mulf
flashopt.kernel @exact group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"d", f32, element, read>]) hypers([]) attributes {flashopt.arithmetic = "exact"} {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %d = flashopt.load_element 1 : f32
    %q = arith.divf %x, %d : f32
    %c = arith.constant 3.000000e+00 : f32
    %s = arith.divf %q, %c : f32
    flashopt.store_element 0, %s : f32
  }
}

// -----

// A block argument of a region inside the body counts as per element
// (conservatively): a division by it stays IEEE.
// CHECK-LABEL: flashopt.kernel @region
// CHECK: scf.for
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK-NOT: arith.mulf
flashopt.kernel @region group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>]) hypers([]) attributes {flashopt.arithmetic = "fast"} {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %r = scf.for %i = %c0 to %c4 step %c1 iter_args(%a = %x) -> (f32) {
      %n = arith.index_cast %i : index to i32
      %d = arith.sitofp %n : i32 to f32
      %q = arith.divf %x, %d : f32
      scf.yield %q : f32
    }
    flashopt.store_element 0, %r : f32
  }
}

// -----

// expected-error @+1 {{'flashopt.arithmetic' must be "exact" or "fast", got "approximate"}}
flashopt.kernel @bad group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>]) hypers([]) attributes {flashopt.arithmetic = "approximate"} {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    flashopt.store_element 0, %x : f32
  }
}
