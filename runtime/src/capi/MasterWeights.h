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

/// The stored state `state` of the manifest (one with buffers: not elided),
/// or nullptr.
const StateSpec *storedState(const Manifest &m, const std::string &state);
/// Parameter `i`'s state `s` decoded to fp32 (the codec's decode_state).
std::vector<float> exportState(OptObj &o, int64_t i, const StateSpec &s);
/// Sets parameter `i`'s state `s` from fp32 values (the codec's
/// encode_state: quantized states round to nearest, docs/NUMERICS.md §2).
void importState(OptObj &o, int64_t i, const StateSpec &s, const float *in);

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_MASTERWEIGHTS_H
