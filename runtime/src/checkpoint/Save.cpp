//===- Save.cpp - Saving checkpoints as safetensors -----------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// One image of the optimizer (compressed: its buffers as they are; f32:
/// masters and states decoded), written atomically to a file or laid out in
/// memory, the same bytes either way.
///
//===----------------------------------------------------------------------===//

#include "checkpoint/Checkpoint.h"

#include "checkpoint/MasterWeights.h"

#include <nlohmann/json.hpp>

namespace flashopt::checkpoint {

using json = nlohmann::json;

namespace {

/// A checkpoint of an optimizer, ready to write: every tensor's bytes and
/// the __metadata__.
struct Image {
  Image() = default;
  Image(const Image &) = delete; // refs point into storage: moved only
  Image(Image &&) = default;
  std::vector<std::vector<uint8_t>> storage; ///< [tensor] its bytes
  std::vector<safetensors::TensorRef> refs;  ///< [tensor] into storage
  std::map<std::string, std::string> meta;
};

/// The bytes of tensor `e` of `s`'s checkpoint (sharded: gathered, a
/// collective).
Expected<std::vector<uint8_t>> tensorBytes(const Subject &s, const Entry &e,
                                           Form form) {
  if (form == Form::Compressed)
    return s.read(e.param, e.buffer);
  Expected<std::vector<float>> v = std::vector<float>();
  if (e.state.empty()) {
    v = export_master(s, e.param);
  } else {
    Expected<const StateSpec *> state = state_named(s.manifest(), e.state);
    if (!state)
      return state.status();
    v = export_state(s, e.param, **state);
  }
  if (!v)
    return v.status();
  const auto *b = reinterpret_cast<const uint8_t *>(v->data());
  return std::vector<uint8_t>(b, b + v->size() * sizeof(float));
}

/// The metadata: the format, the spec, the counters, the parameters and
/// param groups, the state encodings (and the nibble packing), the tensors'
/// checksums, then the metadata's own.
std::map<std::string, std::string> metadataOf(const Subject &s,
                                              const Image &img, Form form) {
  const Manifest &m = s.manifest();
  const host::Optimizer &opt = s.optimizer();
  const train::Stepper &stepper = s.stepper();
  // A CRC-32C of every tensor's bytes: a flipped data bit becomes a clear
  // error at load (other safetensors readers ignore the key).
  json checksums = json::object();
  for (size_t i = 0; i < img.refs.size(); ++i)
    checksums[img.refs[i].name] =
        checksum_text(img.storage[i].data(), img.storage[i].size());
  json params = json::array();
  for (int64_t i = 0; i < s.names().size(); ++i)
    params.push_back({{"name", s.names().name(i)},
                      {"group", s.group(i)},
                      {"step", stepper.tensor_step(i)},
                      {"numel", s.numel(i)},
                      {"shape", s.names().shape(i)}});
  json groups = json::array();
  const std::vector<float> &table = opt.hyper_table();
  const size_t H = m.hypers.size();
  for (int g = 0; g < opt.num_param_groups(); ++g) {
    json obj = json::object();
    for (size_t h = 0; h < H; ++h)
      obj[m.hypers[h].name] =
          opt.hypers().given(g, h)
              ? json(double(table[size_t(g) * H + h]))
              : json(nullptr); // an envelope before its first step
    groups.push_back(obj);
  }
  std::map<std::string, std::string> meta{
      {"format", kCheckpointFormat},
      {"format_version", "1"},
      {"generator", std::string("libflashopt ") + abi::kFlashOptVersion},
      {"spec", m.name},
      {"spec_hash", m.spec_hash},
      {"rule", m.rule},
      {"numerics", m.numerics},
      {"numerics_revision", numerics_revision(m.numerics)},
      {"checkpoint", form == Form::F32 ? "f32" : "compressed"},
      {"step", std::to_string(stepper.step_count())},
      {"skipped_steps", std::to_string(stepper.skipped_steps())},
      {"params", params.dump()},
      {"checksums", checksums.dump()},
      {"param_groups", groups.dump()},
      // How each state is stored: checked before spec_hash at load, so a
      // file of another state width is refused naming the state.
      {"state_encodings", state_encodings(m)}};
  // Packed 4-bit codes are in the file as their bytes: say how.
  if (form == Form::Compressed && has_packed_buffers(m))
    meta["packing"] = kNibblePacking;
  meta[kMetadataChecksumKey] = metadata_checksum(meta);
  return meta;
}

Expected<Image> imageOf(const Subject &s, Form form) {
  if (Status st = s.check(); !st)
    return st;
  std::vector<Entry> ex = expected_tensors(s, form);
  Image img;
  img.storage.reserve(ex.size()); // the refs point into it
  for (const Entry &e : ex) {
    Expected<std::vector<uint8_t>> bytes = tensorBytes(s, e, form);
    if (!bytes)
      return bytes.status();
    img.storage.push_back(std::move(bytes.value()));
    safetensors::TensorRef r;
    r.name = e.name;
    r.dtype = e.dtype;
    r.shape = e.shape;
    r.data = img.storage.back().data();
    img.refs.push_back(std::move(r));
  }
  img.meta = metadataOf(s, img, form);
  return img;
}

Status saveFile(const Subject &s, const std::string &path, Form form) {
  Expected<Image> img = imageOf(s, form);
  if (!img)
    return img.status();
  // Sharded: every rank gathered the same bytes; rank 0 writes the file
  // and the others learn whether it did.
  const bool sharded = s.sharded();
  dist::DataParallel *dp = s.data_parallel();
  Status st = !sharded || dp->comm().rank() == 0
                  ? safetensors::write_file(path, img->refs, img->meta)
                  : Status::success();
  if (sharded) {
    Expected<bool> bad = dp->comm().any(!st);
    if (!bad)
      return bad.status();
    if (*bad && st)
      return Status::error(Code::Io, "rank 0 could not write " + quote(path));
  }
  return st;
}

Expected<std::vector<uint8_t>> saveBuffer(const Subject &s, Form form) {
  Expected<Image> img = imageOf(s, form);
  if (!img)
    return img.status();
  return safetensors::serialize(img->refs, img->meta);
}

} // namespace

Status save_file(const Subject &s, const std::string &path, Form form) {
  return no_throw([&] { return saveFile(s, path, form); });
}

Expected<std::vector<uint8_t>> save_buffer(const Subject &s, Form form) {
  return no_throw([&] { return saveBuffer(s, form); });
}

} // namespace flashopt::checkpoint
