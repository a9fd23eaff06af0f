//===- Format.h - What a checkpoint file holds ------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The checkpoint layout of docs/RUNTIME.md, shared by saving (Save.cpp)
/// and loading (Load.cpp): the tensors a checkpoint of an optimizer holds
/// in each form (compressed: its buffers as they are, params, correction
/// terms and encoded states; f32: master weights and states through the
/// codec), the __metadata__ keys, and the CRC-32C checksums of both.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CHECKPOINT_FORMAT_H
#define FLASHOPT_CHECKPOINT_FORMAT_H

#include "checkpoint/Subject.h"

#include <map>
#include <string>
#include <vector>

namespace flashopt::checkpoint {

/// The two forms of a checkpoint.
enum class Form {
  /// The optimizer's buffers as they are (params, correction terms, encoded
  /// states): bit-exact, for the same spec only.
  Compressed,
  /// fp32 master weights and states (decoded through the codec).
  F32,
};

/// __metadata__ "format" of a flashopt checkpoint.
constexpr const char *kCheckpointFormat = "flashopt.checkpoint";
/// The revision of a numerics whose codes changed (__metadata__
/// "numerics_revision"): the bounded numerics' second, the minifloat codes
/// of docs/NUMERICS.md §2d and §8 (the first, with FlashOptim's linear
/// codes, wrote no key); "1" for FlashOptim's, which never change.
inline const char *numerics_revision(const std::string &numerics) {
  return numerics == "bounded" ? "2" : "1";
}
/// __metadata__ "packing" of a checkpoint holding packed 4-bit codes (written
/// only then): two codes a byte, the even element in the low nibble, an odd
/// count's pad nibble 0 (docs/KERNEL-ABI.md).
constexpr const char *kNibblePacking = "nibbles:low-first";
/// The __metadata__ key holding metadata_checksum of all the others.
constexpr const char *kMetadataChecksumKey = "metadata_checksum";

/// How `m` stores each state, as __metadata__ "state_encodings" records it:
/// "<state>=<encoding>" joined by ';' in manifest order, the encoding being
/// "quantized:<storage>:<compand>:<group>:<scale>"
/// ("quantized:i4:e2m1:32:bf16"), "plain:<dtype>" or "elided".
std::string state_encodings(const Manifest &m);

/// Whether a compressed checkpoint of `m` holds packed (4-bit) codes.
bool has_packed_buffers(const Manifest &m);

/// One tensor a checkpoint of an optimizer holds.
struct Entry {
  std::string name;
  int64_t param = 0;  ///< the optimizer's tensor
  std::string buffer; ///< the optimizer buffer ("" for an F32 master/state)
  std::string state;  ///< F32 form: the state (or "" for the master)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

/// Every tensor a checkpoint of `s` in form `form` holds, in file order
/// (per tensor: param or master, correction, states). A packed buffer (i4,
/// ui4 codes) is its container: U8 with shape [ceil(numel / 2)], its bytes
/// as the optimizer holds them.
std::vector<Entry> expected_tensors(const Subject &s, Form form);

/// The names the tensors of a parameter called `name` have in a checkpoint,
/// in both forms (the C ABI refuses a parameter name that would make two
/// parameters' checkpoint names clash).
std::vector<std::string> tensor_names(const Manifest &m,
                                      const std::string &name);

/// The state `name` of the manifest (Internal if there is none).
Expected<const StateSpec *> state_named(const Manifest &m,
                                        const std::string &name);

/// "crc32c:" and 8 lower-case hex digits.
std::string checksum_text(const void *data, size_t n);

/// CRC-32C of every __metadata__ entry but kMetadataChecksumKey, in key order
/// (key NUL value NUL): a flipped bit in a hyper-parameter, a step counter or
/// the parameter list is then an error, as one in a tensor's data is.
std::string metadata_checksum(const std::map<std::string, std::string> &meta);

} // namespace flashopt::checkpoint

#endif // FLASHOPT_CHECKPOINT_FORMAT_H
