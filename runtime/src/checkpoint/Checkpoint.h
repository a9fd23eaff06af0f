//===- Checkpoint.h - Checkpoints of an optimizer ---------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Saving and loading the checkpoint of a Subject (an optimizer, its
/// stepper and its tensors' names: Subject.h) as a safetensors file or the
/// same bytes in memory, in the format of Format.h (docs/RUNTIME.md
/// "Checkpoints").
///
/// Saving (Save.cpp) makes one image of the optimizer (the compressed form:
/// its buffers as they are; the f32 form: masters and states decoded) and
/// writes it atomically (safetensors::write_file: a failed write leaves a
/// previous file intact) or lays it out in memory, the same bytes either
/// way.
///
/// Loading (Load.cpp) is all or nothing, in three steps:
///
///   read (the safetensors container, safetensors::File) -> validate (every
///   field against the subject, nothing changed; a Plan of everything the
///   load changes) -> apply (the plan copied into the optimizer and the
///   stepper)
///
/// so a checkpoint that is malformed, corrupt (checksums) or of another
/// layout changes nothing.
///
/// Failures are a Status whose code says what went wrong: Format (the file
/// is malformed, corrupt or not a flashopt checkpoint), Mismatch (it is of
/// another spec, numerics, rule or layout), Io (reading or writing a file),
/// and what the optimizer, the stepper and the communicator return (Comm,
/// Cuda, OutOfMemory); Internal for names that do not name every tensor.
/// No exception leaves the module (no_throw, Subject.h).
/// The C ABI's flashopt_{save,load}_checkpoint(_buffer) are a guard, a lock
/// and one call each (capi/StateApi.cpp).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CHECKPOINT_CHECKPOINT_H
#define FLASHOPT_CHECKPOINT_CHECKPOINT_H

#include "checkpoint/Format.h"
#include "checkpoint/Subject.h"
#include "safetensors/Safetensors.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flashopt::checkpoint {

// ---- saving ----------------------------------------------------------------

/// Writes `s`'s checkpoint in form `form` to `path` atomically (Io on
/// failure; a previous file at `path` stays intact). Sharded: a collective;
/// rank 0 writes the file and every rank fails if it could not.
Status save_file(const Subject &s, const std::string &path, Form form);
/// The bytes save_file writes, in memory (sharded: on every rank).
Expected<std::vector<uint8_t>> save_buffer(const Subject &s, Form form);

// ---- loading: read -> validate -> apply ------------------------------------

/// Everything a load changes, validated against a subject.
struct Plan {
  Form form = Form::Compressed;
  /// The tensors to copy (expected_tensors of the form), in file order.
  std::vector<Entry> tensors;
  std::vector<int64_t> steps; ///< [tensor] its step counter
  int64_t step = 0, skipped = 0;
  /// [param group][hyper] its value (nullopt: an envelope before its first
  /// step).
  std::vector<std::vector<std::optional<float>>> hypers;
};

/// Reads `path` as a safetensors file: Io (it cannot be read) or Format
/// (the container is malformed), the message starting "checkpoint file
/// '<path>': ".
Expected<safetensors::File> read_file(const std::string &path);
/// Checkpoint bytes held in memory as a safetensors file (Format), named
/// "checkpoint buffer" in messages.
Expected<safetensors::File> read_buffer(const void *data, size_t size);

/// Reads and checks every field of `file` against `s`, in the order a
/// reader of the file meets them (the header, the counters, the
/// parameters, the param groups, the tensors, their checksums, the f32
/// masters' range), and returns the Plan of what a load changes; nothing is
/// changed. Messages start with `origin` (the quoted path, or "checkpoint
/// buffer").
Expected<Plan> validate(const Subject &s, const safetensors::File &file,
                        const std::string &origin);
/// Copies `plan` (validated against `s` from `file`) into `s`: buffers
/// (compressed), or masters and states through the codec (f32), then the
/// hyper-parameters and the counters. Fails only where the optimizer or the
/// communicator does.
Status apply(const Subject &s, const safetensors::File &file, const Plan &plan);

/// read_file, validate and, only if all of it fits, apply.
Status load_file(const Subject &s, const std::string &path);
/// read_buffer, validate and apply.
Status load_buffer(const Subject &s, const void *data, size_t size);

} // namespace flashopt::checkpoint

#endif // FLASHOPT_CHECKPOINT_CHECKPOINT_H
