//===- Checkpoint.h - Checkpoints as safetensors files ---------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// See Checkpoint.cpp.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_CHECKPOINT_H
#define FLASHOPT_CAPI_CHECKPOINT_H

#include "Objects.h"

namespace flashopt::capi {

/// Writes `o`'s checkpoint to `path` atomically (IO on failure; the previous
/// file stays intact).
void saveCheckpoint(OptObj &o, const std::string &path,
                    flashopt_checkpoint_format format);
/// Reads and validates the checkpoint at `path` and, only if all of it
/// fits, copies it into `o`.
void loadCheckpoint(OptObj &o, const std::string &path);

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_CHECKPOINT_H
