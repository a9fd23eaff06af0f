// RUN: flashopt-opt %s --flashopt-convert-to-llvm | mlir-runner -e main -entry-point-result=i32 | FileCheck %s

// flashopt.add_round_down's host lowering, executed: 16 sums against their
// IEEE roundTowardNegative bits. An inexact sum below (1 + 2^-30 -> 1) and
// above its exact value (1 - 2^-30 -> the float below 1, also across a
// binade: 1 - 2^-25), negative operands, exact zero sums (-0 unless both are
// +0), a finite overflow (the largest float; -inf below), a subnormal exact
// sum, and the code bytes of flashopt-guarded-quantize: RD(z + 0x4B3FFFFF)
// for z = 3.75, -2.25, 255.9375, -126.5 (low bytes floor(z) - 1). The
// result is the number of lanes whose bits differ.
// CHECK: {{^}}0{{$}}
func.func @main() -> i32 {
  %x = arith.constant dense<[0x3F800000, 0x3F800000, 0xBF800000, 0x40A00000, 0x00000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0x40700000, 0xC0100000, 0x80000000, 0x80000000, 0x00000001, 0x437FF000, 0xC2FD0000, 0x3F800000]> : vector<16xf32>
  %y = arith.constant dense<[0x30800000, 0xB0800000, 0xB0800000, 0xC0A00000, 0x00000000, 0x7F7FFFFF, 0xFF7FFFFF, 0xB3000000, 0x4B3FFFFF, 0x4B3FFFFF, 0x80000000, 0x00000000, 0x80000002, 0x4B3FFFFF, 0x4B3FFFFF, 0x3F800000]> : vector<16xf32>
  %want = arith.constant dense<[1065353216, 1065353215, -1082130431, -2147483648, 0, 2139095039, -8388608, 1065353215, 1262485506, 1262485500, -2147483648, -2147483648, -2147483647, 1262485758, 1262485376, 1073741824]> : vector<16xi32>
  %s = flashopt.add_round_down %x, %y : vector<16xf32>
  %bits = arith.bitcast %s : vector<16xf32> to vector<16xi32>
  %ne = arith.cmpi ne, %bits, %want : vector<16xi32>
  %n = arith.extui %ne : vector<16xi1> to vector<16xi32>
  %count = vector.reduction <add>, %n : vector<16xi32> into i32
  return %count : i32
}
