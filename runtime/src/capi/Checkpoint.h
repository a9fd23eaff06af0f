//===- Checkpoint.h - Checkpoints as safetensors files ----------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Saving (Checkpoint.cpp) and loading (CheckpointLoad.cpp) an optimizer's
/// checkpoint, as a file or as the same bytes in memory.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_CHECKPOINT_H
#define FLASHOPT_CAPI_CHECKPOINT_H

#include "Objects.h"

#include <cstdint>
#include <string>
#include <vector>

namespace flashopt::capi {

/// Writes `o`'s checkpoint to `path` atomically (IO on failure; the previous
/// file stays intact). Sharded: collective; rank 0 writes.
void saveCheckpoint(OptObj &o, const std::string &path,
                    flashopt_checkpoint_format format);
/// The bytes saveCheckpoint writes, in memory (sharded: on every rank).
std::vector<uint8_t> saveCheckpointBuffer(OptObj &o,
                                          flashopt_checkpoint_format format);

/// Reads and validates the checkpoint at `path` and, only if all of it
/// fits, copies it into `o`.
void loadCheckpoint(OptObj &o, const std::string &path);
/// The same for checkpoint bytes in memory.
void loadCheckpointBuffer(OptObj &o, const void *data, size_t size);

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_CHECKPOINT_H
