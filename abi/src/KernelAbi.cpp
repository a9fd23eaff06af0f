//===- KernelAbi.cpp - Constants of the kernel ABI
//-------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/abi/KernelAbi.h"

#include <algorithm>

namespace flashopt::abi {

const std::vector<std::string> &known_cpu_features() {
  static const std::vector<std::string> features = {
#define FLASHOPT_CPU_FEATURE_BUILTIN(name) name,
#define FLASHOPT_CPU_FEATURE_CPUID(name) name,
#include "flashopt/abi/CpuFeatures.def"
  };
  return features;
}

bool is_known_cpu_feature(std::string_view feature) {
  const std::vector<std::string> &all = known_cpu_features();
  return std::find(all.begin(), all.end(), feature) != all.end();
}

namespace {
std::vector<std::string> splitCommas(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    size_t comma = s.find(',');
    out.emplace_back(s.substr(0, comma));
    if (comma == std::string_view::npos)
      break;
    s.remove_prefix(comma + 1);
  }
  return out;
}
} // namespace

const std::vector<CpuFlavour> &default_x86_cpu_flavours() {
  static const std::vector<CpuFlavour> flavours = {
#define FLASHOPT_CPU_FLAVOUR(cpu, features)                                    \
  CpuFlavour{cpu, splitCommas(features)},
#include "flashopt/abi/CpuFeatures.def"
  };
  return flavours;
}

const char *kernel_kind_name(KernelKind k) {
  switch (k) {
  case KernelKind::Step:
    return "step";
  case KernelKind::Accumulate:
    return "accumulate";
  case KernelKind::StepAccumulated:
    return "step_accumulated";
  case KernelKind::StepFused:
    return "step_fused";
  }
  return "?";
}

bool parse_kernel_kind(std::string_view name, KernelKind &out) {
  for (KernelKind k : kKernelKinds)
    if (name == kernel_kind_name(k)) {
      out = k;
      return true;
    }
  return false;
}

std::string kernel_kind_suffix(KernelKind k) {
  return k == KernelKind::Step ? std::string()
                               : std::string("__") + kernel_kind_name(k);
}

} // namespace flashopt::abi
