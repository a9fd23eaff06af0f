// RUN: flashopt-opt %s --flashopt-exact-int-division --split-input-file | FileCheck %s

// Dequantizing a signed 8-bit code: k / 127 becomes a multiply by RN(1/127)
// and one residual correction; the pass proved it for all 256 codes.
// CHECK-LABEL: func.func @i8_code
// CHECK: %[[X:.*]] = arith.sitofp %{{.*}} : i8 to f32
// CHECK-DAG: %[[C:.*]] = arith.constant 1.270000e+02 : f32
// CHECK-DAG: %[[R:.*]] = arith.constant 0.00787401571 : f32
// CHECK: %[[Q0:.*]] = arith.mulf %[[X]], %[[R]] : f32
// CHECK: %[[N:.*]] = arith.negf %[[Q0]] : f32
// CHECK: %[[E:.*]] = math.fma %[[N]], %[[C]], %[[X]] : f32
// CHECK: %[[Q:.*]] = math.fma %[[E]], %[[R]], %[[Q0]] : f32
// CHECK-NOT: arith.divf
// CHECK: return %[[Q]]
func.func @i8_code(%k: i8) -> f32 {
  %x = arith.sitofp %k : i8 to f32
  %c = arith.constant 127.0 : f32
  %q = arith.divf %x, %c : f32
  return %q : f32
}

// -----

// Unsigned codes (0..255) and 16-bit correction terms (all 65536 values).
// CHECK-LABEL: func.func @ui8_and_i16
// CHECK-NOT: arith.divf
// CHECK-COUNT-4: math.fma
// CHECK-NOT: arith.divf
func.func @ui8_and_i16(%k: i8, %rho: i16) -> (f32, f32) {
  %x = arith.uitofp %k : i8 to f32
  %c = arith.constant 255.0 : f32
  %q = arith.divf %x, %c : f32
  %y = arith.sitofp %rho : i16 to f32
  %n = arith.constant 32767.0 : f32
  %c2 = arith.divf %y, %n : f32
  return %q, %c2 : f32, f32
}

// -----

// Left alone: a numerator that is not a small integer, a 32-bit integer
// (too many values to prove), a divisor that is not a constant, and a
// divisor whose reciprocal is subnormal (1/3e38: it would depend on FTZ),
// and one where the proof fails (1e-37: k * 1e37 overflows for large k).
// CHECK-LABEL: func.func @untouched
// CHECK-NOT: math.fma
// CHECK-COUNT-5: arith.divf
// CHECK-NOT: math.fma
func.func @untouched(%f: f32, %w: i32, %k: i8, %d: f32, %h: i16) -> (f32, f32, f32, f32, f32) {
  %c = arith.constant 127.0 : f32
  %a = arith.divf %f, %c : f32
  %wx = arith.sitofp %w : i32 to f32
  %b = arith.divf %wx, %c : f32
  %kx = arith.sitofp %k : i8 to f32
  %e = arith.divf %kx, %d : f32
  %big = arith.constant 3.0e38 : f32
  %g = arith.divf %kx, %big : f32
  %hx = arith.sitofp %h : i16 to f32
  %tiny = arith.constant 1.0e-37 : f32
  %t = arith.divf %hx, %tiny : f32
  return %a, %b, %e, %g, %t : f32, f32, f32, f32, f32
}
