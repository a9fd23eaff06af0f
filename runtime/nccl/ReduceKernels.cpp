//===- ReduceKernels.cpp - Device kernels of the NCCL reduction -----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "ReduceKernels.h"

namespace flashopt::nccl {

namespace {

const char *const kNames[kNumKernelDTypes] = {"bf16", "f16", "f32"};
const int kBytes[kNumKernelDTypes] = {2, 2, 4};

/// `%f<dst>` = the element at address %rd<addr>, widened exactly.
std::string load(int dtype, const char *dst, const char *addr) {
  std::string d(dst), a(addr);
  switch (dtype) {
  case 0: // bf16: the high half of an f32
    return "\tld.global.u16 \t%rs1, [" + a +
           "];\n\tcvt.u32.u16 \t%r9, %rs1;\n"
           "\tshl.b32 \t%r9, %r9, 16;\n\tmov.b32 \t" +
           d + ", %r9;\n";
  case 1:
    return "\tld.global.b16 \t%rs1, [" + a + "];\n\tcvt.f32.f16 \t" + d +
           ", %rs1;\n";
  default:
    return "\tld.global.f32 \t" + d + ", [" + a + "];\n";
  }
}

/// Stores %f1 at address `addr`, rounded to nearest even.
std::string store(int dtype, const char *addr) {
  std::string a(addr);
  switch (dtype) {
  case 0:
    return "\tcvt.rn.bf16.f32 \t%rs2, %f1;\n\tst.global.b16 \t[" + a +
           "], %rs2;\n";
  case 1:
    return "\tcvt.rn.f16.f32 \t%rs2, %f1;\n\tst.global.b16 \t[" + a +
           "], %rs2;\n";
  default:
    return "\tst.global.f32 \t[" + a + "], %f1;\n";
  }
}

std::string kernel(int s, int d) {
  const std::string name = combine_kernel_name(s, d);
  const std::string p = name + "_param_";
  std::string k;
  k += ".visible .entry " + name + "(\n";
  k += "\t.param .u64 " + p + "0,\n\t.param .u64 " + p + "1,\n";
  k += "\t.param .u64 " + p + "2,\n\t.param .u64 " + p + "3,\n";
  k += "\t.param .u32 " + p + "4,\n\t.param .u32 " + p + "5\n)\n";
  k += ".maxntid 256, 1, 1\n{\n";
  k += "\t.reg .pred \t%p<4>;\n\t.reg .b16 \t%rs<4>;\n";
  k +=
      "\t.reg .b32 \t%r<12>;\n\t.reg .f32 \t%f<4>;\n\t.reg .b64 \t%rd<20>;\n\n";
  k += "\tld.param.u64 \t%rd1, [" + p + "0];\n"; // src
  k += "\tld.param.u64 \t%rd2, [" + p + "1];\n"; // dst
  k += "\tld.param.u64 \t%rd3, [" + p + "2];\n"; // n
  k += "\tld.param.u64 \t%rd4, [" + p + "3];\n"; // stride in bytes
  k += "\tld.param.u32 \t%r10, [" + p + "4];\n"; // parts
  k += "\tld.param.u32 \t%r11, [" + p + "5];\n"; // divisor, f32 bits
  k += "\tmov.b32 \t%f3, %r11;\n";
  k += "\tmov.u32 \t%r1, %ctaid.x;\n\tmov.u32 \t%r2, %ntid.x;\n";
  k += "\tmov.u32 \t%r3, %tid.x;\n\tmov.u32 \t%r4, %nctaid.x;\n";
  k += "\tcvt.u64.u32 \t%rd5, %r1;\n\tcvt.u64.u32 \t%rd6, %r2;\n";
  k += "\tmul.lo.u64 \t%rd7, %rd5, %rd6;\n\tcvt.u64.u32 \t%rd8, %r3;\n";
  k += "\tadd.u64 \t%rd9, %rd7, %rd8;\n"; // i
  k += "\tcvt.u64.u32 \t%rd10, %r4;\n\tmul.lo.u64 \t%rd11, %rd10, %rd6;\n";
  k += "$L__loop:\n";
  k += "\tsetp.ge.u64 \t%p1, %rd9, %rd3;\n\t@%p1 bra \t$L__done;\n";
  k += "\tmul.lo.u64 \t%rd12, %rd9, " + std::to_string(kBytes[s]) + ";\n";
  k += "\tadd.u64 \t%rd13, %rd1, %rd12;\n";
  k += load(s, "%f1", "%rd13");
  k += "\tmov.u32 \t%r5, 1;\n";
  k += "$L__part:\n";
  k += "\tsetp.ge.u32 \t%p2, %r5, %r10;\n\t@%p2 bra \t$L__store;\n";
  k += "\tadd.u64 \t%rd13, %rd13, %rd4;\n";
  k += load(s, "%f2", "%rd13");
  k += "\tadd.rn.f32 \t%f1, %f1, %f2;\n";
  k += "\tadd.u32 \t%r5, %r5, 1;\n\tbra.uni \t$L__part;\n";
  k += "$L__store:\n";
  k += "\tdiv.rn.f32 \t%f1, %f1, %f3;\n";
  k += "\tmul.lo.u64 \t%rd14, %rd9, " + std::to_string(kBytes[d]) + ";\n";
  k += "\tadd.u64 \t%rd15, %rd2, %rd14;\n";
  k += store(d, "%rd15");
  k += "\tadd.u64 \t%rd9, %rd9, %rd11;\n\tbra.uni \t$L__loop;\n";
  k += "$L__done:\n\tret;\n}\n\n";
  return k;
}

} // namespace

std::string combine_kernel_name(int src_dtype, int dst_dtype) {
  return std::string("flashopt_nccl_combine_") + kNames[src_dtype] + "_" +
         kNames[dst_dtype];
}

const std::string &combine_kernels_ptx() {
  static const std::string ptx = [] {
    // PTX 7.0 / sm_80: the first with cvt.rn.bf16.f32; JIT-compiled for
    // newer devices by the driver.
    std::string m = "//\n// flashopt NCCL combine kernels\n//\n\n"
                    ".version 7.0\n.target sm_80\n.address_size 64\n\n";
    for (int s = 0; s < kNumKernelDTypes; ++s)
      for (int d = 0; d < kNumKernelDTypes; ++d)
        m += kernel(s, d);
    return m;
  }();
  return ptx;
}

} // namespace flashopt::nccl
