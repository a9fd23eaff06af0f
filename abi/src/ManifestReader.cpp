//===- ManifestReader.cpp - Reading and validating manifests --------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// parse_manifest / load_manifest: every field checked, every error naming
/// the file and the field ("<file>: field 'states[1].encoding.compand': ...").
/// Exceptions are used inside this file only (JSON access) and are always
/// turned into a Status before returning to the caller.
///
//===----------------------------------------------------------------------===//

#include "flashopt/abi/Files.h"
#include "flashopt/abi/Manifest.h"
#include "flashopt/abi/Minifloat.h"

#include "JsonFields.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

namespace flashopt::abi {

using detail::describe;
using detail::json;
using detail::JsonFields;
using detail::ManifestError;
using detail::quote;
using detail::typeName;

namespace {

class Parser : public JsonFields {
public:
  using JsonFields::JsonFields;

  Manifest parse(const json &root);

private:
  // The phases of parse, in the order the manifest is checked (the first
  // error found is the one reported).
  void parseHeader(const json &root, Manifest &m);
  void parseParam(const json &root, Manifest &m);
  void parseAccumulator(const json &root, Manifest &m);
  void parseHypers(const json &root, Manifest &m);
  void parseStates(const json &root, Manifest &m);
  StateSpec parseState(const json &state, const std::string &p,
                       const Manifest &m, std::set<std::string> &names);
  void parseEncoding(const json &enc, const std::string &ep, const Manifest &m,
                     StateSpec &s);
  void checkBuffers(const json &root, Manifest &m);
  BufferSpec parseBuffer(const json &buffer, const std::string &p);
  void parseTable(const json &root, Manifest &m);
  void parseBytesPerParam(const json &root, Manifest &m);
  void parseKernels(const json &root, Manifest &m);
  KernelEntry parseKernel(const json &kernel, const std::string &p,
                          const Manifest &m);
};

/// A buffer as the messages show it: "name" (dtype, per ..., access).
std::string render(const BufferSpec &b) {
  return quote(b.name) + " (" + dtype_name(b.dtype) + ", per " +
         (b.per == Per::Group ? "group" : "element") + ", " +
         (b.writable ? "readwrite" : "read") + ")";
}

Manifest Parser::parse(const json &root) {
  Manifest m;
  m.path = origin_;
  if (!root.is_object())
    fail("", "expected a JSON object at the top level, got " + typeName(root));
  parseHeader(root, m);
  parseParam(root, m);
  parseAccumulator(root, m);
  parseHypers(root, m);
  parseStates(root, m);
  checkBuffers(root, m);
  parseTable(root, m);
  parseBytesPerParam(root, m);
  parseKernels(root, m);
  return m;
}

/// format, version, names and group_size.
void Parser::parseHeader(const json &root, Manifest &m) {
  m.format = string(root, "", "format");
  if (m.format != kManifestFormat)
    fail("format", "expected \"flashopt-manifest\", got " + quote(m.format));
  m.format_version = integer(root, "", "format_version");
  if (m.format_version != kManifestFormatVersion)
    fail("format_version", "unsupported version " +
                               std::to_string(m.format_version) +
                               " (this runtime reads version " +
                               std::to_string(kManifestFormatVersion) + ")");
  m.generator = string(root, "", "generator");
  m.name = string(root, "", "name");
  m.spec_hash = string(root, "", "spec_hash");
  m.rule = string(root, "", "rule");
  // Optional, informational.
  if (root.contains("spec"))
    m.spec = string(root, "", "spec", /*nonEmpty=*/false);
  if (root.contains("description"))
    m.description = string(root, "", "description", /*nonEmpty=*/false);

  m.group_size = integer(root, "", "group_size");
  if (m.group_size < 1 || m.group_size > 65536 ||
      (m.group_size & (m.group_size - 1)) != 0)
    fail("group_size", "expected a power of two in [1, 65536], got " +
                           std::to_string(m.group_size));
}

/// param (dtype and correction), grad and the kernels' arithmetic.
void Parser::parseParam(const json &root, Manifest &m) {
  const json &param = object(root, "", "param");
  m.param = dtype(param, "param", "dtype",
                  {DType::BF16, DType::F16, DType::F32}, nullptr);
  std::string c = string(param, "param", "correction");
  if (c == "none") {
    m.correction = std::nullopt;
  } else {
    m.correction = dtype(param, "param", "correction", {DType::I8, DType::I16},
                         "or \"none\"");
    if (m.param == DType::F32)
      fail("param.correction",
           "an f32 parameter takes no correction term, got " + quote(c));
  }
  m.grad =
      dtype(root, "", "grad", {DType::BF16, DType::F16, DType::F32}, nullptr);
  // The kernels' arithmetic (optional): "exact" or "fast".
  if (root.contains("arithmetic")) {
    m.arithmetic = string(root, "", "arithmetic");
    if (m.arithmetic != "exact" && m.arithmetic != "fast")
      fail("arithmetic",
           "expected \"exact\" or \"fast\", got " + quote(m.arithmetic));
  }
  // The state numerics: "bounded" or "flashoptim" (absent: an older
  // manifest, FlashOptim's numerics).
  m.numerics = "flashoptim";
  if (root.contains("numerics")) {
    m.numerics = string(root, "", "numerics");
    if (m.numerics != "bounded" && m.numerics != "flashoptim")
      fail("numerics",
           "expected \"bounded\" or \"flashoptim\", got " + quote(m.numerics));
  }
}

/// The gradient accumulator (optional): f32, bf16 + i8 or bf16.
void Parser::parseAccumulator(const json &root, Manifest &m) {
  if (!root.contains("accumulator"))
    return;
  const json &acc = object(root, "", "accumulator");
  AccumulatorSpec a;
  a.dtype =
      dtype(acc, "accumulator", "dtype", {DType::F32, DType::BF16}, nullptr);
  std::string c = string(acc, "accumulator", "correction");
  if (c != "none") {
    a.correction =
        dtype(acc, "accumulator", "correction", {DType::I8}, "or \"none\"");
    if (a.dtype != DType::BF16)
      fail("accumulator.correction",
           "an f32 accumulator takes no correction term, got " + quote(c));
  }
  m.accumulator = a;
}

/// hypers: unique names, each with a number or null default; an envelope
/// ({"keep": "max" | "min", "of": <an earlier plain hyper-parameter>}) has a
/// null default.
void Parser::parseHypers(const json &root, Manifest &m) {
  std::set<std::string> names;
  forEachObject(
      root, "hypers", [&](const json &hyper, const std::string &p, size_t) {
        HyperSpec h;
        h.name = string(hyper, p, "name");
        if (!names.insert(h.name).second)
          fail(join(p, "name"), "duplicate hyper-parameter " + quote(h.name));
        const json &d = member(hyper, p, "default");
        if (d.is_null()) {
          h.default_value = std::nullopt;
        } else if (d.is_number()) {
          h.default_value = d.get<double>();
        } else {
          fail(join(p, "default"), "expected a number or null, got " +
                                       typeName(d) + " " + describe(d));
        }
        if (hyper.contains("envelope")) {
          const std::string ep = join(p, "envelope");
          const json &e = object(hyper, p, "envelope");
          h.envelope = string(e, ep, "keep");
          if (h.envelope != "max" && h.envelope != "min")
            fail(join(ep, "keep"),
                 "expected max or min, got " + quote(h.envelope));
          h.envelope_of = string(e, ep, "of");
          auto of = std::find_if(
              m.hypers.begin(), m.hypers.end(),
              [&](const HyperSpec &x) { return x.name == h.envelope_of; });
          if (of == m.hypers.end() || of->is_envelope())
            fail(join(ep, "of"), "names no earlier plain hyper-parameter: " +
                                     quote(h.envelope_of));
          if (h.default_value)
            fail(join(p, "default"),
                 "an envelope has no default (the runtime keeps it)");
        }
        m.hypers.push_back(h);
      });
}

/// states: unique, unreserved names, each with its encoding.
void Parser::parseStates(const json &root, Manifest &m) {
  std::set<std::string> names;
  forEachObject(root, "states",
                [&](const json &state, const std::string &p, size_t) {
                  m.states.push_back(parseState(state, p, m, names));
                });
}

/// One state; `names` holds the names of the states before it.
StateSpec Parser::parseState(const json &state, const std::string &p,
                             const Manifest &m, std::set<std::string> &names) {
  StateSpec s;
  s.name = string(state, p, "name");
  if (s.name == "param" || s.name == "grad" || s.name == "correction" ||
      s.name == "accum" || s.name == "accum_correction")
    fail(join(p, "name"), "reserved buffer name " + quote(s.name));
  if (!names.insert(s.name).second)
    fail(join(p, "name"), "duplicate state " + quote(s.name));
  parseEncoding(object(state, p, "encoding"), join(p, "encoding"), m, s);
  if (state.contains("elidable_if_zero")) {
    s.elidable_if_zero = string(state, p, "elidable_if_zero");
    if (std::none_of(m.hypers.begin(), m.hypers.end(), [&](const HyperSpec &h) {
          return h.name == s.elidable_if_zero;
        }))
      fail(join(p, "elidable_if_zero"),
           "names an unknown hyper-parameter " + quote(s.elidable_if_zero));
  }
  if (s.kind == StateKind::Elided && s.elidable_if_zero.empty())
    fail(join(p, "elidable_if_zero"),
         "missing: an elided state must name the hyper-parameter that keeps "
         "it zero");
  return s;
}

/// A state's encoding: quantized (storage, group, compander, scale), plain
/// (storage) or elided.
void Parser::parseEncoding(const json &enc, const std::string &ep,
                           const Manifest &m, StateSpec &s) {
  std::string kind = string(enc, ep, "kind");
  if (kind == "quantized") {
    s.kind = StateKind::Quantized;
    s.storage =
        dtype(enc, ep, "storage", {DType::I8, DType::U8, DType::I4, DType::U4},
              "quantized");
    s.group = integer(enc, ep, "group");
    if (s.group != m.group_size)
      fail(join(ep, "group"), "is " + std::to_string(s.group) +
                                  " but group_size is " +
                                  std::to_string(m.group_size));
    s.compand = string(enc, ep, "compand");
    const std::vector<std::string> &companders = known_companders();
    if (std::find(companders.begin(), companders.end(), s.compand) ==
        companders.end())
      fail(join(ep, "compand"),
           "expected one of none, softsign, sqrt, e3m4, e4m4, e2m1, e3m0, "
           "e3m1, e4m0, got " +
               quote(s.compand));
    // The code's width and signedness are the storage's: a minifloat's
    // (codeBits(): 8 for e3m4/e4m4, 4 for e2m1/e3m0/e3m1/e4m0, signed ones
    // in i8/i4), the linear companders' at 8 bits only.
    const bool isSignedStorage =
        s.storage == DType::I8 || s.storage == DType::I4;
    const int bits = dtype_bits(s.storage);
    std::optional<DType> needs;
    if (std::optional<MinifloatFormat> f = minifloat_format(s.compand)) {
      if (f->codeBits() != bits || f->isSigned != isSignedStorage)
        needs = f->codeBits() == 4 ? (f->isSigned ? DType::I4 : DType::U4)
                                   : (f->isSigned ? DType::I8 : DType::U8);
    } else if (s.compand == "softsign" && s.storage != DType::I8) {
      needs = DType::I8;
    } else if (s.compand == "sqrt" && s.storage != DType::U8) {
      needs = DType::U8;
    } else if (s.compand == "none" && bits != 8) {
      fail(join(ep, "compand"),
           "compand \"none\" needs 8-bit storage (i8 or ui8), got " +
               std::string(dtype_name(s.storage)));
    }
    if (needs)
      fail(join(ep, "compand"), "compand " + quote(s.compand) + " needs " +
                                    dtype_name(*needs) + " storage, got " +
                                    dtype_name(s.storage));
    s.scale =
        dtype(enc, ep, "scale", {DType::F16, DType::BF16, DType::F32}, nullptr);
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
}

/// buffers: exactly the ones the ABI implies (implied_buffers), in order.
void Parser::checkBuffers(const json &root, Manifest &m) {
  std::vector<BufferSpec> expected = implied_buffers(m);
  forEachObject(
      root, "buffers", [&](const json &buffer, const std::string &p, size_t i) {
        BufferSpec b = parseBuffer(buffer, p);
        if (i >= expected.size())
          fail(p, "unexpected buffer " + render(b) +
                      ": param, correction, grad and states imply only " +
                      std::to_string(expected.size()) + " buffers");
        const BufferSpec &e = expected[i];
        if (b.name != e.name || b.dtype != e.dtype || b.per != e.per ||
            b.writable != e.writable)
          fail(p, "expected buffer " + render(e) +
                      " (from param, grad and states), got " + render(b));
        b.role = e.role;
        m.buffers.push_back(b);
      });
  if (m.buffers.size() != expected.size())
    fail("buffers", "has " + std::to_string(m.buffers.size()) +
                        " entries, expected " +
                        std::to_string(expected.size()) + " (missing " +
                        render(expected[m.buffers.size()]) + ")");
}

BufferSpec Parser::parseBuffer(const json &buffer, const std::string &p) {
  BufferSpec b;
  b.name = string(buffer, p, "name");
  std::string dt = string(buffer, p, "dtype");
  std::optional<DType> t = parse_dtype(dt);
  if (!t)
    fail(join(p, "dtype"),
         "expected one of bf16, f16, f32, i8, ui8, i16, got " + quote(dt));
  b.dtype = *t;
  std::string per = string(buffer, p, "per");
  if (per != "element" && per != "group")
    fail(join(p, "per"),
         "expected \"element\" or \"group\", got " + quote(per));
  b.per = per == "group" ? Per::Group : Per::Element;
  std::string access = string(buffer, p, "access");
  if (access != "read" && access != "readwrite")
    fail(join(p, "access"),
         "expected \"read\" or \"readwrite\", got " + quote(access));
  b.writable = access == "readwrite";
  return b;
}

/// table: the header and record sizes the runtime writes.
void Parser::parseTable(const json &root, Manifest &m) {
  const json &table = object(root, "", "table");
  m.header_words = integer(table, "table", "header_words");
  if (m.header_words != kTableHeaderWords)
    fail("table.header_words", "expected " + std::to_string(kTableHeaderWords) +
                                   ", got " + std::to_string(m.header_words));
  m.record_words = integer(table, "table", "record_words");
  const int64_t words = record_words(int64_t(m.buffers.size()));
  if (m.record_words != words)
    fail("table.record_words", "expected " + std::to_string(words) +
                                   " (4 + buffers), got " +
                                   std::to_string(m.record_words));
}

/// bytes_per_param: must agree with the buffers.
void Parser::parseBytesPerParam(const json &root, Manifest &m) {
  const json &bpp = object(root, "", "bytes_per_param");
  BytesPerParam &b = m.bytes_per_param;
  b.param = number(bpp, "bytes_per_param", "param");
  b.correction = number(bpp, "bytes_per_param", "correction");
  b.grad = number(bpp, "bytes_per_param", "grad");
  b.states = number(bpp, "bytes_per_param", "states");
  b.total = number(bpp, "bytes_per_param", "total");
  b.total_with_grad_release =
      number(bpp, "bytes_per_param", "total_with_grad_release");
  if (m.accumulator)
    b.accumulator = number(bpp, "bytes_per_param", "accumulator");
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
  check("accumulator", b.accumulator, c.accumulator);
  check("total", b.total, c.total);
  check("total_with_grad_release", b.total_with_grad_release,
        c.total_with_grad_release);
}

/// kernels: each one's target, kind and files.
void Parser::parseKernels(const json &root, Manifest &m) {
  forEachObject(root, "kernels",
                [&](const json &kernel, const std::string &p, size_t) {
                  m.kernels.push_back(parseKernel(kernel, p, m));
                });
}

KernelEntry Parser::parseKernel(const json &e, const std::string &p,
                                const Manifest &m) {
  KernelEntry k;
  k.target = string(e, p, "target");
  if (e.contains("kind")) {
    std::string kind = string(e, p, "kind");
    if (!parse_kernel_kind(kind, k.kind))
      fail(join(p, "kind"), "expected one of step, accumulate, "
                            "step_accumulated, step_fused, got " +
                                quote(kind));
    if (k.kind != KernelKind::Step && !m.accumulator)
      fail(join(p, "kind"), "a " + kind +
                                " kernel needs an accumulator, and the "
                                "manifest has none");
  }
  if (k.target == "cpu") {
    k.cpu = string(e, p, "cpu");
    const json &f = array(e, p, "features");
    for (size_t j = 0; j < f.size(); ++j) {
      if (!f[j].is_string())
        fail(index(join(p, "features"), j),
             "expected a string, got " + typeName(f[j]));
      k.features.push_back(f[j].get<std::string>());
    }
    k.file = string(e, p, "file");
    k.symbol = string(e, p, "symbol");
    return k;
  }
  // GPU (and unknown) targets: keep what is there; the GPU runtime checks
  // what it needs when it selects a kernel.
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
  return k;
}

} // namespace

namespace {
/// Real manifests nest 4 levels deep. Deeper JSON is refused before parsing:
/// printing or walking a deep value recurses (the ASan build overflowed the
/// stack in json::dump on the 20,000-deep corpus input; a thread with a
/// small stack would too).
constexpr int kMaxManifestNesting = 64;

/// The byte offset where nesting first exceeds kMaxManifestNesting, or -1
/// (brackets inside JSON strings do not count).
int64_t excessiveNesting(std::string_view text) {
  int depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxManifestNesting)
        return int64_t(i);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return -1;
}
} // namespace

Expected<Manifest> parse_manifest(std::string_view text,
                                  const std::string &origin) {
  if (int64_t at = excessiveNesting(text); at >= 0)
    return Status::error(Code::Format,
                         origin + ": invalid JSON: nesting deeper than " +
                             std::to_string(kMaxManifestNesting) +
                             " levels at byte " + std::to_string(at));
  try {
    json root;
    try {
      root = json::parse(text.begin(), text.end());
    } catch (const json::parse_error &e) {
      return Status::error(Code::Format,
                           origin + ": invalid JSON: " + e.what());
    }
    return Parser(origin).parse(root);
  } catch (const ManifestError &e) {
    return Status::error(Code::Format, e.message);
  } catch (const json::exception &e) {
    // A value of a type the reader did not expect.
    return Status::error(Code::Format, origin + ": " + e.what());
  } catch (const std::exception &e) {
    return Status::from_exception(e, origin + ": ");
  } catch (...) {
    return Status::error(Code::Internal,
                         origin + ": unknown error while reading the manifest");
  }
}

Expected<Manifest> load_manifest(const std::string &path) {
  try {
    std::string text, reason;
    FileError e = read_regular_file(path, kMaxManifestBytes, text, reason);
    // A file too large to be a manifest is a malformed one; the rest
    // (missing, not a regular file, a read error) failed to be read.
    if (e != FileError::None)
      return Status::error(
          e == FileError::TooLarge ? Code::Format : Code::Io,
          path + ": " +
              (e == FileError::NotFound
                   ? std::string("cannot open (No such file or "
                                 "directory)")
                   : reason));
    return parse_manifest(text, path);
  } catch (const std::exception &e) {
    return Status::from_exception(e, path + ": ");
  }
}

} // namespace flashopt::abi
