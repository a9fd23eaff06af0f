//===- Load.cpp - Loading checkpoints, all or nothing ---------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A checkpoint (a file, or its bytes in memory) is loaded in three steps:
/// read (the safetensors container), validate (every field against the
/// subject, returning a Plan of everything the load changes, failing before
/// anything is changed) and apply (the plan copied into the optimizer and
/// the stepper). So a rejected file changes nothing.
///
//===----------------------------------------------------------------------===//

#include "checkpoint/Checkpoint.h"

#include "checkpoint/MasterWeights.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <set>

namespace flashopt::checkpoint {

using json = nlohmann::json;
using Metadata = std::map<std::string, std::string>;

namespace {

//===----------------------------------------------------------------------===//
// Validation: fails (Format, Mismatch) naming `file` and the field
//===----------------------------------------------------------------------===//

Status format(std::string message) {
  return Status::error(Code::Format, std::move(message));
}
Status mismatch(std::string message) {
  return Status::error(Code::Mismatch, std::move(message));
}

std::string metaOr(const Metadata &meta, const char *key) {
  auto it = meta.find(key);
  return it == meta.end() ? std::string() : it->second;
}

Expected<int64_t> parseInt(const Metadata &meta, const std::string &key,
                           const std::string &file) {
  auto it = meta.find(key);
  if (it == meta.end())
    return format(file + ": __metadata__ has no " + quote(key));
  try {
    size_t used = 0;
    long long v = std::stoll(it->second, &used);
    if (used != it->second.size() || v < 0)
      throw std::invalid_argument("trailing");
    return int64_t(v);
  } catch (const std::exception &) {
    return format(file + ": __metadata__ " + quote(key) +
                  " is not a non-negative integer: " + quote(it->second));
  }
}

Expected<json> parseJson(const Metadata &meta, const std::string &key,
                         const std::string &file) {
  auto it = meta.find(key);
  if (it == meta.end())
    return format(file + ": __metadata__ has no " + quote(key));
  try {
    return json::parse(it->second);
  } catch (const std::exception &e) {
    return format(file + ": __metadata__ " + quote(key) +
                  " is not valid JSON: " + e.what());
  }
}

/// __metadata__ 'state_encodings' ("<state>=<encoding>;..."): the states in
/// order with their encodings.
Expected<std::vector<std::pair<std::string, std::string>>>
parseEncodings(const std::string &text, const std::string &file) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> seen;
  size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    size_t end = text.find(';', at);
    if (end == std::string::npos)
      end = text.size();
    const std::string entry = text.substr(at, end - at);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == entry.size())
      return format(file + ": __metadata__ 'state_encodings' entry " +
                    quote(entry) + " is not <state>=<encoding>");
    if (!seen.insert(entry.substr(0, eq)).second)
      return format(file + ": __metadata__ 'state_encodings' lists state " +
                    quote(entry.substr(0, eq)) + " more than once");
    out.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
    at = end + 1;
  }
  return out;
}

/// "4-bit exp_avg (i4 e2m1)", "32-bit exp_avg (plain f32)", "exp_avg elided"
/// for encoding `enc` of state `name` (as state_encodings writes it); with
/// `detail`, a quantized state's group and scale too.
std::string describeEncoding(const std::string &name, const std::string &enc,
                             bool detail) {
  std::vector<std::string> f;
  for (size_t at = 0;;) {
    size_t end = enc.find(':', at);
    f.push_back(enc.substr(at, end == std::string::npos ? end : end - at));
    if (end == std::string::npos)
      break;
    at = end + 1;
  }
  auto bits = [](const std::string &dtype) {
    std::optional<DType> t = abi::parse_dtype(dtype);
    return t ? std::to_string(abi::dtype_bits(*t)) + "-bit " : std::string();
  };
  if (f[0] == "quantized" && f.size() == 5)
    return bits(f[1]) + name + " (" + f[1] + " " + f[2] +
           (detail ? ", groups of " + f[3] + ", " + f[4] + " scales" : "") +
           ")";
  if (f[0] == "plain" && f.size() == 2)
    return bits(f[1]) + name + " (plain " + f[1] + ")";
  if (f[0] == "elided" && f.size() == 1)
    return name + " elided";
  return name + " as " + quote(enc);
}

/// __metadata__ 'state_encodings' and 'packing' against this optimizer's.
/// A compressed file of other encodings is a mismatch naming the first state
/// that differs; an f32 one converts (returns true). Files without the key
/// (written before it existed) or of other states (another spec, said by the
/// spec check) return false.
Expected<bool> checkEncodings(const Subject &s, const Metadata &meta, Form form,
                              const std::string &file) {
  const Manifest &m = s.manifest();
  if (meta.count("packing") && metaOr(meta, "packing") != kNibblePacking)
    return format(file + ": unknown __metadata__ 'packing' " +
                  quote(metaOr(meta, "packing")) + " (this library reads " +
                  quote(kNibblePacking) + ")");
  if (!meta.count("state_encodings"))
    return false;
  Expected<std::vector<std::pair<std::string, std::string>>> theirs =
      parseEncodings(metaOr(meta, "state_encodings"), file);
  if (!theirs)
    return theirs.status();
  Expected<std::vector<std::pair<std::string, std::string>>> ours =
      parseEncodings(state_encodings(m), "this optimizer");
  if (!ours)
    return ours.status();
  if (theirs->size() != ours->size())
    return false;
  for (size_t i = 0; i < ours->size(); ++i)
    if ((*theirs)[i].first != (*ours)[i].first)
      return false;
  for (size_t i = 0; i < ours->size(); ++i) {
    const auto &[name, enc] = (*theirs)[i];
    const std::string &here = (*ours)[i].second;
    if (enc == here)
      continue;
    if (form == Form::F32)
      return true;
    // Name the group and scale only when the codes themselves agree
    // ("quantized:<storage>:<compand>" of both).
    auto codes = [](const std::string &e) {
      size_t n = 0, at = 0;
      while (n < 3 && (at = e.find(':', at)) != std::string::npos)
        ++n, ++at;
      return n == 3 ? e.substr(0, at - 1) : e;
    };
    const bool detail = codes(enc) == codes(here);
    return mismatch(file + ": the checkpoint holds " +
                    describeEncoding(name, enc, detail) + ", this optimizer " +
                    describeEncoding(name, here, detail) +
                    ": load its f32 form to convert (checkpoint of spec " +
                    quote(metaOr(meta, "spec")) + ", this optimizer runs " +
                    quote(m.name) + "); nothing was loaded");
  }
  if (form == Form::Compressed && has_packed_buffers(m) &&
      !meta.count("packing"))
    return format(file +
                  ": the checkpoint holds packed 4-bit codes, but "
                  "__metadata__ has no 'packing' (expected " +
                  quote(kNibblePacking) + ")");
  return false;
}

/// The metadata's own checksum, format, version, spec and rule; returns
/// the checkpoint's form.
Expected<Form> checkHeader(const Subject &s, const Metadata &meta,
                           const std::string &file) {
  const Manifest &m = s.manifest();
  // The metadata's own checksum first (files written before it existed, or
  // rewritten by other tools, have none): whatever else is wrong with a
  // corrupted header, this is the clearest thing to say.
  if (meta.count(kMetadataChecksumKey)) {
    std::string got = metadata_checksum(meta);
    if (metaOr(meta, kMetadataChecksumKey) != got)
      return format(file + ": __metadata__ checksum is " + got + ", but '" +
                    kMetadataChecksumKey + "' records " +
                    metaOr(meta, kMetadataChecksumKey) +
                    " (the header is corrupt or was edited)");
  }
  if (metaOr(meta, "format") != kCheckpointFormat)
    return format(file +
                  ": not a flashopt checkpoint (__metadata__ format is " +
                  quote(metaOr(meta, "format")) + ", expected " +
                  quote(kCheckpointFormat) + ")");
  if (metaOr(meta, "format_version") != "1")
    return format(file + ": unsupported checkpoint format_version " +
                  quote(metaOr(meta, "format_version")) +
                  " (this library reads 1)");
  // The state numerics (docs/NUMERICS.md §8) first: the clearest thing to
  // say when a run moves between the bounded and the FlashOptim numerics.
  // Files written before the key existed ran FlashOptim's numerics.
  const std::string numerics = meta.count("numerics")
                                   ? metaOr(meta, "numerics")
                                   : std::string("flashoptim");
  if (numerics != m.numerics)
    return mismatch(file + ": checkpoint written with the " + quote(numerics) +
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
  if (revision != numerics_revision(numerics))
    return mismatch(
        file + ": checkpoint written with revision " + quote(revision) +
        " of the " + quote(numerics) +
        " numerics, but this library writes and reads revision " +
        quote(numerics_revision(numerics)) +
        " (minifloat state codes, docs/NUMERICS.md §8); nothing was "
        "loaded. Move the run through its fp32 master weights and states "
        "(a state dict's fp32 states load as a conversion)");
  const std::string formName = metaOr(meta, "checkpoint");
  if (formName != "compressed" && formName != "f32")
    return format(file + ": unknown checkpoint form " + quote(formName) +
                  " (compressed or f32)");
  const Form form = formName == "f32" ? Form::F32 : Form::Compressed;
  // The state encodings before the spec: a run moving between state widths
  // (8 and 4 bits) is told which state differs and how to convert. Files
  // written before the key existed are checked by the spec alone.
  Expected<bool> converts = checkEncodings(s, meta, form, file);
  if (!converts)
    return converts.status();
  // The f32 form of another state encoding is a conversion: its masters and
  // states are fp32 whatever the spec stored them as, and the parameters,
  // groups, hyper-parameters and tensors are all checked below.
  if (!*converts && (metaOr(meta, "spec") != m.name ||
                     metaOr(meta, "spec_hash") != m.spec_hash))
    return mismatch(file + ": checkpoint of spec " +
                    quote(metaOr(meta, "spec")) + " (" +
                    metaOr(meta, "spec_hash") + "), but this optimizer runs " +
                    quote(m.name) + " (" + m.spec_hash + ")");
  if (meta.count("rule") && metaOr(meta, "rule") != m.rule)
    return mismatch(file + ": checkpoint of rule " +
                    quote(metaOr(meta, "rule")) + ", but this optimizer runs " +
                    quote(m.rule) + " (spec " + quote(m.name) + ")");
  return form;
}

/// One entry of __metadata__ 'params': a tensor of the same name, numel,
/// shape and group. Returns its index; `*step` is its counter.
Expected<int64_t> checkParam(const Subject &s, const json &p,
                             std::set<std::string> &seen,
                             const std::string &file, int64_t *step) {
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string() ||
      !p.contains("group") || !p["group"].is_number_integer() ||
      !p.contains("step") || !p["step"].is_number_integer() ||
      p["step"].get<int64_t>() < 0)
    return format(file + ": __metadata__ 'params' has a malformed entry " +
                  p.dump());
  const std::string name = p["name"].get<std::string>();
  if (!seen.insert(name).second)
    return format(file + ": __metadata__ 'params' lists parameter " +
                  quote(name) + " more than once");
  const int64_t i = s.names().find(name);
  if (i < 0)
    return mismatch(file + ": the checkpoint holds parameter " + quote(name) +
                    ", which is not registered here");
  const int64_t numel = s.numel(i);
  const std::vector<int64_t> &here = s.names().shape(i);
  if (!p.contains("numel") || !p["numel"].is_number_integer())
    return format(file + ": __metadata__ 'params' entry of " + quote(name) +
                  " has no integer 'numel'");
  if (p["numel"].get<int64_t>() != numel)
    return mismatch(file + ": __metadata__ 'params' gives parameter " +
                    quote(name) + " numel " +
                    std::to_string(p["numel"].get<int64_t>()) + ", but " +
                    s.describe(i) + " has " + std::to_string(numel));
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
    return format(file + ": __metadata__ 'params' entry of " + quote(name) +
                  " has no 'shape' list of integers");
  if (shape != here)
    return mismatch(file + ": __metadata__ 'params' gives parameter " +
                    quote(name) + " shape " + shape_string(shape) + ", but " +
                    s.describe(i) + " has shape " + shape_string(here));
  const int64_t group = p["group"].get<int64_t>();
  if (group != s.group(i))
    return mismatch(file + ": parameter " + quote(name) +
                    " is in param group " + std::to_string(group) +
                    " in the checkpoint but in group " +
                    std::to_string(s.group(i)) + " here");
  *step = p["step"].get<int64_t>();
  return i;
}

/// __metadata__ 'params': the same parameters as named here. Returns each
/// one's step counter.
Expected<std::vector<int64_t>>
checkParams(const Subject &s, const Metadata &meta, const std::string &file) {
  Expected<json> params = parseJson(meta, "params", file);
  if (!params)
    return params.status();
  if (!params->is_array())
    return format(file + ": __metadata__ 'params' is not a list");
  const TensorNames &names = s.names();
  std::vector<int64_t> steps(size_t(names.size()), -1);
  std::set<std::string> inFile;
  for (const json &p : *params) {
    int64_t step = 0;
    Expected<int64_t> i = checkParam(s, p, inFile, file, &step);
    if (!i)
      return i.status();
    steps[size_t(*i)] = step;
  }
  for (int64_t i = 0; i < names.size(); ++i)
    if (!inFile.count(names.name(i)))
      return mismatch(file + ": " + s.describe(i) +
                      " is not in the checkpoint");
  return steps;
}

/// __metadata__ 'param_groups': as many groups as here, each with a finite
/// value of every hyper-parameter of the spec (and no other; null for an
/// envelope that no step has set yet), elided states' hypers at 0. Returns
/// the values.
Expected<std::vector<std::vector<std::optional<float>>>>
checkGroups(const Subject &s, const Metadata &meta, const std::string &file) {
  const Manifest &m = s.manifest();
  const int numGroups = s.optimizer().num_param_groups();
  Expected<json> groups = parseJson(meta, "param_groups", file);
  if (!groups)
    return groups.status();
  if (!groups->is_array())
    return format(file + ": __metadata__ 'param_groups' is not a list");
  if (int64_t(groups->size()) != numGroups)
    return mismatch(
        file + ": the checkpoint has " + std::to_string(groups->size()) +
        " param groups, this optimizer " + std::to_string(numGroups));
  std::vector<std::vector<std::optional<float>>> values;
  for (size_t g = 0; g < groups->size(); ++g) {
    const json &obj = (*groups)[g];
    const std::string where = file + ": param group " + std::to_string(g);
    if (!obj.is_object())
      return format(where + " is not an object");
    std::vector<std::optional<float>> vals;
    for (const HyperSpec &h : m.hypers) {
      if (h.is_envelope() && obj.contains(h.name) && obj[h.name].is_null()) {
        vals.push_back(std::nullopt);
        continue;
      }
      if (!obj.contains(h.name) || !obj[h.name].is_number())
        return format(where + " has no number " + quote(h.name));
      float v = float(obj[h.name].get<double>());
      if (!std::isfinite(v))
        return format(where + ": " + quote(h.name) + " is not finite");
      for (const StateSpec &st : m.states)
        if (st.kind == StateKind::Elided && st.elidable_if_zero == h.name &&
            v != 0.0f)
          return mismatch(where + " sets " + quote(h.name) +
                          " nonzero, but its state is elided");
      vals.push_back(v);
    }
    if (obj.size() != m.hypers.size())
      return mismatch(where + " has hyper-parameters this spec does not know");
    values.push_back(std::move(vals));
  }
  return values;
}

/// The tensors: every expected one, with its dtype and shape; nothing else.
Expected<std::vector<Entry>> checkTensors(const Subject &s,
                                          const safetensors::File &f, Form form,
                                          const std::string &file) {
  const std::string formName = form == Form::F32 ? "f32" : "compressed";
  std::vector<Entry> ex = expected_tensors(s, form);
  std::set<std::string> expectedNames;
  for (const Entry &e : ex) {
    expectedNames.insert(e.name);
    const safetensors::StoredTensor *t = f.find(e.name);
    if (!t)
      return mismatch(file + ": tensor " + quote(e.name) + " (" + formName +
                      " form) is missing");
    if (t->dtype != e.dtype)
      return mismatch(file + ": tensor " + quote(e.name) + " is " +
                      safetensors::dtype_name(t->dtype) + ", expected " +
                      safetensors::dtype_name(e.dtype));
    if (t->shape != e.shape)
      return mismatch(file + ": tensor " + quote(e.name) + " has shape " +
                      shape_string(t->shape) + ", but " + s.describe(e.param) +
                      " needs " + shape_string(e.shape));
  }
  for (const auto &kv : f.tensors())
    if (!expectedNames.count(kv.first))
      return mismatch(file + ": unexpected tensor " + quote(kv.first) + " (" +
                      formName + " checkpoint of " + s.manifest().name + ")");
  return ex;
}

/// The tensors' checksums (checkpoints written before they existed have
/// none).
Status checkChecksums(const safetensors::File &f, const std::vector<Entry> &ex,
                      const std::string &file) {
  if (!f.metadata().count("checksums"))
    return Status::success();
  Expected<json> sums = parseJson(f.metadata(), "checksums", file);
  if (!sums)
    return sums.status();
  if (!sums->is_object())
    return format(file + ": __metadata__ 'checksums' is not an object");
  for (const Entry &e : ex) {
    auto it = sums->find(e.name);
    if (it == sums->end() || !it->is_string())
      return format(file + ": tensor " + quote(e.name) +
                    ": __metadata__ 'checksums' has no checksum for it");
    const safetensors::StoredTensor *t = f.find(e.name);
    std::string got = checksum_text(t->data, size_t(t->bytes));
    if (it->get<std::string>() != got)
      return format(file + ": tensor " + quote(e.name) + ": data checksum is " +
                    got + ", but __metadata__ 'checksums' records " +
                    it->get<std::string>() + " (the file is corrupt)");
  }
  if (sums->size() != ex.size())
    return format(file + ": __metadata__ 'checksums' names tensors the file "
                         "does not hold");
  return Status::success();
}

/// The tensor's floats (an aligned copy: the format packs tensors).
std::vector<float> floatsOf(const safetensors::StoredTensor &t) {
  std::vector<float> v(size_t(t.bytes) / sizeof(float));
  std::memcpy(v.data(), t.data, size_t(t.bytes));
  return v;
}

//===----------------------------------------------------------------------===//
// read -> validate -> apply
//===----------------------------------------------------------------------===//

Expected<safetensors::File> readFile(const std::string &path) {
  Expected<safetensors::File> f = safetensors::File::read(path);
  if (!f)
    return f.status().prefixed("checkpoint file " + quote(path) + ": ");
  return f;
}

Expected<safetensors::File> readBuffer(const void *data, size_t size) {
  const auto *b = static_cast<const uint8_t *>(data);
  return safetensors::File::parse(std::vector<uint8_t>(b, b + size),
                                  "checkpoint buffer");
}

Expected<Plan> validatePlan(const Subject &s, const safetensors::File &f,
                            const std::string &file) {
  if (Status st = s.check(); !st)
    return st;
  const Metadata &meta = f.metadata();
  Plan p;
  Expected<Form> form = checkHeader(s, meta, file);
  if (!form)
    return form.status();
  p.form = *form;
  Expected<int64_t> step = parseInt(meta, "step", file);
  if (!step)
    return step.status();
  p.step = *step;
  Expected<int64_t> skipped = parseInt(meta, "skipped_steps", file);
  if (!skipped)
    return skipped.status();
  p.skipped = *skipped;
  Expected<std::vector<int64_t>> steps = checkParams(s, meta, file);
  if (!steps)
    return steps.status();
  p.steps = std::move(steps.value());
  Expected<std::vector<std::vector<std::optional<float>>>> hypers =
      checkGroups(s, meta, file);
  if (!hypers)
    return hypers.status();
  p.hypers = std::move(hypers.value());
  Expected<std::vector<Entry>> tensors = checkTensors(s, f, p.form, file);
  if (!tensors)
    return tensors.status();
  p.tensors = std::move(tensors.value());
  if (Status st = checkChecksums(f, p.tensors, file); !st)
    return st;
  // F32 masters must fit the parameter dtype.
  if (p.form == Form::F32)
    for (const Entry &e : p.tensors)
      if (e.state.empty())
        if (Status st = check_master_fits(
                s, e.param, floatsOf(*f.find(e.name)).data(), Code::Format,
                file + ": tensor " + quote(e.name));
            !st)
          return st;
  return p;
}

Status applyPlan(const Subject &s, const safetensors::File &f, const Plan &p) {
  const Manifest &m = s.manifest();
  for (const Entry &e : p.tensors) {
    const safetensors::StoredTensor *t = f.find(e.name);
    Status st;
    if (p.form == Form::Compressed) {
      st = s.write(e.param, e.buffer, t->data, t->bytes);
    } else if (e.state.empty()) {
      st = import_master(s, e.param, floatsOf(*t).data());
    } else {
      Expected<const StateSpec *> state = state_named(m, e.state);
      st = state ? import_state(s, e.param, **state, floatsOf(*t).data())
                 : state.status();
    }
    if (!st)
      return st;
  }
  host::Optimizer &opt = s.optimizer();
  for (size_t g = 0; g < p.hypers.size(); ++g)
    for (size_t h = 0; h < m.hypers.size(); ++h)
      if (Status st =
              opt.restore_hyper(int(g), m.hypers[h].name, p.hypers[g][h]);
          !st)
        return st;
  s.stepper().restore(p.steps, p.step, p.skipped);
  return Status::success();
}

} // namespace

Expected<safetensors::File> read_file(const std::string &path) {
  return no_throw([&] { return readFile(path); });
}

Expected<safetensors::File> read_buffer(const void *data, size_t size) {
  return no_throw([&] { return readBuffer(data, size); });
}

Expected<Plan> validate(const Subject &s, const safetensors::File &file,
                        const std::string &origin) {
  return no_throw([&] { return validatePlan(s, file, origin); });
}

Status apply(const Subject &s, const safetensors::File &file,
             const Plan &plan) {
  return no_throw([&] { return applyPlan(s, file, plan); });
}

Status load_file(const Subject &s, const std::string &path) {
  Expected<safetensors::File> f = read_file(path);
  if (!f)
    return f.status();
  Expected<Plan> plan = validate(s, *f, quote(path));
  if (!plan)
    return plan.status();
  return apply(s, *f, *plan);
}

Status load_buffer(const Subject &s, const void *data, size_t size) {
  Expected<safetensors::File> f = read_buffer(data, size);
  if (!f)
    return f.status();
  Expected<Plan> plan = validate(s, *f, "checkpoint buffer");
  if (!plan)
    return plan.status();
  return apply(s, *f, *plan);
}

} // namespace flashopt::checkpoint
