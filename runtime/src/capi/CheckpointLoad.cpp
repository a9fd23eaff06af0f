//===- CheckpointLoad.cpp - Loading checkpoints, all or nothing -----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A checkpoint (a file, or its bytes in memory) is loaded in two phases:
/// validate() reads every field against the optimizer and returns a Plan of
/// everything the load changes, failing before anything is changed; apply()
/// then copies the plan into the optimizer. So a rejected file changes
/// nothing.
///
//===----------------------------------------------------------------------===//

#include "Checkpoint.h"

#include "CheckpointFormat.h"
#include "MasterWeights.h"
#include "safetensors/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

namespace flashopt::capi {

using json = nlohmann::json;
using Metadata = std::map<std::string, std::string>;

namespace {

/// Everything a load changes, validated against the optimizer.
struct Plan {
  bool f32 = false; ///< the f32 form (else compressed)
  std::vector<Expect> tensors;
  std::vector<int64_t> steps; ///< [parameter] its step counter
  int64_t step = 0, skipped = 0;
  std::vector<std::vector<std::optional<float>>> hypers; ///< [group][hyper]
};

//===----------------------------------------------------------------------===//
// Validation: fails (FORMAT, MISMATCH) naming `file` and the field
//===----------------------------------------------------------------------===//

std::string metaOr(const Metadata &meta, const char *key) {
  auto it = meta.find(key);
  return it == meta.end() ? std::string() : it->second;
}

int64_t parseInt(const Metadata &meta, const std::string &key,
                 const std::string &file) {
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

json parseJson(const Metadata &meta, const std::string &key,
               const std::string &file) {
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

/// The metadata's own checksum, format, version, spec and rule; returns
/// whether the checkpoint is of the f32 form.
bool checkHeader(const OptObj &o, const Metadata &meta,
                 const std::string &file) {
  const Manifest &m = *o.m;
  // The metadata's own checksum first (files written before it existed, or
  // rewritten by other tools, have none): whatever else is wrong with a
  // corrupted header, this is the clearest thing to say.
  if (meta.count(kMetadataChecksumKey)) {
    std::string got = metadataChecksum(meta);
    if (metaOr(meta, kMetadataChecksumKey) != got)
      fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ checksum is " + got +
                                      ", but '" + kMetadataChecksumKey +
                                      "' records " +
                                      metaOr(meta, kMetadataChecksumKey) +
                                      " (the header is corrupt or was edited)");
  }
  if (metaOr(meta, "format") != kCheckpointFormat)
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": not a flashopt checkpoint (__metadata__ format is " +
             quote(metaOr(meta, "format")) + ", expected " +
             quote(kCheckpointFormat) + ")");
  if (metaOr(meta, "format_version") != "1")
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": unsupported checkpoint format_version " +
             quote(metaOr(meta, "format_version")) + " (this library reads 1)");
  // The state numerics (docs/NUMERICS.md §8) first: the clearest thing to
  // say when a run moves between the bounded and the FlashOptim numerics.
  // Files written before the key existed ran FlashOptim's numerics.
  const std::string numerics = meta.count("numerics")
                                   ? metaOr(meta, "numerics")
                                   : std::string("flashoptim");
  if (numerics != m.numerics)
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": checkpoint written with the " + quote(numerics) +
             " numerics (spec " + quote(metaOr(meta, "spec")) +
             "), but this optimizer runs the " + quote(m.numerics) +
             " numerics (spec " + quote(m.name) +
             "); nothing was loaded. Load it into an optimizer with the "
             "same numerics, or move the run through its fp32 master "
             "weights and states");
  // The bounded numerics' first revision (FlashOptim's linear codes,
  // dithered in time; no numerics_revision key) stored other codes.
  const std::string revision = meta.count("numerics_revision")
                                   ? metaOr(meta, "numerics_revision")
                                   : std::string("1");
  if (revision != numericsRevision(numerics))
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": checkpoint written with revision " + quote(revision) +
             " of the " + quote(numerics) +
             " numerics, but this library writes and reads revision " +
             quote(numericsRevision(numerics)) +
             " (minifloat state codes, docs/NUMERICS.md §8); nothing was "
             "loaded. Move the run through its fp32 master weights and states "
             "(a state dict's fp32 states load as a conversion)");
  if (metaOr(meta, "spec") != m.name ||
      metaOr(meta, "spec_hash") != m.spec_hash)
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": checkpoint of spec " + quote(metaOr(meta, "spec")) + " (" +
             metaOr(meta, "spec_hash") + "), but this optimizer runs " +
             quote(m.name) + " (" + m.spec_hash + ")");
  if (meta.count("rule") && metaOr(meta, "rule") != m.rule)
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": checkpoint of rule " + quote(metaOr(meta, "rule")) +
             ", but this optimizer runs " + quote(m.rule) + " (spec " +
             quote(m.name) + ")");
  const std::string form = metaOr(meta, "checkpoint");
  if (form != "compressed" && form != "f32")
    fail(FLASHOPT_ERROR_FORMAT, file + ": unknown checkpoint form " +
                                    quote(form) + " (compressed or f32)");
  return form == "f32";
}

/// One entry of __metadata__ 'params': a registered parameter of the same
/// numel, shape and group. Returns its index; `*step` is its counter.
int64_t checkParam(const OptObj &o, const json &p, std::set<std::string> &seen,
                   const std::string &file, int64_t *step) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string() ||
      !p.contains("group") || !p["group"].is_number_integer() ||
      !p.contains("step") || !p["step"].is_number_integer() ||
      p["step"].get<int64_t>() < 0)
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": __metadata__ 'params' has a malformed entry " + p.dump());
  const std::string name = p["name"].get<std::string>();
  if (!seen.insert(name).second)
    fail(FLASHOPT_ERROR_FORMAT, file +
                                    ": __metadata__ 'params' lists "
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
             " numel " + std::to_string(p["numel"].get<int64_t>()) + ", but " +
             o.describe(it->second) + " has " + std::to_string(here.numel));
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
             o.describe(it->second) + " has shape " + shapeString(here.shape));
  const int64_t group = p["group"].get<int64_t>();
  if (group != here.group)
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": parameter " + quote(name) + " is in param group " +
             std::to_string(group) + " in the checkpoint but in group " +
             std::to_string(here.group) + " here");
  *step = p["step"].get<int64_t>();
  return it->second;
}

/// __metadata__ 'params': the same parameters as registered here. Returns
/// each one's step counter.
std::vector<int64_t> checkParams(const OptObj &o, const Metadata &meta,
                                 const std::string &file) {
  json params = parseJson(meta, "params", file);
  if (!params.is_array())
    fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ 'params' is not a list");
  std::vector<int64_t> steps(o.params.size(), -1);
  std::set<std::string> inFile;
  for (const json &p : params) {
    int64_t step = 0;
    const int64_t i = checkParam(o, p, inFile, file, &step);
    steps[size_t(i)] = step;
  }
  for (size_t i = 0; i < o.params.size(); ++i)
    if (!inFile.count(o.params[i].name))
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": " + o.describe(int64_t(i)) + " is not in the checkpoint");
  return steps;
}

/// __metadata__ 'param_groups': as many groups as here, each with a finite
/// value of every hyper-parameter of the spec (and no other; null for an
/// envelope that no step has set yet), elided states' hypers at 0. Returns
/// the values.
std::vector<std::vector<std::optional<float>>>
checkGroups(const OptObj &o, const Metadata &meta, const std::string &file) {
  const Manifest &m = *o.m;
  json groups = parseJson(meta, "param_groups", file);
  if (!groups.is_array())
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": __metadata__ 'param_groups' is not a list");
  if (int64_t(groups.size()) != o.opt->num_param_groups())
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": the checkpoint has " + std::to_string(groups.size()) +
             " param groups, this optimizer " +
             std::to_string(o.opt->num_param_groups()));
  std::vector<std::vector<std::optional<float>>> values;
  for (size_t g = 0; g < groups.size(); ++g) {
    const json &obj = groups[g];
    const std::string where = file + ": param group " + std::to_string(g);
    if (!obj.is_object())
      fail(FLASHOPT_ERROR_FORMAT, where + " is not an object");
    std::vector<std::optional<float>> vals;
    for (const HyperSpec &h : m.hypers) {
      if (h.is_envelope() && obj.contains(h.name) && obj[h.name].is_null()) {
        vals.push_back(std::nullopt);
        continue;
      }
      if (!obj.contains(h.name) || !obj[h.name].is_number())
        fail(FLASHOPT_ERROR_FORMAT, where + " has no number " + quote(h.name));
      float v = float(obj[h.name].get<double>());
      if (!std::isfinite(v))
        fail(FLASHOPT_ERROR_FORMAT,
             where + ": " + quote(h.name) + " is not finite");
      for (const StateSpec &s : m.states)
        if (s.kind == StateKind::Elided && s.elidable_if_zero == h.name &&
            v != 0.0f)
          fail(FLASHOPT_ERROR_MISMATCH, where + " sets " + quote(h.name) +
                                            " nonzero, but its state is "
                                            "elided");
      vals.push_back(v);
    }
    if (obj.size() != m.hypers.size())
      fail(FLASHOPT_ERROR_MISMATCH,
           where + " has hyper-parameters this spec does not know");
    values.push_back(std::move(vals));
  }
  return values;
}

/// The tensors: every expected one, with its dtype and shape; nothing else.
std::vector<Expect> checkTensors(const OptObj &o, const safetensors::File &f,
                                 bool f32, const std::string &file) {
  const std::string form = f32 ? "f32" : "compressed";
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
                                        " checkpoint of " + o.m->name + ")");
  return ex;
}

/// The tensors' checksums (checkpoints written before they existed have
/// none).
void checkChecksums(const safetensors::File &f, const std::vector<Expect> &ex,
                    const std::string &file) {
  if (!f.metadata().count("checksums"))
    return;
  json sums = parseJson(f.metadata(), "checksums", file);
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

/// The tensor's floats (an aligned copy: the format packs tensors).
std::vector<float> floatsOf(const safetensors::StoredTensor &t) {
  std::vector<float> v(size_t(t.bytes) / sizeof(float));
  std::memcpy(v.data(), t.data, size_t(t.bytes));
  return v;
}

/// Reads and checks every field of `f` against `o`, in the order a reader
/// of the file meets them; nothing is changed.
Plan validate(const OptObj &o, const safetensors::File &f,
              const std::string &file) {
  const Metadata &meta = f.metadata();
  Plan p;
  p.f32 = checkHeader(o, meta, file);
  p.step = parseInt(meta, "step", file);
  p.skipped = parseInt(meta, "skipped_steps", file);
  p.steps = checkParams(o, meta, file);
  p.hypers = checkGroups(o, meta, file);
  p.tensors = checkTensors(o, f, p.f32, file);
  checkChecksums(f, p.tensors, file);
  // F32 masters must fit the parameter dtype.
  if (p.f32)
    for (const Expect &e : p.tensors)
      if (e.state.empty())
        checkMasterFits(o, e.param, floatsOf(*f.find(e.name)).data(),
                        FLASHOPT_ERROR_FORMAT,
                        file + ": tensor " + quote(e.name));
  return p;
}

//===----------------------------------------------------------------------===//
// Applying a validated plan
//===----------------------------------------------------------------------===//

/// Copies the validated checkpoint into `o`: buffers (compressed), or
/// masters and states through the codec (f32), hyper-parameters, counters.
void apply(OptObj &o, const safetensors::File &f, const Plan &p) {
  const Manifest &m = *o.m;
  for (const Expect &e : p.tensors) {
    const safetensors::StoredTensor *t = f.find(e.name);
    if (!p.f32) {
      o.write(e.param, e.buffer, t->data, t->bytes);
      continue;
    }
    std::vector<float> v = floatsOf(*t);
    if (e.state.empty()) {
      importMaster(o, e.param, v.data());
      continue;
    }
    importState(o, e.param, stateNamed(m, e.state), v.data());
  }
  for (size_t g = 0; g < p.hypers.size(); ++g)
    for (size_t h = 0; h < m.hypers.size(); ++h)
      if (Status s =
              o.opt->restore_hyper(int(g), m.hypers[h].name, p.hypers[g][h]);
          !s)
        fail(s);
  o.trainer->restore(p.steps, p.step, p.skipped);
}

} // namespace

void loadCheckpoint(OptObj &o, const std::string &path) {
  const std::string file = quote(path);
  int err = 0;
  if (!fileExists(path, &err))
    fail(err == ENOENT || err == ENOTDIR ? FLASHOPT_ERROR_NOT_FOUND
                                         : FLASHOPT_ERROR_IO,
         "checkpoint file " + file + ": " + std::strerror(err));
  Expected<safetensors::File> f = safetensors::File::read(path);
  if (!f)
    fail(f.status(), "checkpoint file " + file + ": " + f.error());
  apply(o, *f, validate(o, *f, file));
}

void loadCheckpointBuffer(OptObj &o, const void *data, size_t size) {
  const std::string origin = "checkpoint buffer";
  const auto *b = static_cast<const uint8_t *>(data);
  Expected<safetensors::File> f =
      safetensors::File::parse(std::vector<uint8_t>(b, b + size), origin);
  if (!f)
    fail(f.status());
  apply(o, *f, validate(o, *f, origin));
}

} // namespace flashopt::capi
