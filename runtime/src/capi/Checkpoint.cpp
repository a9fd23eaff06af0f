//===- Checkpoint.cpp - Checkpoints as safetensors files -------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The checkpoint layout of docs/RUNTIME.md over the safetensors reader and
/// writer: compressed (native codes, scales, corrections, params) or fp32
/// (through the codec); every field of a file validated before anything is
/// copied, so a rejected file changes nothing.
///
//===----------------------------------------------------------------------===//

#include "Checkpoint.h"

#include "MasterWeights.h"
#include "codec/Codec.h"
#include "safetensors/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <set>

namespace flashopt::capi {

using json = nlohmann::json;

constexpr const char *kCheckpointFormat = "flashopt.checkpoint";

namespace {

/// One tensor a checkpoint of this optimizer holds.
struct Expect {
  std::string name;
  int64_t param = 0;
  std::string buffer; ///< the optimizer buffer ("" for an F32 master/state)
  std::string state;  ///< F32 form: the state (or "" for the master)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

/// "crc32c:" and 8 lower-case hex digits.
std::string checksumText(const void *data, size_t n) {
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", safetensors::crc32c(data, n));
  return std::string("crc32c:") + hex;
}

/// The __metadata__ key holding metadataChecksum of all the others.
constexpr const char *kMetadataChecksumKey = "metadata_checksum";

/// CRC-32C of every __metadata__ entry but kMetadataChecksumKey, in key order
/// (key NUL value NUL): a flipped bit in a hyper-parameter, a step counter or
/// the parameter list is then an error, as one in a tensor's data is.
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

} // namespace

void saveCheckpoint(OptObj &o, const std::string &path,
                    flashopt_checkpoint_format format) {
  const Manifest &m = *o.m;
  bool f32 = format == FLASHOPT_CHECKPOINT_F32;
  std::vector<Expect> ex = expectedTensors(o, f32);
  std::vector<std::vector<uint8_t>> storage;
  storage.reserve(ex.size());
  std::vector<safetensors::TensorRef> refs;
  std::vector<float> master;
  for (const Expect &e : ex) {
    const ParamRec &p = o.params[size_t(e.param)];
    if (!f32) {
      storage.push_back(o.read(e.param, e.buffer));
    } else if (e.state.empty()) {
      master = exportMaster(o, e.param);
      const uint8_t *b = reinterpret_cast<const uint8_t *>(master.data());
      storage.emplace_back(b, b + master.size() * sizeof(float));
    } else {
      const StateSpec *s = nullptr;
      for (const StateSpec &st : m.states)
        if (st.name == e.state)
          s = &st;
      std::vector<float> v(size_t(p.numel));
      std::vector<std::vector<uint8_t>> stored;
      std::vector<const void *> buffers;
      for (const abi::StateBuffer &b : abi::state_buffers(*s))
        stored.push_back(o.read(e.param, s->name + b.suffix));
      for (const std::vector<uint8_t> &b : stored)
        buffers.push_back(b.data());
      codec::decode_state(*s, buffers, m.group_size, p.numel, v.data());
      const uint8_t *b = reinterpret_cast<const uint8_t *>(v.data());
      storage.emplace_back(b, b + v.size() * sizeof(float));
    }
    safetensors::TensorRef r;
    r.name = e.name;
    r.dtype = e.dtype;
    r.shape = e.shape;
    r.data = storage.back().data();
    refs.push_back(std::move(r));
  }

  // A CRC-32C of every tensor's bytes: a flipped data bit becomes a clear
  // error at load (other safetensors readers ignore the key).
  json checksums = json::object();
  for (size_t i = 0; i < refs.size(); ++i)
    checksums[refs[i].name] = checksumText(storage[i].data(), storage[i].size());

  json params = json::array();
  for (const ParamRec &p : o.params)
    params.push_back({{"name", p.name},
                      {"group", p.group},
                      {"step", p.step},
                      {"numel", p.numel},
                      {"shape", p.shape}});
  json groups = json::array();
  const std::vector<float> &table = o.opt->hyper_table();
  size_t H = m.hypers.size();
  for (int g = 0; g < o.opt->num_param_groups(); ++g) {
    json obj = json::object();
    for (size_t h = 0; h < H; ++h)
      obj[m.hypers[h].name] = double(table[size_t(g) * H + h]);
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
      {"checkpoint", f32 ? "f32" : "compressed"},
      {"step", std::to_string(o.globalStep)},
      {"skipped_steps", std::to_string(o.skipped)},
      {"params", params.dump()},
      {"checksums", checksums.dump()},
      {"param_groups", groups.dump()}};
  meta[kMetadataChecksumKey] = metadataChecksum(meta);
  // Sharded: every rank gathered the same bytes; rank 0 writes the file
  // and the others learn whether it did.
  const bool sharded = o.dp && o.dp->sharded();
  Status s = !sharded || o.dp->comm().rank() == 0
                 ? safetensors::write_file(path, refs, meta)
                 : Status::success();
  if (sharded) {
    Expected<bool> bad = o.dp->comm().any(!s);
    if (!bad)
      fail(FLASHOPT_ERROR_COMM, bad.error());
    if (*bad && s)
      fail(FLASHOPT_ERROR_IO, "rank 0 could not write " + quote(path));
  }
  if (!s)
    fail(FLASHOPT_ERROR_IO, s.message());
}

namespace {

int64_t parseInt(const std::map<std::string, std::string> &meta,
                 const std::string &key, const std::string &file) {
  auto it = meta.find(key);
  if (it == meta.end())
    fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ has no " + quote(key));
  try {
    size_t used = 0;
    long long v = std::stoll(it->second, &used);
    if (used != it->second.size() || v < 0)
      throw std::invalid_argument("trailing");
    return int64_t(v);
  } catch (const std::exception &) {
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": __metadata__ " + quote(key) +
             " is not a non-negative integer: " + quote(it->second));
  }
}

json parseJson(const std::map<std::string, std::string> &meta,
               const std::string &key, const std::string &file) {
  auto it = meta.find(key);
  if (it == meta.end())
    fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ has no " + quote(key));
  try {
    return json::parse(it->second);
  } catch (const std::exception &e) {
    fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ " + quote(key) +
                                    " is not valid JSON: " + e.what());
  }
}

} // namespace

void loadCheckpoint(OptObj &o, const std::string &path) {
  const Manifest &m = *o.m;
  const std::string file = quote(path);
  int err = 0;
  if (!fileExists(path, &err))
    fail(err == ENOENT || err == ENOTDIR ? FLASHOPT_ERROR_NOT_FOUND
                                         : FLASHOPT_ERROR_IO,
         "checkpoint file " + file + ": " + std::strerror(err));
  Expected<safetensors::File> read = safetensors::File::read(path);
  if (!read) {
    const std::string &e = read.error();
    bool io = e.find("cannot open") != std::string::npos ||
              e.find("read error") != std::string::npos;
    fail(io ? FLASHOPT_ERROR_IO : FLASHOPT_ERROR_FORMAT,
         "checkpoint file " + file + ": " + e);
  }
  const safetensors::File &f = read.value();
  const auto &meta = f.metadata();

  // ---- validate everything ------------------------------------------------
  auto metaOr = [&](const char *key) -> std::string {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  // The metadata's own checksum first (files written before it existed, or
  // rewritten by other tools, have none): whatever else is wrong with a
  // corrupted header, this is the clearest thing to say.
  if (meta.count(kMetadataChecksumKey)) {
    std::string got = metadataChecksum(meta);
    if (metaOr(kMetadataChecksumKey) != got)
      fail(FLASHOPT_ERROR_FORMAT,
           file + ": __metadata__ checksum is " + got + ", but '" +
               kMetadataChecksumKey + "' records " +
               metaOr(kMetadataChecksumKey) +
               " (the header is corrupt or was edited)");
  }
  if (metaOr("format") != kCheckpointFormat)
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": not a flashopt checkpoint (__metadata__ format is " +
             quote(metaOr("format")) + ", expected " +
             quote(kCheckpointFormat) + ")");
  if (metaOr("format_version") != "1")
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": unsupported checkpoint format_version " +
             quote(metaOr("format_version")) + " (this library reads 1)");
  // The state numerics (docs/NUMERICS.md §8) first: the clearest thing to
  // say when a run moves between the bounded and the FlashOptim numerics.
  // Files written before the key existed ran FlashOptim's numerics.
  std::string numerics =
      meta.count("numerics") ? metaOr("numerics") : std::string("flashoptim");
  if (numerics != m.numerics)
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": checkpoint written with the " + quote(numerics) +
             " numerics (spec " + quote(metaOr("spec")) +
             "), but this optimizer runs the " + quote(m.numerics) +
             " numerics (spec " + quote(m.name) +
             "); nothing was loaded. Load it into an optimizer with the "
             "same numerics, or move the run through its fp32 master "
             "weights and states");
  if (metaOr("spec") != m.name || metaOr("spec_hash") != m.spec_hash)
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": checkpoint of spec " + quote(metaOr("spec")) + " (" +
             metaOr("spec_hash") + "), but this optimizer runs " +
             quote(m.name) + " (" + m.spec_hash + ")");
  if (meta.count("rule") && metaOr("rule") != m.rule)
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": checkpoint of rule " + quote(metaOr("rule")) +
             ", but this optimizer runs " + quote(m.rule) + " (spec " +
             quote(m.name) + ")");
  std::string form = metaOr("checkpoint");
  if (form != "compressed" && form != "f32")
    fail(FLASHOPT_ERROR_FORMAT, file + ": unknown checkpoint form " +
                                    quote(form) + " (compressed or f32)");
  bool f32 = form == "f32";
  int64_t globalStep = parseInt(meta, "step", file);
  int64_t skipped = parseInt(meta, "skipped_steps", file);

  // Parameters: the same names, groups and shapes.
  json params = parseJson(meta, "params", file);
  if (!params.is_array())
    fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ 'params' is not a list");
  std::vector<int64_t> steps(o.params.size(), -1);
  std::set<std::string> inFile;
  for (const json &p : params) {
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string() ||
        !p.contains("group") || !p["group"].is_number_integer() ||
        !p.contains("step") || !p["step"].is_number_integer() ||
        p["step"].get<int64_t>() < 0)
      fail(FLASHOPT_ERROR_FORMAT,
           file + ": __metadata__ 'params' has a malformed entry " + p.dump());
    std::string name = p["name"].get<std::string>();
    if (!inFile.insert(name).second)
      fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ 'params' lists "
                                         "parameter " +
                                      quote(name) + " more than once");
    auto it = o.byName.find(name);
    if (it == o.byName.end())
      fail(FLASHOPT_ERROR_MISMATCH, file + ": the checkpoint holds parameter " +
                                        quote(name) +
                                        ", which is not registered here");
    const ParamRec &here = o.params[size_t(it->second)];
    if (!p.contains("numel") || !p["numel"].is_number_integer())
      fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ 'params' entry of " +
                                      quote(name) + " has no integer 'numel'");
    if (p["numel"].get<int64_t>() != here.numel)
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": __metadata__ 'params' gives parameter " + quote(name) +
               " numel " + std::to_string(p["numel"].get<int64_t>()) +
               ", but " + o.describe(it->second) + " has " +
               std::to_string(here.numel));
    std::vector<int64_t> shape;
    bool shapeOk = p.contains("shape") && p["shape"].is_array();
    if (shapeOk)
      for (const json &d : p["shape"]) {
        if (!d.is_number_integer()) {
          shapeOk = false;
          break;
        }
        shape.push_back(d.get<int64_t>());
      }
    if (!shapeOk)
      fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ 'params' entry of " +
                                      quote(name) +
                                      " has no 'shape' list of integers");
    if (shape != here.shape)
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": __metadata__ 'params' gives parameter " + quote(name) +
               " shape " + shapeString(shape) + ", but " +
               o.describe(it->second) + " has shape " +
               shapeString(here.shape));
    int64_t group = p["group"].get<int64_t>();
    if (group != o.params[size_t(it->second)].group)
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": parameter " + quote(name) + " is in param group " +
               std::to_string(group) + " in the checkpoint but in group " +
               std::to_string(o.params[size_t(it->second)].group) + " here");
    steps[size_t(it->second)] = p["step"].get<int64_t>();
  }
  for (size_t i = 0; i < o.params.size(); ++i)
    if (!inFile.count(o.params[i].name))
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": " + o.describe(int64_t(i)) + " is not in the checkpoint");

  // Param groups and their hyper-parameters.
  json groups = parseJson(meta, "param_groups", file);
  if (!groups.is_array())
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": __metadata__ 'param_groups' is not a list");
  if (int64_t(groups.size()) != o.opt->num_param_groups())
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": the checkpoint has " + std::to_string(groups.size()) +
             " param groups, this optimizer " + std::to_string(o.opt->num_param_groups()));
  std::vector<std::vector<float>> hyperValues;
  for (size_t g = 0; g < groups.size(); ++g) {
    const json &obj = groups[g];
    if (!obj.is_object())
      fail(FLASHOPT_ERROR_FORMAT,
           file + ": param group " + std::to_string(g) + " is not an object");
    std::vector<float> vals;
    for (const HyperSpec &h : m.hypers) {
      if (!obj.contains(h.name) || !obj[h.name].is_number())
        fail(FLASHOPT_ERROR_FORMAT, file + ": param group " +
                                        std::to_string(g) + " has no number " +
                                        quote(h.name));
      float v = float(obj[h.name].get<double>());
      if (!std::isfinite(v))
        fail(FLASHOPT_ERROR_FORMAT, file + ": param group " +
                                        std::to_string(g) + ": " +
                                        quote(h.name) + " is not finite");
      for (const StateSpec &s : m.states)
        if (s.kind == StateKind::Elided && s.elidable_if_zero == h.name &&
            v != 0.0f)
          fail(FLASHOPT_ERROR_MISMATCH,
               file + ": param group " + std::to_string(g) + " sets " +
                   quote(h.name) + " nonzero, but its state is elided");
      vals.push_back(v);
    }
    if (obj.size() != m.hypers.size())
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": param group " + std::to_string(g) +
               " has hyper-parameters this spec does not know");
    hyperValues.push_back(std::move(vals));
  }

  // Tensors: every expected one, with its dtype and shape; nothing else.
  std::vector<Expect> ex = expectedTensors(o, f32);
  std::set<std::string> expectedNames;
  for (const Expect &e : ex) {
    expectedNames.insert(e.name);
    const safetensors::StoredTensor *t = f.find(e.name);
    if (!t)
      fail(FLASHOPT_ERROR_MISMATCH, file + ": tensor " + quote(e.name) + " (" +
                                        form + " form) is missing");
    if (t->dtype != e.dtype)
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": tensor " + quote(e.name) + " is " +
               safetensors::dtype_name(t->dtype) + ", expected " +
               safetensors::dtype_name(e.dtype));
    if (t->shape != e.shape)
      fail(FLASHOPT_ERROR_MISMATCH, file + ": tensor " + quote(e.name) +
                                        " has shape " + shapeString(t->shape) +
                                        ", but " + o.describe(e.param) +
                                        " needs " + shapeString(e.shape));
  }
  for (const auto &kv : f.tensors())
    if (!expectedNames.count(kv.first))
      fail(FLASHOPT_ERROR_MISMATCH, file + ": unexpected tensor " +
                                        quote(kv.first) + " (" + form +
                                        " checkpoint of " + m.name + ")");

  // Checksums (checkpoints written before they existed have none).
  if (meta.count("checksums")) {
    json sums = parseJson(meta, "checksums", file);
    if (!sums.is_object())
      fail(FLASHOPT_ERROR_FORMAT,
           file + ": __metadata__ 'checksums' is not an object");
    for (const Expect &e : ex) {
      auto it = sums.find(e.name);
      if (it == sums.end() || !it->is_string())
        fail(FLASHOPT_ERROR_FORMAT, file + ": tensor " + quote(e.name) +
                                        ": __metadata__ 'checksums' has no "
                                        "checksum for it");
      const safetensors::StoredTensor *t = f.find(e.name);
      std::string got = checksumText(t->data, size_t(t->bytes));
      if (it->get<std::string>() != got)
        fail(FLASHOPT_ERROR_FORMAT,
             file + ": tensor " + quote(e.name) + ": data checksum is " + got +
                 ", but __metadata__ 'checksums' records " +
                 it->get<std::string>() + " (the file is corrupt)");
    }
    if (sums.size() != ex.size())
      fail(FLASHOPT_ERROR_FORMAT,
           file + ": __metadata__ 'checksums' names tensors the file does "
                  "not hold");
  }

  // F32 masters must fit the parameter dtype (validated before any copy).
  if (f32)
    for (const Expect &e : ex)
      if (e.state.empty()) {
        const safetensors::StoredTensor *t = f.find(e.name);
        std::vector<float> v(size_t(o.params[size_t(e.param)].numel));
        std::memcpy(v.data(), t->data, size_t(t->bytes));
        checkMasterFits(o, e.param, v.data(), FLASHOPT_ERROR_FORMAT,
                        file + ": tensor " + quote(e.name));
      }

  // ---- copy
  // ------------------------------------------------------------------
  for (const Expect &e : ex) {
    const safetensors::StoredTensor *t = f.find(e.name);
    const ParamRec &p = o.params[size_t(e.param)];
    if (!f32) {
      o.write(e.param, e.buffer, t->data, t->bytes);
      continue;
    }
    // The F32 form: aligned copies of the floats.
    std::vector<float> v(size_t(p.numel));
    std::memcpy(v.data(), t->data, size_t(t->bytes));
    if (e.state.empty()) {
      importMaster(o, e.param, v.data());
      continue;
    }
    const StateSpec *s = nullptr;
    for (const StateSpec &st : m.states)
      if (st.name == e.state)
        s = &st;
    const int64_t ng = (p.numel + m.group_size - 1) / m.group_size;
    std::vector<abi::StateBuffer> layout = abi::state_buffers(*s);
    std::vector<std::vector<uint8_t>> stored;
    std::vector<void *> buffers;
    for (const abi::StateBuffer &b : layout)
      stored.emplace_back(
          size_t((b.per == Per::Group ? ng : p.numel) * dtype_size(b.dtype)));
    for (std::vector<uint8_t> &b : stored)
      buffers.push_back(b.data());
    codec::encode_state(*s, v.data(), m.group_size, p.numel, buffers);
    for (size_t k = 0; k < layout.size(); ++k)
      o.write(e.param, s->name + layout[k].suffix, stored[k].data(),
              int64_t(stored[k].size()));
  }
  for (size_t g = 0; g < hyperValues.size(); ++g)
    for (size_t h = 0; h < m.hypers.size(); ++h) {
      Status s = o.opt->set_hyper(int(g), m.hypers[h].name, hyperValues[g][h]);
      if (!s)
        fail(FLASHOPT_ERROR_INTERNAL, s.message());
    }
  for (size_t i = 0; i < o.params.size(); ++i)
    o.params[i].step = steps[i];
  o.globalStep = globalStep;
  o.skipped = skipped;
  o.opt->set_step_count(globalStep);
}

} // namespace flashopt::capi
