//===- CheckpointFormat.h - What a checkpoint file holds --------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The checkpoint layout of docs/RUNTIME.md, shared by the writer
/// (Checkpoint.cpp) and the reader (CheckpointLoad.cpp): the tensors a
/// checkpoint of an optimizer holds in each form (compressed: native codes,
/// scales, corrections and params; f32: masters and states through the
/// codec), the __metadata__ keys, and the CRC-32C checksums of both.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_CHECKPOINTFORMAT_H
#define FLASHOPT_CAPI_CHECKPOINTFORMAT_H

#include "Objects.h"

#include <map>
#include <string>
#include <vector>

namespace flashopt::capi {

/// __metadata__ "format" of a flashopt checkpoint.
constexpr const char *kCheckpointFormat = "flashopt.checkpoint";
/// The revision of a numerics whose codes changed (__metadata__
/// "numerics_revision"): the bounded numerics' second, the minifloat codes
/// of docs/NUMERICS.md §2d and §8 (the first, with FlashOptim's linear
/// codes, wrote no key); "1" for FlashOptim's, which never change.
inline const char *numericsRevision(const std::string &numerics) {
  return numerics == "bounded" ? "2" : "1";
}
/// The __metadata__ key holding metadataChecksum of all the others.
constexpr const char *kMetadataChecksumKey = "metadata_checksum";

/// One tensor a checkpoint of this optimizer holds.
struct Expect {
  std::string name;
  int64_t param = 0;
  std::string buffer; ///< the optimizer buffer ("" for an F32 master/state)
  std::string state;  ///< F32 form: the state (or "" for the master)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

/// Every tensor a checkpoint of `o` holds, in file order (per parameter:
/// param or master, correction, states).
std::vector<Expect> expectedTensors(const OptObj &o, bool f32);

/// The state `name` of the manifest (it exists: expectedTensors named it).
const StateSpec &stateNamed(const Manifest &m, const std::string &name);

/// "crc32c:" and 8 lower-case hex digits.
std::string checksumText(const void *data, size_t n);

/// CRC-32C of every __metadata__ entry but kMetadataChecksumKey, in key order
/// (key NUL value NUL): a flipped bit in a hyper-parameter, a step counter or
/// the parameter list is then an error, as one in a tensor's data is.
std::string metadataChecksum(const std::map<std::string, std::string> &meta);

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_CHECKPOINTFORMAT_H
