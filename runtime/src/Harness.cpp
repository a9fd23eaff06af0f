//===- Harness.cpp - Host harness for flashopt CPU kernels ------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Manifest parsing, bundle loading, state arenas, the tensor and hyper
/// tables, and the thread pool that runs a CPU step kernel over
/// group-aligned chunks. See Harness.h and docs/KERNEL-ABI.md.
///
/// Exceptions are used inside this file only (JSON access, allocation) and
/// are always turned into a Status before returning to the caller.
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/Harness.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <new>
#include <set>
#include <sstream>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define FLASHOPT_HOST_X86 1
#endif

namespace flashopt::host {

using json = nlohmann::json;

//===----------------------------------------------------------------------===//
// Dtypes
//===----------------------------------------------------------------------===//

const char *dtype_name(DType t) {
  switch (t) {
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::F32:
    return "f32";
  case DType::I8:
    return "i8";
  case DType::U8:
    return "ui8";
  case DType::I16:
    return "i16";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "bf16")
    return DType::BF16;
  if (name == "f16")
    return DType::F16;
  if (name == "f32")
    return DType::F32;
  if (name == "i8")
    return DType::I8;
  if (name == "ui8")
    return DType::U8;
  if (name == "i16")
    return DType::I16;
  return std::nullopt;
}

int dtype_size(DType t) {
  switch (t) {
  case DType::F32:
    return 4;
  case DType::BF16:
  case DType::F16:
  case DType::I16:
    return 2;
  case DType::I8:
  case DType::U8:
    return 1;
  }
  return 0;
}

//===----------------------------------------------------------------------===//
// Manifest
//===----------------------------------------------------------------------===//

int Manifest::hyper_index(std::string_view n) const {
  for (size_t i = 0; i < hypers.size(); ++i)
    if (hypers[i].name == n)
      return int(i);
  return -1;
}

int Manifest::buffer_index(std::string_view n) const {
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].name == n)
      return int(i);
  return -1;
}

BytesPerParam Manifest::computed_bytes_per_param() const {
  BytesPerParam b;
  for (const BufferSpec &buf : buffers) {
    double per = buf.per == Per::Group
                     ? double(dtype_size(buf.dtype)) / double(group_size)
                     : double(dtype_size(buf.dtype));
    switch (buf.role) {
    case BufferRole::Param:
      b.param += per;
      break;
    case BufferRole::Correction:
      b.correction += per;
      break;
    case BufferRole::Grad:
      b.grad += per;
      break;
    case BufferRole::State:
      b.states += per;
      break;
    }
  }
  b.total = b.param + b.correction + b.grad + b.states;
  b.total_with_grad_release = b.total - b.grad;
  return b;
}

namespace {

/// Thrown inside the parser only; always caught in parse_manifest.
struct ManifestError {
  std::string message;
};

std::string quote(const std::string &s) { return "\"" + s + "\""; }

std::string describe(const json &j) {
  std::string s = j.dump();
  if (s.size() > 60)
    s = s.substr(0, 57) + "...";
  return s;
}

std::string typeName(const json &j) {
  return j.is_null() ? "null" : std::string(j.type_name());
}

class Parser {
public:
  explicit Parser(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string &field, const std::string &what) {
    if (field.empty())
      throw ManifestError{origin_ + ": " + what};
    throw ManifestError{origin_ + ": field '" + field + "': " + what};
  }

  static std::string join(const std::string &path, const std::string &key) {
    return path.empty() ? key : path + "." + key;
  }
  static std::string index(const std::string &path, size_t i) {
    return path + "[" + std::to_string(i) + "]";
  }

  const json &member(const json &obj, const std::string &path,
                     const std::string &key) {
    auto it = obj.find(key);
    if (it == obj.end())
      fail(join(path, key), "missing");
    return *it;
  }

  const json &object(const json &obj, const std::string &path,
                     const std::string &key) {
    const json &v = member(obj, path, key);
    if (!v.is_object())
      fail(join(path, key), "expected an object, got " + typeName(v));
    return v;
  }

  const json &array(const json &obj, const std::string &path,
                    const std::string &key) {
    const json &v = member(obj, path, key);
    if (!v.is_array())
      fail(join(path, key), "expected an array, got " + typeName(v));
    return v;
  }

  std::string string(const json &obj, const std::string &path,
                     const std::string &key, bool nonEmpty = true) {
    const json &v = member(obj, path, key);
    if (!v.is_string())
      fail(join(path, key), "expected a string, got " + typeName(v) + " " +
                                describe(v));
    std::string s = v.get<std::string>();
    if (nonEmpty && s.empty())
      fail(join(path, key), "must not be empty");
    return s;
  }

  int64_t integer(const json &obj, const std::string &path,
                  const std::string &key) {
    const json &v = member(obj, path, key);
    if (!v.is_number_integer())
      fail(join(path, key), "expected an integer, got " + typeName(v) + " " +
                                describe(v));
    return v.get<int64_t>();
  }

  double number(const json &obj, const std::string &path,
                const std::string &key) {
    const json &v = member(obj, path, key);
    if (!v.is_number())
      fail(join(path, key), "expected a number, got " + typeName(v) + " " +
                                describe(v));
    return v.get<double>();
  }

  DType dtype(const json &obj, const std::string &path, const std::string &key,
              std::initializer_list<DType> allowed, const char *context) {
    std::string s = string(obj, path, key);
    std::optional<DType> t = parse_dtype(s);
    bool ok = t && std::find(allowed.begin(), allowed.end(), *t) != allowed.end();
    if (!ok) {
      std::string list;
      for (DType a : allowed)
        list += std::string(list.empty() ? "" : ", ") + dtype_name(a);
      fail(join(path, key), std::string("expected one of ") + list +
                                (context ? std::string(" (") + context + ")" : "") +
                                ", got " + quote(s));
    }
    return *t;
  }

  Manifest parse(const json &root);

private:
  std::string origin_;
};

Manifest Parser::parse(const json &root) {
  Manifest m;
  m.path = origin_;
  if (!root.is_object())
    fail("", "expected a JSON object at the top level, got " + typeName(root));

  m.format = string(root, "", "format");
  if (m.format != "flashopt-manifest")
    fail("format", "expected \"flashopt-manifest\", got " + quote(m.format));
  m.format_version = integer(root, "", "format_version");
  if (m.format_version != 1)
    fail("format_version", "unsupported version " +
                               std::to_string(m.format_version) +
                               " (this runtime reads version 1)");
  m.generator = string(root, "", "generator");
  m.name = string(root, "", "name");
  m.spec_hash = string(root, "", "spec_hash");
  m.rule = string(root, "", "rule");

  m.group_size = integer(root, "", "group_size");
  if (m.group_size < 1 || m.group_size > 65536 ||
      (m.group_size & (m.group_size - 1)) != 0)
    fail("group_size", "expected a power of two in [1, 65536], got " +
                           std::to_string(m.group_size));

  // param / grad
  const json &param = object(root, "", "param");
  m.param = dtype(param, "param", "dtype", {DType::BF16, DType::F16, DType::F32},
                  nullptr);
  {
    std::string c = string(param, "param", "correction");
    if (c == "none") {
      m.correction = std::nullopt;
    } else {
      m.correction = dtype(param, "param", "correction", {DType::I8, DType::I16},
                           "or \"none\"");
      if (m.param == DType::F32)
        fail("param.correction", "an f32 parameter takes no correction term, got " +
                                     quote(c));
    }
  }
  m.grad = dtype(root, "", "grad", {DType::BF16, DType::F16, DType::F32}, nullptr);

  // hypers
  const json &hypers = array(root, "", "hypers");
  std::set<std::string> hyperNames;
  for (size_t i = 0; i < hypers.size(); ++i) {
    std::string p = index("hypers", i);
    if (!hypers[i].is_object())
      fail(p, "expected an object, got " + typeName(hypers[i]));
    HyperSpec h;
    h.name = string(hypers[i], p, "name");
    if (!hyperNames.insert(h.name).second)
      fail(join(p, "name"), "duplicate hyper-parameter " + quote(h.name));
    const json &d = member(hypers[i], p, "default");
    if (d.is_null()) {
      h.default_value = std::nullopt;
    } else if (d.is_number()) {
      h.default_value = float(d.get<double>());
    } else {
      fail(join(p, "default"), "expected a number or null, got " + typeName(d) +
                                   " " + describe(d));
    }
    m.hypers.push_back(h);
  }

  // states
  const json &states = array(root, "", "states");
  std::set<std::string> stateNames;
  for (size_t i = 0; i < states.size(); ++i) {
    std::string p = index("states", i);
    if (!states[i].is_object())
      fail(p, "expected an object, got " + typeName(states[i]));
    StateSpec s;
    s.name = string(states[i], p, "name");
    if (s.name == "param" || s.name == "grad" || s.name == "correction")
      fail(join(p, "name"), "reserved buffer name " + quote(s.name));
    if (!stateNames.insert(s.name).second)
      fail(join(p, "name"), "duplicate state " + quote(s.name));
    std::string ep = join(p, "encoding");
    const json &enc = object(states[i], p, "encoding");
    std::string kind = string(enc, ep, "kind");
    if (kind == "quantized") {
      s.kind = StateKind::Quantized;
      s.storage = dtype(enc, ep, "storage", {DType::I8, DType::U8}, "quantized");
      s.group = integer(enc, ep, "group");
      if (s.group != m.group_size)
        fail(join(ep, "group"), "is " + std::to_string(s.group) +
                                    " but group_size is " +
                                    std::to_string(m.group_size));
      s.compand = string(enc, ep, "compand");
      if (s.compand != "none" && s.compand != "softsign" && s.compand != "sqrt")
        fail(join(ep, "compand"),
             "expected one of none, softsign, sqrt, got " + quote(s.compand));
      if (s.compand == "softsign" && s.storage != DType::I8)
        fail(join(ep, "compand"), "softsign needs i8 storage");
      if (s.compand == "sqrt" && s.storage != DType::U8)
        fail(join(ep, "compand"), "sqrt needs ui8 storage");
      s.scale = dtype(enc, ep, "scale", {DType::F16, DType::BF16, DType::F32},
                      nullptr);
    } else if (kind == "plain") {
      s.kind = StateKind::Plain;
      s.storage = dtype(enc, ep, "storage", {DType::F32, DType::BF16, DType::F16},
                        "plain");
    } else if (kind == "elided") {
      s.kind = StateKind::Elided;
    } else {
      fail(join(ep, "kind"),
           "expected one of quantized, plain, elided, got " + quote(kind));
    }
    if (states[i].contains("elidable_if_zero")) {
      s.elidable_if_zero = string(states[i], p, "elidable_if_zero");
      if (!hyperNames.count(s.elidable_if_zero))
        fail(join(p, "elidable_if_zero"),
             "names an unknown hyper-parameter " + quote(s.elidable_if_zero));
    }
    if (s.kind == StateKind::Elided && s.elidable_if_zero.empty())
      fail(join(p, "elidable_if_zero"),
           "missing: an elided state must name the hyper-parameter that keeps "
           "it zero");
    m.states.push_back(s);
  }

  // The buffers the ABI implies, which the manifest's list must match.
  std::vector<BufferSpec> expected;
  expected.push_back({"param", m.param, Per::Element, true, BufferRole::Param});
  if (m.correction)
    expected.push_back(
        {"correction", *m.correction, Per::Element, true, BufferRole::Correction});
  expected.push_back({"grad", m.grad, Per::Element, false, BufferRole::Grad});
  for (const StateSpec &s : m.states) {
    if (s.kind == StateKind::Quantized) {
      expected.push_back(
          {s.name + ".codes", s.storage, Per::Element, true, BufferRole::State});
      expected.push_back(
          {s.name + ".scales", s.scale, Per::Group, true, BufferRole::State});
    } else if (s.kind == StateKind::Plain) {
      expected.push_back({s.name, s.storage, Per::Element, true, BufferRole::State});
    }
  }
  auto render = [](const BufferSpec &b) {
    return quote(b.name) + " (" + dtype_name(b.dtype) + ", per " +
           (b.per == Per::Group ? "group" : "element") + ", " +
           (b.writable ? "readwrite" : "read") + ")";
  };
  const json &buffers = array(root, "", "buffers");
  for (size_t i = 0; i < buffers.size(); ++i) {
    std::string p = index("buffers", i);
    if (!buffers[i].is_object())
      fail(p, "expected an object, got " + typeName(buffers[i]));
    BufferSpec b;
    b.name = string(buffers[i], p, "name");
    std::string dt = string(buffers[i], p, "dtype");
    std::optional<DType> t = parse_dtype(dt);
    if (!t)
      fail(join(p, "dtype"),
           "expected one of bf16, f16, f32, i8, ui8, i16, got " + quote(dt));
    b.dtype = *t;
    std::string per = string(buffers[i], p, "per");
    if (per != "element" && per != "group")
      fail(join(p, "per"), "expected \"element\" or \"group\", got " + quote(per));
    b.per = per == "group" ? Per::Group : Per::Element;
    std::string access = string(buffers[i], p, "access");
    if (access != "read" && access != "readwrite")
      fail(join(p, "access"),
           "expected \"read\" or \"readwrite\", got " + quote(access));
    b.writable = access == "readwrite";
    if (i >= expected.size())
      fail(p, "unexpected buffer " + render(b) + ": param, correction, grad and "
              "states imply only " + std::to_string(expected.size()) + " buffers");
    const BufferSpec &e = expected[i];
    if (b.name != e.name || b.dtype != e.dtype || b.per != e.per ||
        b.writable != e.writable)
      fail(p, "expected buffer " + render(e) + " (from param, grad and states), "
              "got " + render(b));
    b.role = e.role;
    m.buffers.push_back(b);
  }
  if (m.buffers.size() != expected.size())
    fail("buffers", "has " + std::to_string(m.buffers.size()) +
                        " entries, expected " + std::to_string(expected.size()) +
                        " (missing " + render(expected[m.buffers.size()]) + ")");

  // table
  const json &table = object(root, "", "table");
  m.header_words = integer(table, "table", "header_words");
  if (m.header_words != 4)
    fail("table.header_words",
         "expected 4, got " + std::to_string(m.header_words));
  m.record_words = integer(table, "table", "record_words");
  if (m.record_words != 4 + int64_t(m.buffers.size()))
    fail("table.record_words", "expected " +
                                   std::to_string(4 + m.buffers.size()) +
                                   " (4 + buffers), got " +
                                   std::to_string(m.record_words));

  // bytes_per_param: must agree with the buffers.
  const json &bpp = object(root, "", "bytes_per_param");
  BytesPerParam &b = m.bytes_per_param;
  b.param = number(bpp, "bytes_per_param", "param");
  b.correction = number(bpp, "bytes_per_param", "correction");
  b.grad = number(bpp, "bytes_per_param", "grad");
  b.states = number(bpp, "bytes_per_param", "states");
  b.total = number(bpp, "bytes_per_param", "total");
  b.total_with_grad_release = number(bpp, "bytes_per_param", "total_with_grad_release");
  BytesPerParam c = m.computed_bytes_per_param();
  auto check = [&](const char *key, double stated, double computed) {
    if (std::fabs(stated - computed) > 1e-6) {
      std::ostringstream os;
      os << "is " << stated << " but the buffers give " << computed;
      fail(std::string("bytes_per_param.") + key, os.str());
    }
  };
  check("param", b.param, c.param);
  check("correction", b.correction, c.correction);
  check("grad", b.grad, c.grad);
  check("states", b.states, c.states);
  check("total", b.total, c.total);
  check("total_with_grad_release", b.total_with_grad_release,
        c.total_with_grad_release);

  // kernels
  const json &kernels = array(root, "", "kernels");
  for (size_t i = 0; i < kernels.size(); ++i) {
    std::string p = index("kernels", i);
    if (!kernels[i].is_object())
      fail(p, "expected an object, got " + typeName(kernels[i]));
    KernelEntry k;
    k.target = string(kernels[i], p, "target");
    if (k.target == "cpu") {
      k.cpu = string(kernels[i], p, "cpu");
      const json &f = array(kernels[i], p, "features");
      for (size_t j = 0; j < f.size(); ++j) {
        if (!f[j].is_string())
          fail(index(join(p, "features"), j),
               "expected a string, got " + typeName(f[j]));
        k.features.push_back(f[j].get<std::string>());
      }
      k.file = string(kernels[i], p, "file");
      k.symbol = string(kernels[i], p, "symbol");
    } else {
      // GPU (and unknown) targets: keep what is there; the GPU runtime
      // checks what it needs when it selects a kernel.
      const json &e = kernels[i];
      auto str = [&](const char *key, std::string &out) {
        if (e.contains(key) && e[key].is_string())
          out = e[key].get<std::string>();
      };
      auto num = [&](const char *key, int &out) {
        if (e.contains(key) && e[key].is_number_integer()) {
          int64_t v = e[key].get<int64_t>();
          if (v >= 0 && v <= std::numeric_limits<int>::max())
            out = int(v);
        }
      };
      str("file", k.file);
      str("symbol", k.symbol);
      str("cubin", k.cubin);
      num("threads_per_block", k.threads_per_block);
      num("elements_per_thread", k.elements_per_thread);
      num("registers", k.registers);
      num("spill_stores", k.spill_stores);
      num("spill_loads", k.spill_loads);
    }
    m.kernels.push_back(std::move(k));
  }
  return m;
}

} // namespace

Expected<Manifest> parse_manifest(std::string_view text,
                                  const std::string &origin) {
  try {
    json root;
    try {
      root = json::parse(text.begin(), text.end());
    } catch (const json::parse_error &e) {
      return Status::error(origin + ": invalid JSON: " + e.what());
    }
    return Parser(origin).parse(root);
  } catch (const ManifestError &e) {
    return Status::error(e.message);
  } catch (const std::exception &e) {
    return Status::error(origin + ": " + e.what());
  } catch (...) {
    return Status::error(origin + ": unknown error while reading the manifest");
  }
}

Expected<Manifest> load_manifest(const std::string &path) {
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      int err = errno;
      return Status::error(path + ": cannot open (" + std::strerror(err) + ")");
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad())
      return Status::error(path + ": read error");
    return parse_manifest(ss.str(), path);
  } catch (const std::exception &e) {
    return Status::error(path + ": " + e.what());
  }
}

Expected<int> find_buffer(const Manifest &m, std::string_view name) {
  int b = m.buffer_index(name);
  if (b >= 0)
    return b;
  std::string names;
  for (const BufferSpec &s : m.buffers)
    names += (names.empty() ? "" : ", ") + s.name;
  return Status::error("buffer: " + m.name + " has no buffer \"" +
                       std::string(name) + "\" (buffers: " + names + ")");
}

//===----------------------------------------------------------------------===//
// Hyper table, tensor table records, bytes report
//===----------------------------------------------------------------------===//

Status HyperTable::check_manifest(const Manifest &m) {
  for (const StateSpec &s : m.states)
    if (s.kind == StateKind::Elided) {
      int h = m.hyper_index(s.elidable_if_zero);
      if (h < 0)
        continue; // the parser guarantees it exists
      const HyperSpec &hs = m.hypers[size_t(h)];
      if (hs.default_value && *hs.default_value != 0.0f)
        return Status::error(m.path + ": state \"" + s.name +
                             "\" is elided, but hyper-parameter \"" + hs.name +
                             "\" defaults to a nonzero value");
    }
  return Status::success();
}

int HyperTable::add_slot() {
  size_t H = m_->hypers.size();
  try {
    // Reserve first, so the pushes below cannot throw.
    values_.reserve(values_.size() + H);
    given_.reserve(given_.size() + H);
  } catch (const std::exception &) {
    return -1;
  }
  for (const HyperSpec &h : m_->hypers) {
    values_.push_back(h.default_value.value_or(0.0f));
    given_.push_back(h.default_value.has_value());
  }
  ++generation_;
  return slots_++;
}

Status HyperTable::check(int slot, std::string_view name, int *index) const {
  if (slot < 0 || slot >= slots_)
    return Status::error("param group " + std::to_string(slot) +
                         " does not exist (there are " + std::to_string(slots_) +
                         ")");
  int h = m_->hyper_index(name);
  if (h < 0) {
    std::string names;
    for (const HyperSpec &s : m_->hypers)
      names += (names.empty() ? "" : ", ") + s.name;
    return Status::error("unknown hyper-parameter \"" + std::string(name) +
                         "\" for " + m_->name + " (known: " + names + ")");
  }
  *index = h;
  return Status::success();
}

Status HyperTable::set(int slot, std::string_view name, float value) {
  int h = -1;
  Status s = check(slot, name, &h);
  if (!s)
    return s;
  if (!std::isfinite(value))
    return Status::error("hyper-parameter \"" + std::string(name) +
                         "\" must be finite");
  if (value != 0.0f)
    for (const StateSpec &st : m_->states)
      if (st.kind == StateKind::Elided && st.elidable_if_zero == name)
        return Status::error("hyper-parameter \"" + std::string(name) +
                             "\" must stay 0 in " + m_->name + ": its state \"" +
                             st.name + "\" is elided (compile a spec that keeps it)");
  size_t i = size_t(slot) * m_->hypers.size() + size_t(h);
  // Compare bits: a plain re-set of the same value is not a change.
  bool same = given_[i] && std::memcmp(&values_[i], &value, sizeof value) == 0;
  values_[i] = value;
  given_[i] = 1;
  if (!same)
    ++generation_;
  return Status::success();
}

Status HyperTable::set_all(std::string_view name, float value) {
  for (int g = 0; g < slots_; ++g) {
    Status s = set(g, name, value);
    if (!s)
      return s;
  }
  return Status::success();
}

Expected<float> HyperTable::get(int slot, std::string_view name) const {
  int h = -1;
  Status s = check(slot, name, &h);
  if (!s)
    return s;
  return values_[size_t(slot) * m_->hypers.size() + size_t(h)];
}

Status HyperTable::check_complete() const {
  size_t H = m_->hypers.size();
  for (int s = 0; s < slots_; ++s)
    for (size_t h = 0; h < H; ++h)
      if (!given_[size_t(s) * H + h])
        return Status::error("step: hyper-parameter \"" + m_->hypers[h].name +
                             "\" has no default and was never set for param "
                             "group " +
                             std::to_string(s));
  return Status::success();
}

std::vector<RecordSlice> split_records(int64_t numel, int64_t group_size,
                                       int64_t max_record_elements) {
  std::vector<RecordSlice> out;
  if (numel <= 0)
    return out;
  int64_t unit = 64 * std::max<int64_t>(1, group_size);
  if (numel <= max_record_elements) {
    out.push_back({0, numel});
    return out;
  }
  int64_t piece = std::max<int64_t>(unit, max_record_elements / unit * unit);
  out.reserve(size_t((numel + piece - 1) / piece));
  for (int64_t off = 0; off < numel; off += piece)
    out.push_back({off, std::min(piece, numel - off)});
  return out;
}

int64_t gpu_max_record_elements(int64_t group_size) {
  int64_t unit = 64 * std::max<int64_t>(1, group_size);
  return std::max<int64_t>(unit, int64_t(std::numeric_limits<int32_t>::max()) /
                                     unit * unit);
}

int64_t append_table_records(const Manifest &m, const TensorInfo &t,
                             const std::vector<int64_t> &addresses,
                             int64_t max_record_elements,
                             std::vector<int64_t> &table) {
  const int64_t G = m.group_size;
  const size_t B = m.buffers.size();
  std::vector<RecordSlice> slices =
      split_records(t.numel, G, max_record_elements);
  for (const RecordSlice &r : slices) {
    size_t at = table.size();
    table.resize(at + 4 + B, 0);
    int64_t *rec = table.data() + at;
    rec[0] = r.numel;
    rec[1] = t.first_group + r.offset / G;
    rec[2] = t.param_group;
    rec[3] = 0;
    for (size_t b = 0; b < B; ++b) {
      const BufferSpec &spec = m.buffers[b];
      int64_t entries = spec.per == Per::Group ? r.offset / G : r.offset;
      // A null address (a grad not given yet) stays null.
      rec[4 + b] = addresses[b] == 0
                       ? 0
                       : addresses[b] + entries * dtype_size(spec.dtype);
    }
  }
  return int64_t(slices.size());
}

BytesReport compute_bytes_report(const Manifest &m,
                                 const std::vector<TensorInfo> &tensors,
                                 int64_t runtime_allocated) {
  BytesReport r;
  for (const TensorInfo &ti : tensors)
    r.numel += ti.numel;
  for (const BufferSpec &spec : m.buffers) {
    int64_t count = 0;
    for (const TensorInfo &ti : tensors)
      count += spec.per == Per::Group ? ti.num_groups : ti.numel;
    int64_t bytes = count * dtype_size(spec.dtype);
    switch (spec.role) {
    case BufferRole::Param:
      r.param += bytes;
      break;
    case BufferRole::Correction:
      r.correction += bytes;
      break;
    case BufferRole::Grad:
      r.grad += bytes;
      break;
    case BufferRole::State:
      r.states += bytes;
      break;
    }
  }
  r.runtime_allocated = runtime_allocated;
  r.total = r.param + r.correction + r.grad + r.states;
  r.total_with_grad_release = r.total - r.grad;
  if (r.numel > 0) {
    double n = double(r.numel);
    r.per_param.param = double(r.param) / n;
    r.per_param.correction = double(r.correction) / n;
    r.per_param.grad = double(r.grad) / n;
    r.per_param.states = double(r.states) / n;
    r.per_param.total = double(r.total) / n;
    r.per_param.total_with_grad_release = double(r.total_with_grad_release) / n;
  }
  return r;
}

//===----------------------------------------------------------------------===//
// CPU features and bundles
//===----------------------------------------------------------------------===//

namespace {

#ifdef FLASHOPT_HOST_X86
/// CPUID.1:ECX bit `bit` (for features not every compiler's
/// __builtin_cpu_supports knows).
bool cpuid1Ecx(unsigned bit) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return false;
  return (c >> bit) & 1u;
}
bool cpuidExt1Ecx(unsigned bit) {
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000001u, &a, &b, &c, &d))
    return false;
  return (c >> bit) & 1u;
}
#endif

} // namespace

bool host_supports_feature(std::string_view f) {
#ifdef FLASHOPT_HOST_X86
  __builtin_cpu_init();
#define FLASHOPT_FEATURE(name)                                                 \
  if (f == name)                                                               \
    return __builtin_cpu_supports(name) != 0;
  FLASHOPT_FEATURE("cmov")
  FLASHOPT_FEATURE("mmx")
  FLASHOPT_FEATURE("popcnt")
  FLASHOPT_FEATURE("sse")
  FLASHOPT_FEATURE("sse2")
  FLASHOPT_FEATURE("sse3")
  FLASHOPT_FEATURE("ssse3")
  FLASHOPT_FEATURE("sse4.1")
  FLASHOPT_FEATURE("sse4.2")
  FLASHOPT_FEATURE("avx")
  FLASHOPT_FEATURE("avx2")
  FLASHOPT_FEATURE("fma")
  FLASHOPT_FEATURE("bmi")
  FLASHOPT_FEATURE("bmi2")
  FLASHOPT_FEATURE("avx512f")
  FLASHOPT_FEATURE("avx512bw")
  FLASHOPT_FEATURE("avx512vl")
  FLASHOPT_FEATURE("avx512dq")
  FLASHOPT_FEATURE("avx512cd")
  FLASHOPT_FEATURE("avx512vnni")
  FLASHOPT_FEATURE("avx512bf16")
#undef FLASHOPT_FEATURE
  // Not known to every compiler's __builtin_cpu_supports: ask CPUID. F16C
  // instructions use the AVX register state, so the OS must enable AVX too.
  if (f == "f16c")
    return cpuid1Ecx(29) && __builtin_cpu_supports("avx");
  if (f == "movbe")
    return cpuid1Ecx(22);
  if (f == "lzcnt" || f == "abm")
    return cpuidExt1Ecx(5);
  return false;
#else
  (void)f;
  return false;
#endif
}

Bundle::~Bundle() {
  if (handle_)
    dlclose(handle_);
}

void *Bundle::symbol(const std::string &name) const {
  return handle_ ? dlsym(handle_, name.c_str()) : nullptr;
}

Expected<std::shared_ptr<Bundle>> Bundle::load(const std::string &dir,
                                               const LoadOptions &opts) {
  try {
    std::string mpath = dir + "/manifest.json";
    Expected<Manifest> m = load_manifest(mpath);
    if (!m)
      return m.status();

    std::string forced = opts.cpu;
    std::string forcedFrom = "LoadOptions::cpu";
    if (forced.empty() && opts.use_env) {
      const char *env = std::getenv("FLASHOPT_CPU");
      if (env && *env) {
        forced = env;
        forcedFrom = "FLASHOPT_CPU";
      }
    }

    std::vector<size_t> cpuKernels;
    std::string targets;
    for (size_t i = 0; i < m->kernels.size(); ++i) {
      targets += (targets.empty() ? "" : ", ") + m->kernels[i].target;
      if (m->kernels[i].target == "cpu")
        cpuKernels.push_back(i);
    }
    if (cpuKernels.empty())
      return Status::error(mpath + ": field 'kernels': no CPU kernel (targets: " +
                           (targets.empty() ? std::string("none") : targets) + ")");

    auto missing = [&](const KernelEntry &k) {
      std::string s;
      for (const std::string &f : k.features)
        if (!host_supports_feature(f))
          s += (s.empty() ? "" : ", ") + f;
      return s;
    };
    std::string available;
    for (size_t i : cpuKernels)
      available += (available.empty() ? "" : ", ") + m->kernels[i].cpu;

    std::optional<size_t> chosen;
    if (!forced.empty()) {
      for (size_t i : cpuKernels)
        if (m->kernels[i].cpu == forced) {
          chosen = i;
          break;
        }
      if (!chosen)
        return Status::error(mpath + ": no CPU kernel for cpu " + quote(forced) +
                             " (requested by " + forcedFrom +
                             "); the bundle has: " + available);
      std::string lacks = missing(m->kernels[*chosen]);
      if (!lacks.empty())
        return Status::error(mpath + ": the " + quote(forced) +
                             " kernel (requested by " + forcedFrom +
                             ") needs CPU features this host lacks: " + lacks);
    } else {
      std::string why;
      for (size_t i : cpuKernels) {
        std::string lacks = missing(m->kernels[i]);
        if (lacks.empty()) {
          chosen = i;
          break;
        }
        why += "; " + m->kernels[i].cpu + " needs " + lacks;
      }
      if (!chosen)
        return Status::error(mpath + ": no CPU kernel runs on this host" + why);
    }

    std::shared_ptr<Bundle> b(new Bundle());
    b->dir_ = dir;
    b->manifest_ = std::move(m.value());
    b->kernel_index_ = *chosen;
    const KernelEntry &k = b->manifest_.kernels[*chosen];
    b->kernel_path_ = (!k.file.empty() && k.file[0] == '/') ? k.file
                                                            : dir + "/" + k.file;
    dlerror();
    b->handle_ = dlopen(b->kernel_path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!b->handle_) {
      const char *e = dlerror();
      return Status::error(mpath + ": cannot load kernel " + quote(k.file) +
                           " (cpu " + k.cpu + "): " + (e ? e : "dlopen failed"));
    }
    dlerror();
    void *sym = dlsym(b->handle_, k.symbol.c_str());
    if (!sym) {
      const char *e = dlerror();
      return Status::error(mpath + ": kernel " + quote(k.file) +
                           " has no symbol " + quote(k.symbol) +
                           (e ? std::string(" (") + e + ")" : std::string()));
    }
    b->fn_ = reinterpret_cast<KernelFn>(sym);
    return Expected<std::shared_ptr<Bundle>>(std::move(b));
  } catch (const std::exception &e) {
    return Status::error(dir + ": " + e.what());
  }
}

//===----------------------------------------------------------------------===//
// Chunking
//===----------------------------------------------------------------------===//

std::vector<Chunk> split_groups(int64_t total,
                                const std::vector<int64_t> &first_groups,
                                int max_chunks, int64_t min_groups,
                                int64_t align_groups) {
  std::vector<Chunk> out;
  if (total <= 0)
    return out;
  min_groups = std::max<int64_t>(1, min_groups);
  align_groups = std::max<int64_t>(1, align_groups);
  int64_t n = std::max<int64_t>(1, std::min<int64_t>(max_chunks, total / min_groups));
  int64_t prev = 0;
  for (int64_t i = 1; i <= n; ++i) {
    // total * i / n without overflow: (q n + r) i / n = q i + r i / n.
    int64_t b = i == n ? total : (total / n) * i + (total % n) * i / n;
    if (i < n && !first_groups.empty()) {
      // Round down to a 64-element boundary of the tensor holding b.
      auto it = std::upper_bound(first_groups.begin(), first_groups.end(), b);
      int64_t first = it == first_groups.begin() ? 0 : *(it - 1);
      int64_t aligned = first + (b - first) / align_groups * align_groups;
      if (aligned > prev)
        b = aligned;
    }
    if (b > prev) {
      out.push_back({prev, b});
      prev = b;
    }
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Thread pool
//===----------------------------------------------------------------------===//

namespace {

/// A persistent pool: `run(n, fn)` calls fn(0..n-1) once each on the workers
/// and the calling thread, and returns when all calls are done.
class ThreadPool {
public:
  explicit ThreadPool(int workers) {
    for (int i = 0; i < workers; ++i)
      threads_.emplace_back([this] { loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread &t : threads_)
      t.join();
  }
  int workers() const { return int(threads_.size()); }

  void run(int64_t jobs, const std::function<void(int64_t)> &fn) {
    if (threads_.empty() || jobs <= 1) {
      for (int64_t i = 0; i < jobs; ++i)
        fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      jobs_ = jobs;
      next_.store(0, std::memory_order_relaxed);
      busy_ = int(threads_.size());
      ++generation_;
    }
    wake_.notify_all();
    work(fn, jobs);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return busy_ == 0; });
    job_ = nullptr;
  }

private:
  void work(const std::function<void(int64_t)> &fn, int64_t jobs) {
    for (;;) {
      int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= jobs)
        return;
      fn(i);
    }
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)> *fn;
      int64_t jobs;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_)
          return;
        seen = generation_;
        fn = job_;
        jobs = jobs_;
      }
      work(*fn, jobs);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--busy_ == 0)
          done_.notify_one();
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  const std::function<void(int64_t)> *job_ = nullptr;
  int64_t jobs_ = 0;
  std::atomic<int64_t> next_{0};
  int busy_ = 0;
};

/// A 64-byte aligned, zero-filled, growable byte arena.
struct Arena {
  uint8_t *data = nullptr;
  int64_t capacity = 0; ///< bytes
  int64_t used = 0;     ///< entries (elements or groups) handed out
  int elem = 1;         ///< bytes per entry

  Arena() = default;
  Arena(const Arena &) = delete;
  Arena &operator=(const Arena &) = delete;
  Arena(Arena &&o) noexcept { *this = std::move(o); }
  Arena &operator=(Arena &&o) noexcept {
    std::swap(data, o.data);
    std::swap(capacity, o.capacity);
    std::swap(used, o.used);
    std::swap(elem, o.elem);
    return *this;
  }
  ~Arena() { std::free(data); }

  /// Reserves `count` entries starting at a 64-entry boundary; returns the
  /// entry offset. Throws std::bad_alloc.
  int64_t allocate(int64_t count) {
    int64_t offset = (used + 63) / 64 * 64;
    int64_t end = offset + count;
    int64_t needBytes = (end + 63) / 64 * 64 * elem; // keep the tail padded
    if (needBytes > capacity) {
      int64_t cap = std::max<int64_t>(needBytes, capacity * 2);
      cap = (cap + 63) / 64 * 64;
      void *p = nullptr;
      if (posix_memalign(&p, 64, size_t(cap)) != 0 || !p)
        throw std::bad_alloc();
      std::memset(p, 0, size_t(cap));
      if (data)
        std::memcpy(p, data, size_t(used * elem));
      std::free(data);
      data = static_cast<uint8_t *>(p);
      capacity = cap;
    }
    used = end;
    return offset;
  }
};

int defaultThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(std::min<unsigned>(n, 1024));
}

} // namespace

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

struct Optimizer::Impl {
  std::shared_ptr<Bundle> bundle;
  const Manifest *m = nullptr;
  int64_t G = 1;
  int64_t H = 0;
  int64_t B = 0;

  std::unique_ptr<HyperTable> hypers;

  std::vector<TensorInfo> tensors;
  std::vector<std::vector<int64_t>> offsets; ///< [tensor][buffer] arena entry
  std::vector<Arena> arenas;                 ///< per buffer (param/grad unused)
  std::vector<int64_t> firstGroups;
  int64_t totalGroups = 0, totalNumel = 0;
  std::vector<int64_t> table;

  int threads = 1;
  int64_t minGroups = 1;
  std::unique_ptr<ThreadPool> pool;
  int64_t t = 0;

  bool runtimeOwned(int b) const {
    BufferRole r = m->buffers[size_t(b)].role;
    return r == BufferRole::Correction || r == BufferRole::State;
  }

  void *address(size_t tensor, size_t b) const {
    const BufferSpec &spec = m->buffers[b];
    if (spec.role == BufferRole::Param)
      return tensors[tensor].param;
    if (spec.role == BufferRole::Grad)
      return tensors[tensor].grad;
    return arenas[b].data + offsets[tensor][b] * dtype_size(spec.dtype);
  }

  /// One record per tensor (CPU kernels index with 64-bit math).
  void rebuildTable() {
    table.clear();
    table.reserve(tensors.size() * size_t(m->record_words));
    std::vector<int64_t> addresses(static_cast<size_t>(B), 0);
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (size_t b = 0; b < size_t(B); ++b)
        addresses[b] = int64_t(reinterpret_cast<intptr_t>(address(i, b)));
      append_table_records(*m, tensors[i], addresses,
                           std::numeric_limits<int64_t>::max(), table);
    }
  }

  void setThreads(int n) {
    pool.reset();
    threads = n <= 0 ? defaultThreads() : n;
    pool = std::make_unique<ThreadPool>(threads - 1);
  }
};

Optimizer::Optimizer() : impl_(new Impl()) {}
Optimizer::~Optimizer() = default;

Expected<std::unique_ptr<Optimizer>>
Optimizer::create(std::shared_ptr<Bundle> bundle, const OptimizerOptions &opts) {
  if (!bundle)
    return Status::error("Optimizer::create: null bundle");
  try {
    std::unique_ptr<Optimizer> o(new Optimizer());
    Impl &I = *o->impl_;
    I.bundle = std::move(bundle);
    I.m = &I.bundle->manifest();
    I.G = I.m->group_size;
    I.H = int64_t(I.m->hypers.size());
    I.B = int64_t(I.m->buffers.size());
    I.arenas.resize(size_t(I.B));
    for (size_t b = 0; b < size_t(I.B); ++b)
      I.arenas[b].elem = dtype_size(I.m->buffers[b].dtype);
    Status ok = HyperTable::check_manifest(*I.m);
    if (!ok)
      return ok;
    I.hypers = std::make_unique<HyperTable>(*I.m);
    I.minGroups = opts.min_groups_per_chunk > 0
                      ? opts.min_groups_per_chunk
                      : std::max<int64_t>(1, 32768 / I.G);
    I.setThreads(opts.threads);
    o->add_param_group();
    return Expected<std::unique_ptr<Optimizer>>(std::move(o));
  } catch (const std::exception &e) {
    return Status::error(std::string("Optimizer::create: ") + e.what());
  }
}

Expected<std::unique_ptr<Optimizer>>
Optimizer::create(const std::string &dir, const LoadOptions &load,
                  const OptimizerOptions &opts) {
  Expected<std::shared_ptr<Bundle>> b = Bundle::load(dir, load);
  if (!b)
    return b.status();
  return create(std::move(b.value()), opts);
}

const Manifest &Optimizer::manifest() const { return *impl_->m; }
const Bundle &Optimizer::bundle() const { return *impl_->bundle; }

int Optimizer::add_param_group() { return impl_->hypers->add_slot(); }

int Optimizer::num_param_groups() const { return impl_->hypers->num_slots(); }

Status Optimizer::set_hyper(int slot, std::string_view name, float value) {
  return impl_->hypers->set(slot, name, value);
}

Status Optimizer::set_hyper_all(std::string_view name, float value) {
  return impl_->hypers->set_all(name, value);
}

Expected<float> Optimizer::hyper(int slot, std::string_view name) const {
  return impl_->hypers->get(slot, name);
}

const std::vector<float> &Optimizer::hyper_table() const {
  return impl_->hypers->values();
}

Expected<int64_t> Optimizer::add_param(int slot, void *param, int64_t numel,
                                       void *grad) {
  Impl &I = *impl_;
  if (slot < 0 || slot >= I.hypers->num_slots())
    return Status::error("add_param: param group " + std::to_string(slot) +
                         " does not exist (there are " +
                         std::to_string(I.hypers->num_slots()) + ")");
  if (!param)
    return Status::error("add_param: null param pointer");
  if (numel <= 0)
    return Status::error("add_param: numel must be > 0, got " +
                         std::to_string(numel));
  try {
    TensorInfo ti;
    ti.numel = numel;
    ti.first_group = I.totalGroups;
    ti.num_groups = (numel + I.G - 1) / I.G;
    ti.param_group = slot;
    ti.param = param;
    ti.grad = grad;
    std::vector<int64_t> offs(size_t(I.B), 0);
    // Allocate every slice first, so a failure leaves nothing registered
    // (arenas may have grown; their extra zeroed space is harmless).
    for (size_t b = 0; b < size_t(I.B); ++b)
      if (I.runtimeOwned(int(b)))
        offs[b] = I.arenas[b].allocate(I.m->buffers[b].per == Per::Group
                                           ? ti.num_groups
                                           : numel);
    I.tensors.push_back(ti);
    I.offsets.push_back(std::move(offs));
    I.firstGroups.push_back(ti.first_group);
    I.totalGroups += ti.num_groups;
    I.totalNumel += numel;
    I.rebuildTable();
    return int64_t(I.tensors.size() - 1);
  } catch (const std::bad_alloc &) {
    return Status::error("add_param: out of memory allocating state for " +
                         std::to_string(numel) + " elements");
  } catch (const std::exception &e) {
    return Status::error(std::string("add_param: ") + e.what());
  }
}

Status Optimizer::set_grad(int64_t tensor, void *grad) {
  Impl &I = *impl_;
  if (tensor < 0 || tensor >= int64_t(I.tensors.size()))
    return Status::error("set_grad: no tensor " + std::to_string(tensor));
  I.tensors[size_t(tensor)].grad = grad;
  int g = I.m->buffer_index("grad");
  I.table[size_t(tensor * I.m->record_words + 4 + g)] =
      int64_t(reinterpret_cast<intptr_t>(grad));
  return Status::success();
}

Status Optimizer::set_param(int64_t tensor, void *param) {
  Impl &I = *impl_;
  if (tensor < 0 || tensor >= int64_t(I.tensors.size()))
    return Status::error("set_param: no tensor " + std::to_string(tensor));
  if (!param)
    return Status::error("set_param: null param pointer");
  I.tensors[size_t(tensor)].param = param;
  I.table[size_t(tensor * I.m->record_words + 4)] =
      int64_t(reinterpret_cast<intptr_t>(param));
  return Status::success();
}

int64_t Optimizer::num_tensors() const { return int64_t(impl_->tensors.size()); }
int64_t Optimizer::total_groups() const { return impl_->totalGroups; }
int64_t Optimizer::total_numel() const { return impl_->totalNumel; }
const TensorInfo &Optimizer::tensor(int64_t i) const {
  return impl_->tensors[size_t(i)];
}
const std::vector<int64_t> &Optimizer::table() const { return impl_->table; }

Expected<BufferView> Optimizer::buffer(int64_t tensor, std::string_view name) const {
  const Impl &I = *impl_;
  if (tensor < 0 || tensor >= int64_t(I.tensors.size()))
    return Status::error("buffer: no tensor " + std::to_string(tensor));
  Expected<int> found = find_buffer(*I.m, name);
  if (!found)
    return found.status();
  int b = *found;
  const BufferSpec &spec = I.m->buffers[size_t(b)];
  const TensorInfo &ti = I.tensors[size_t(tensor)];
  BufferView v;
  v.data = I.address(size_t(tensor), size_t(b));
  v.dtype = spec.dtype;
  v.per = spec.per;
  v.count = spec.per == Per::Group ? ti.num_groups : ti.numel;
  v.bytes = v.count * dtype_size(spec.dtype);
  v.runtime_owned = I.runtimeOwned(b);
  return v;
}

std::vector<Chunk> Optimizer::plan_chunks() const {
  const Impl &I = *impl_;
  return split_groups(I.totalGroups, I.firstGroups, I.threads, I.minGroups,
                      std::max<int64_t>(1, 64 / I.G));
}

Status Optimizer::step() {
  Impl &I = *impl_;
  if (Status g = check_all_grads(I.tensors); !g)
    return g;
  Status complete = I.hypers->check_complete();
  if (!complete)
    return complete;
  int64_t t = I.t + 1;
  if (I.tensors.empty()) {
    I.t = t;
    return Status::success();
  }
  try {
    std::vector<Chunk> chunks = plan_chunks();
    KernelFn fn = I.bundle->fn();
    const int64_t *table = I.table.data();
    int64_t n = int64_t(I.tensors.size());
    const float *hypers = I.hypers->values().data();
    if (chunks.size() == 1 || !I.pool) {
      for (const Chunk &c : chunks)
        fn(table, n, hypers, t, c.begin, c.end);
    } else {
      I.pool->run(int64_t(chunks.size()), [&](int64_t i) {
        fn(table, n, hypers, t, chunks[size_t(i)].begin, chunks[size_t(i)].end);
      });
    }
  } catch (const std::exception &e) {
    return Status::error(std::string("step: ") + e.what());
  }
  I.t = t;
  return Status::success();
}

namespace {
Status missing_grad(const std::vector<TensorInfo> &tensors, size_t i) {
  return Status::error("step: tensor " + std::to_string(i) + " (numel " +
                       std::to_string(tensors[i].numel) +
                       ") has no gradient (add_param/set_grad)");
}
} // namespace

Status check_all_grads(const std::vector<TensorInfo> &tensors) {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!tensors[i].grad)
      return missing_grad(tensors, i);
  return Status::success();
}

Status check_step_indices(const std::vector<TensorInfo> &tensors,
                          const std::vector<int64_t> &indices) {
  const int64_t n = int64_t(tensors.size());
  for (size_t k = 0; k < indices.size(); ++k) {
    int64_t i = indices[k];
    if (i < 0 || i >= n)
      return Status::error("step_tensors: no tensor " + std::to_string(i) +
                           " (there are " + std::to_string(n) + ")");
    if (k > 0 && i <= indices[k - 1])
      return Status::error("step_tensors: tensor indices must be ascending "
                           "and distinct");
    if (!tensors[size_t(i)].grad)
      return missing_grad(tensors, size_t(i));
  }
  return Status::success();
}

Status Optimizer::step_tensors(const std::vector<int64_t> &indices,
                               int64_t t) {
  Impl &I = *impl_;
  if (Status s = check_step_indices(I.tensors, indices); !s)
    return s;
  Status complete = I.hypers->check_complete();
  if (!complete)
    return complete;
  if (indices.empty())
    return Status::success();
  try {
    const int64_t R = I.m->record_words;
    const int64_t a = indices.front(), b = indices.back() + 1;
    const bool contiguous = b - a == int64_t(indices.size());
    // The records the kernel walks, and their first groups relative to the
    // first record's (split_groups wants them from 0).
    std::vector<int64_t> compact;
    const int64_t *table = nullptr;
    int64_t base = 0, total = 0;
    std::vector<int64_t> firsts;
    firsts.reserve(indices.size());
    if (contiguous) {
      table = I.table.data() + a * R;
      base = I.tensors[size_t(a)].first_group;
      for (int64_t i = a; i < b; ++i)
        firsts.push_back(I.tensors[size_t(i)].first_group - base);
      const TensorInfo &last = I.tensors[size_t(b - 1)];
      total = last.first_group + last.num_groups - base;
    } else {
      compact.reserve(indices.size() * size_t(R));
      for (int64_t i : indices) {
        const int64_t *rec = I.table.data() + i * R;
        compact.insert(compact.end(), rec, rec + R);
        compact[compact.size() - size_t(R) + 1] = total; // renumber word 1
        firsts.push_back(total);
        total += I.tensors[size_t(i)].num_groups;
      }
      table = compact.data();
    }
    std::vector<Chunk> chunks =
        split_groups(total, firsts, I.threads, I.minGroups,
                     std::max<int64_t>(1, 64 / I.G));
    KernelFn fn = I.bundle->fn();
    const int64_t nrec = int64_t(indices.size());
    const float *hypers = I.hypers->values().data();
    if (chunks.size() == 1 || !I.pool) {
      for (const Chunk &c : chunks)
        fn(table, nrec, hypers, t, base + c.begin, base + c.end);
    } else {
      I.pool->run(int64_t(chunks.size()), [&](int64_t k) {
        const Chunk &c = chunks[size_t(k)];
        fn(table, nrec, hypers, t, base + c.begin, base + c.end);
      });
    }
  } catch (const std::exception &e) {
    return Status::error(std::string("step: ") + e.what());
  }
  return Status::success();
}

namespace {
/// Whether n values of a BF16/F16/F32 buffer are all finite.
bool allFinite(const void *data, DType dtype, int64_t begin, int64_t end) {
  switch (dtype) {
  case DType::F32: {
    const uint32_t *p = static_cast<const uint32_t *>(data);
    uint32_t bad = 0;
    for (int64_t i = begin; i < end; ++i)
      bad |= uint32_t((p[i] & 0x7F800000u) == 0x7F800000u);
    return bad == 0;
  }
  case DType::BF16:
  case DType::F16: {
    const uint16_t mask = dtype == DType::BF16 ? 0x7F80u : 0x7C00u;
    const uint16_t *p = static_cast<const uint16_t *>(data);
    uint32_t bad = 0;
    for (int64_t i = begin; i < end; ++i)
      bad |= uint32_t((p[i] & mask) == mask);
    return bad == 0;
  }
  default:
    return true; // integer gradients do not exist; nothing to scan
  }
}
} // namespace

bool Optimizer::grads_finite(const std::vector<int64_t> &indices) const {
  const Impl &I = *impl_;
  // Pieces of at most 1 << 16 elements, scanned on the pool.
  struct Piece {
    const void *data;
    int64_t begin, end;
  };
  std::vector<Piece> pieces;
  const int64_t kPiece = int64_t(1) << 16;
  for (int64_t i : indices) {
    if (i < 0 || i >= int64_t(I.tensors.size()))
      continue;
    const TensorInfo &ti = I.tensors[size_t(i)];
    if (!ti.grad)
      continue;
    for (int64_t off = 0; off < ti.numel; off += kPiece)
      pieces.push_back({ti.grad, off, std::min(ti.numel, off + kPiece)});
  }
  std::atomic<bool> finite{true};
  auto scan = [&](int64_t k) {
    if (!finite.load(std::memory_order_relaxed))
      return;
    const Piece &p = pieces[size_t(k)];
    if (!allFinite(p.data, I.m->grad, p.begin, p.end))
      finite.store(false, std::memory_order_relaxed);
  };
  if (I.pool && pieces.size() > 1)
    I.pool->run(int64_t(pieces.size()), scan);
  else
    for (size_t k = 0; k < pieces.size(); ++k)
      scan(int64_t(k));
  return finite.load();
}

int64_t Optimizer::step_count() const { return impl_->t; }
void Optimizer::set_step_count(int64_t t) { impl_->t = t; }
int Optimizer::threads() const { return impl_->threads; }
Status Optimizer::set_threads(int n) {
  try {
    impl_->setThreads(n);
  } catch (const std::exception &e) {
    impl_->threads = 1;
    return Status::error(std::string("set_threads: cannot start threads: ") +
                         e.what() + " (running on the calling thread only)");
  }
  return Status::success();
}

BytesReport Optimizer::bytes() const {
  const Impl &I = *impl_;
  int64_t allocated = 0;
  for (size_t b = 0; b < size_t(I.B); ++b)
    if (I.runtimeOwned(int(b)))
      allocated += I.arenas[b].capacity;
  return compute_bytes_report(*I.m, I.tensors, allocated);
}

std::vector<std::string> list_bundles(const std::string &dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto &e : std::filesystem::directory_iterator(dir, ec))
    if (std::filesystem::is_regular_file(e.path() / "manifest.json", ec))
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

} // namespace flashopt::host
