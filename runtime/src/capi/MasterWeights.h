//===- MasterWeights.h - fp32 master weights in and out ---------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// See MasterWeights.cpp.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_MASTERWEIGHTS_H
#define FLASHOPT_CAPI_MASTERWEIGHTS_H

#include "Objects.h"

namespace flashopt::capi {

/// Parameter `i`'s master weight as fp32.
std::vector<float> exportMaster(OptObj &o, int64_t i);
/// Sets parameter `i`'s param and correction term from fp32 values.
void importMaster(OptObj &o, int64_t i, const float *in);
/// Fails with `code` (naming `where`, the parameter and the element) when a
/// finite value of `in` would become an infinite parameter (beyond the bf16
/// or f16 range): importMaster would store +-Inf silently.
void checkMasterFits(const OptObj &o, int64_t i, const float *in,
                     flashopt_status code, const std::string &where);

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_MASTERWEIGHTS_H
