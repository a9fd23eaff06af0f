//===- ManifestWriter.cpp - Writing manifests
//------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// write_manifest: the model as manifest.json, in the layout ManifestReader
/// reads (ordered keys, so the file reads top to bottom like docs/KERNEL-ABI).
///
//===----------------------------------------------------------------------===//

#include "flashopt/abi/Manifest.h"

#include <nlohmann/json.hpp>

namespace flashopt::abi {

std::string write_manifest(const Manifest &m) {
  using nlohmann::ordered_json;
  ordered_json j;
  j["format"] = m.format;
  j["format_version"] = m.format_version;
  j["generator"] = m.generator;
  j["name"] = m.name;
  if (!m.spec.empty())
    j["spec"] = m.spec;
  j["spec_hash"] = m.spec_hash;
  j["rule"] = m.rule;
  if (!m.description.empty())
    j["description"] = m.description;
  j["group_size"] = m.group_size;
  j["param"] = {
      {"dtype", dtype_name(m.param)},
      {"correction", m.correction ? dtype_name(*m.correction) : "none"}};
  j["grad"] = dtype_name(m.grad);
  if (m.accumulator)
    j["accumulator"] = {
        {"dtype", dtype_name(m.accumulator->dtype)},
        {"correction", m.accumulator->correction
                           ? dtype_name(*m.accumulator->correction)
                           : "none"}};
  if (m.arithmetic != "exact")
    j["arithmetic"] = m.arithmetic;
  j["numerics"] = m.numerics;
  ordered_json hypers = ordered_json::array();
  for (const HyperSpec &h : m.hypers) {
    ordered_json e;
    e["name"] = h.name;
    if (h.default_value)
      e["default"] = *h.default_value;
    else
      e["default"] = nullptr;
    if (h.is_envelope())
      e["envelope"] = {{"keep", h.envelope}, {"of", h.envelope_of}};
    hypers.push_back(e);
  }
  j["hypers"] = hypers;
  ordered_json states = ordered_json::array();
  for (const StateSpec &s : m.states) {
    ordered_json enc;
    enc["kind"] = state_kind_name(s.kind);
    if (s.kind != StateKind::Elided)
      enc["storage"] = dtype_name(s.storage);
    if (s.kind == StateKind::Quantized) {
      enc["group"] = s.group;
      enc["compand"] = s.compand;
      enc["scale"] = dtype_name(s.scale);
    }
    ordered_json e;
    e["name"] = s.name;
    e["encoding"] = enc;
    if (!s.elidable_if_zero.empty())
      e["elidable_if_zero"] = s.elidable_if_zero;
    states.push_back(e);
  }
  j["states"] = states;
  ordered_json buffers = ordered_json::array();
  for (const BufferSpec &b : m.buffers)
    buffers.push_back({{"name", b.name},
                       {"dtype", dtype_name(b.dtype)},
                       {"per", b.per == Per::Group ? "group" : "element"},
                       {"access", b.writable ? "readwrite" : "read"}});
  j["buffers"] = buffers;
  j["table"] = {{"header_words", m.header_words},
                {"record_words", m.record_words}};
  const BytesPerParam &bytes = m.bytes_per_param;
  j["bytes_per_param"] = {
      {"param", bytes.param},
      {"correction", bytes.correction},
      {"grad", bytes.grad},
      {"states", bytes.states},
      {"total", bytes.total},
      {"total_with_grad_release", bytes.total_with_grad_release}};
  if (m.accumulator)
    j["bytes_per_param"]["accumulator"] = bytes.accumulator;
  ordered_json kernels = ordered_json::array();
  for (const KernelEntry &k : m.kernels) {
    ordered_json e;
    e["target"] = k.target;
    if (k.target == "cpu") {
      e["cpu"] = k.cpu;
      e["features"] = k.features;
    } else {
      e["threads_per_block"] = k.threads_per_block;
      e["elements_per_thread"] = k.elements_per_thread;
      e["registers"] = k.registers;
      e["spill_stores"] = k.spill_stores;
      e["spill_loads"] = k.spill_loads;
      if (!k.cubin.empty())
        e["cubin"] = k.cubin;
    }
    e["file"] = k.file;
    e["symbol"] = k.symbol;
    if (k.kind != KernelKind::Step)
      e["kind"] = kernel_kind_name(k.kind);
    kernels.push_back(e);
  }
  j["kernels"] = kernels;
  j["abi"] = kKernelSignature;
  return j.dump(2) + "\n";
}

std::string kernel_abi_description(const Manifest &m) {
  std::string s = "flashopt-kernel-abi 1; group_size " +
                  std::to_string(m.group_size) + "; hypers ";
  for (size_t i = 0; i < m.hypers.size(); ++i)
    s += (i ? "," : "") + m.hypers[i].name;
  s += "; buffers ";
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec &b = m.buffers[i];
    s += std::string(i ? "," : "") + b.name + ":" + dtype_name(b.dtype) + ":" +
         (b.per == Per::Group ? "group" : "element") + ":" +
         (b.writable ? "readwrite" : "read");
  }
  s += "; record_words " + std::to_string(m.record_words);
  return s;
}

std::string ptx_kernel_abi_global(const std::string &kernelSymbol,
                                  const std::string &description) {
  std::string bytes;
  for (unsigned char c : description)
    bytes += std::to_string(unsigned(c)) + ",";
  bytes += "0";
  return "// The manifest this kernel was compiled for (docs/KERNEL-ABI.md).\n"
         ".visible .global .align 1 .b8 " +
         kernelSymbol + kKernelAbiSymbolSuffix + "[" +
         std::to_string(description.size() + 1) + "] = {" + bytes + "};\n";
}

namespace {
constexpr std::string_view kAbiPrefix = "flashopt-kernel-abi ";
constexpr size_t kMaxAbiDescription = 65536;
} // namespace

std::optional<std::string> find_kernel_abi_description(std::string_view bytes) {
  // A shared object or a cubin: the raw NUL-terminated string.
  if (size_t at = bytes.find(kAbiPrefix); at != std::string_view::npos) {
    size_t end = bytes.find('\0', at);
    if (end == std::string_view::npos || end - at > kMaxAbiDescription)
      return std::nullopt;
    return std::string(bytes.substr(at, end - at));
  }
  // A PTX file: the decimal bytes of the `S__abi` global.
  const std::string marker = std::string(kKernelAbiSymbolSuffix) + "[";
  for (size_t at = bytes.find(".global"); at != std::string_view::npos;
       at = bytes.find(".global", at + 1)) {
    // Only a declaration: the line holds nothing before it but `.visible`
    // (a commented-out declaration is no description).
    size_t bol = bytes.rfind('\n', at);
    bol = bol == std::string_view::npos ? 0 : bol + 1;
    std::string_view before = bytes.substr(bol, at - bol);
    while (!before.empty() && (before.front() == ' ' || before.front() == '\t'))
      before.remove_prefix(1);
    if (!before.empty() && before != ".visible ")
      continue;
    size_t line = bytes.find('\n', at);
    std::string_view decl =
        bytes.substr(at, line == std::string_view::npos ? std::string_view::npos
                                                        : line - at);
    size_t m = decl.find(marker);
    size_t open = decl.find('{');
    size_t close = decl.find('}');
    if (m == std::string_view::npos || open == std::string_view::npos ||
        close == std::string_view::npos || close < open)
      continue;
    std::string out;
    unsigned value = 0;
    bool digits = false;
    for (size_t i = open + 1; i <= close; ++i) {
      char c = decl[i];
      if (c >= '0' && c <= '9') {
        value = value * 10 + unsigned(c - '0');
        digits = true;
        if (value > 255)
          return std::nullopt;
      } else if (c == ',' || c == '}') {
        if (!digits)
          return std::nullopt;
        if (value == 0)
          break; // the terminating NUL
        out.push_back(char(value));
        value = 0;
        digits = false;
        if (out.size() > kMaxAbiDescription)
          return std::nullopt;
      } else if (c != ' ') {
        return std::nullopt;
      }
    }
    if (out.rfind(kAbiPrefix, 0) == 0)
      return out;
  }
  return std::nullopt;
}

} // namespace flashopt::abi
