//===- Checkpoint.cpp - Saving checkpoints as safetensors -----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The checkpoint format's tensors and checksums (CheckpointFormat.h) and
/// saving: one image of the optimizer (compressed: its buffers as they are;
/// f32: masters and states decoded), written atomically to a file or laid
/// out in memory, the same bytes either way.
///
//===----------------------------------------------------------------------===//

#include "Checkpoint.h"

#include "CheckpointFormat.h"
#include "MasterWeights.h"
#include "safetensors/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cstdio>

namespace flashopt::capi {

using json = nlohmann::json;

//===----------------------------------------------------------------------===//
// The format
//===----------------------------------------------------------------------===//

std::vector<Expect> expectedTensors(const OptObj &o, bool f32) {
  const Manifest &m = *o.m;
  std::vector<Expect> out;
  for (size_t i = 0; i < o.params.size(); ++i) {
    const ParamRec &p = o.params[i];
    std::vector<int64_t> groups{(p.numel + m.group_size - 1) / m.group_size};
    if (f32) {
      out.push_back({p.name, int64_t(i), "", "", DType::F32, p.shape});
      for (const StateSpec &s : m.states)
        if (!abi::state_buffers(s).empty())
          out.push_back({p.name + "." + s.name, int64_t(i), "", s.name,
                         DType::F32, p.shape});
      continue;
    }
    out.push_back({p.name, int64_t(i), "param", "", m.param, p.shape});
    if (m.correction)
      out.push_back({p.name + ".correction", int64_t(i), "correction", "",
                     *m.correction, p.shape});
    for (const StateSpec &s : m.states)
      for (const abi::StateBuffer &b : abi::state_buffers(s))
        out.push_back({p.name + "." + s.name + b.suffix, int64_t(i),
                       s.name + b.suffix, "", b.dtype,
                       b.per == Per::Group ? groups : p.shape});
  }
  return out;
}

const StateSpec &stateNamed(const Manifest &m, const std::string &name) {
  for (const StateSpec &s : m.states)
    if (s.name == name)
      return s;
  fail(FLASHOPT_ERROR_INTERNAL, m.name + " has no state " + quote(name));
}

std::string checksumText(const void *data, size_t n) {
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", safetensors::crc32c(data, n));
  return std::string("crc32c:") + hex;
}

std::string metadataChecksum(const std::map<std::string, std::string> &meta) {
  std::string canon;
  for (const auto &kv : meta) {
    if (kv.first == kMetadataChecksumKey)
      continue;
    canon += kv.first;
    canon.push_back('\0');
    canon += kv.second;
    canon.push_back('\0');
  }
  return checksumText(canon.data(), canon.size());
}

//===----------------------------------------------------------------------===//
// Saving
//===----------------------------------------------------------------------===//

namespace {

/// A checkpoint of an optimizer, ready to write: every tensor's bytes and
/// the __metadata__.
struct Image {
  std::vector<std::vector<uint8_t>> storage; ///< [tensor] its bytes
  std::vector<safetensors::TensorRef> refs;  ///< [tensor] into storage
  std::map<std::string, std::string> meta;
};

/// The bytes of tensor `e` of `o`'s checkpoint (sharded: gathered, a
/// collective).
std::vector<uint8_t> tensorBytes(OptObj &o, const Expect &e, bool f32) {
  if (!f32)
    return o.read(e.param, e.buffer);
  std::vector<float> v =
      e.state.empty() ? exportMaster(o, e.param)
                      : exportState(o, e.param, stateNamed(*o.m, e.state));
  const auto *b = reinterpret_cast<const uint8_t *>(v.data());
  return std::vector<uint8_t>(b, b + v.size() * sizeof(float));
}

/// The metadata: the format, the spec, the counters, the parameters and
/// param groups, the tensors' checksums, then the metadata's own.
std::map<std::string, std::string> metadataOf(OptObj &o, const Image &img,
                                              bool f32) {
  const Manifest &m = *o.m;
  // A CRC-32C of every tensor's bytes: a flipped data bit becomes a clear
  // error at load (other safetensors readers ignore the key).
  json checksums = json::object();
  for (size_t i = 0; i < img.refs.size(); ++i)
    checksums[img.refs[i].name] =
        checksumText(img.storage[i].data(), img.storage[i].size());
  json params = json::array();
  for (size_t i = 0; i < o.params.size(); ++i) {
    const ParamRec &p = o.params[i];
    params.push_back({{"name", p.name},
                      {"group", p.group},
                      {"step", o.trainer->tensor_step(int64_t(i))},
                      {"numel", p.numel},
                      {"shape", p.shape}});
  }
  json groups = json::array();
  const std::vector<float> &table = o.opt->hyper_table();
  const size_t H = m.hypers.size();
  for (int g = 0; g < o.opt->num_param_groups(); ++g) {
    json obj = json::object();
    for (size_t h = 0; h < H; ++h)
      obj[m.hypers[h].name] =
          o.opt->hypers().given(g, h)
              ? json(double(table[size_t(g) * H + h]))
              : json(nullptr); // an envelope before its first step
    groups.push_back(obj);
  }
  std::map<std::string, std::string> meta{
      {"format", kCheckpointFormat},
      {"format_version", "1"},
      {"generator", std::string("libflashopt ") + flashopt_version()},
      {"spec", m.name},
      {"spec_hash", m.spec_hash},
      {"rule", m.rule},
      {"numerics", m.numerics},
      {"numerics_revision", numericsRevision(m.numerics)},
      {"checkpoint", f32 ? "f32" : "compressed"},
      {"step", std::to_string(o.trainer->step_count())},
      {"skipped_steps", std::to_string(o.trainer->skipped_steps())},
      {"params", params.dump()},
      {"checksums", checksums.dump()},
      {"param_groups", groups.dump()}};
  meta[kMetadataChecksumKey] = metadataChecksum(meta);
  return meta;
}

Image imageOf(OptObj &o, flashopt_checkpoint_format format) {
  const bool f32 = format == FLASHOPT_CHECKPOINT_F32;
  std::vector<Expect> ex = expectedTensors(o, f32);
  Image img;
  img.storage.reserve(ex.size()); // the refs point into it
  for (const Expect &e : ex) {
    img.storage.push_back(tensorBytes(o, e, f32));
    safetensors::TensorRef r;
    r.name = e.name;
    r.dtype = e.dtype;
    r.shape = e.shape;
    r.data = img.storage.back().data();
    img.refs.push_back(std::move(r));
  }
  img.meta = metadataOf(o, img, f32);
  return img;
}

} // namespace

void saveCheckpoint(OptObj &o, const std::string &path,
                    flashopt_checkpoint_format format) {
  Image img = imageOf(o, format);
  // Sharded: every rank gathered the same bytes; rank 0 writes the file
  // and the others learn whether it did.
  dist::DataParallel *dp = o.dp();
  const bool sharded = dp && dp->sharded();
  Status s = !sharded || dp->comm().rank() == 0
                 ? safetensors::write_file(path, img.refs, img.meta)
                 : Status::success();
  if (sharded) {
    Expected<bool> bad = dp->comm().any(!s);
    if (!bad)
      fail(bad.status());
    if (*bad && s)
      fail(FLASHOPT_ERROR_IO, "rank 0 could not write " + quote(path));
  }
  if (!s)
    fail(s);
}

std::vector<uint8_t> saveCheckpointBuffer(OptObj &o,
                                          flashopt_checkpoint_format format) {
  Image img = imageOf(o, format);
  Expected<std::vector<uint8_t>> bytes =
      safetensors::serialize(img.refs, img.meta);
  if (!bytes)
    fail(bytes.status());
  return std::move(bytes.value());
}

} // namespace flashopt::capi
