//===- MasterWeights.h - fp32 master weights and states ---------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The fp32 master weight of a tensor (its param plus correction term) and
/// its fp32 states, exported and imported through the host codec: the
/// checkpoint's f32 form, and the C ABI's
/// flashopt_{export,import}_{master,state}_f32. Sharded data parallelism:
/// each call is a collective (Subject::read and write).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CHECKPOINT_MASTERWEIGHTS_H
#define FLASHOPT_CHECKPOINT_MASTERWEIGHTS_H

#include "checkpoint/Subject.h"

#include <string>
#include <vector>

namespace flashopt::checkpoint {

/// Tensor `i`'s master weight as fp32.
Expected<std::vector<float>> export_master(const Subject &s, int64_t i);
/// Sets tensor `i`'s param and correction term from numel(i) fp32 values.
Status import_master(const Subject &s, int64_t i, const float *in);
/// Fails with `code` (naming `where`, the tensor and the element) when a
/// finite value of `in` would become an infinite parameter (beyond the bf16
/// or f16 range): import_master would store +-Inf silently.
Status check_master_fits(const Subject &s, int64_t i, const float *in,
                         Code code, const std::string &where);

/// The stored state `state` of the manifest (one with buffers: not elided),
/// or nullptr.
const StateSpec *stored_state(const Manifest &m, const std::string &state);
/// Tensor `i`'s state `state` decoded to fp32 (the codec's decode_state).
Expected<std::vector<float>> export_state(const Subject &s, int64_t i,
                                          const StateSpec &state);
/// Sets tensor `i`'s state `state` from fp32 values (the codec's
/// encode_state: quantized states round to nearest, docs/NUMERICS.md §2).
Status import_state(const Subject &s, int64_t i, const StateSpec &state,
                    const float *in);

} // namespace flashopt::checkpoint

#endif // FLASHOPT_CHECKPOINT_MASTERWEIGHTS_H
