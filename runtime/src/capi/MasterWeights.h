//===- MasterWeights.h - fp32 master weights in and out --------------------*- C++ -*-===//
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

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_MASTERWEIGHTS_H
