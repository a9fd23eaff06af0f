//===- Manifest.cpp - Bundle manifests -------------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/Target/Manifest.h"

#include <nlohmann/json.hpp>

using namespace flashopt;

int flashopt::dtypeBytes(const std::string &dtype) {
  if (dtype == "f32")
    return 4;
  if (dtype == "bf16" || dtype == "f16" || dtype == "i16")
    return 2;
  if (dtype == "i8" || dtype == "ui8")
    return 1;
  return 0;
}

BytesPerParam flashopt::computeBytesPerParam(const ManifestInfo &info) {
  BytesPerParam bytes;
  for (const ManifestBuffer &b : info.buffers) {
    double perParam =
        b.perGroup ? double(dtypeBytes(b.dtype)) / double(info.groupSize)
                   : double(dtypeBytes(b.dtype));
    if (b.name == "param")
      bytes.param += perParam;
    else if (b.name == "correction")
      bytes.correction += perParam;
    else if (b.name == "grad")
      bytes.grad += perParam;
    else
      bytes.states += perParam;
  }
  return bytes;
}

std::string flashopt::renderManifest(const ManifestInfo &info) {
  using nlohmann::ordered_json;
  ordered_json j;
  j["format"] = "flashopt-manifest";
  j["format_version"] = kManifestFormatVersion;
  j["generator"] = std::string("flashopt-gen ") + kFlashOptVersion;
  j["name"] = info.name;
  if (!info.specPath.empty())
    j["spec"] = info.specPath;
  j["spec_hash"] = info.specHash;
  j["rule"] = info.rule;
  if (!info.description.empty())
    j["description"] = info.description;
  j["group_size"] = info.groupSize;
  j["param"] = {{"dtype", info.paramDtype}, {"correction", info.correction}};
  j["grad"] = info.gradDtype;
  ordered_json hypers = ordered_json::array();
  for (const ManifestHyper &h : info.hypers) {
    ordered_json e;
    e["name"] = h.name;
    if (h.defaultValue)
      e["default"] = *h.defaultValue;
    else
      e["default"] = nullptr;
    hypers.push_back(e);
  }
  j["hypers"] = hypers;
  ordered_json states = ordered_json::array();
  for (const ManifestState &s : info.states) {
    ordered_json enc;
    enc["kind"] = s.kind;
    if (s.kind != "elided")
      enc["storage"] = s.storage;
    if (s.kind == "quantized") {
      enc["group"] = s.group;
      enc["compand"] = s.compand;
      enc["scale"] = s.scale;
    }
    ordered_json e;
    e["name"] = s.name;
    e["encoding"] = enc;
    if (!s.elidableIfZero.empty())
      e["elidable_if_zero"] = s.elidableIfZero;
    states.push_back(e);
  }
  j["states"] = states;
  ordered_json buffers = ordered_json::array();
  for (const ManifestBuffer &b : info.buffers)
    buffers.push_back({{"name", b.name},
                       {"dtype", b.dtype},
                       {"per", b.perGroup ? "group" : "element"},
                       {"access", b.writable ? "readwrite" : "read"}});
  j["buffers"] = buffers;
  j["table"] = {{"header_words", 4},
                {"record_words", 4 + int64_t(info.buffers.size())}};
  BytesPerParam bytes = computeBytesPerParam(info);
  j["bytes_per_param"] = {{"param", bytes.param},
                          {"correction", bytes.correction},
                          {"grad", bytes.grad},
                          {"states", bytes.states},
                          {"total", bytes.total()},
                          {"total_with_grad_release",
                           bytes.totalWithGradRelease()}};
  ordered_json kernels = ordered_json::array();
  for (const ManifestKernel &k : info.kernels) {
    ordered_json e;
    e["target"] = k.target;
    if (k.target == "cpu") {
      e["cpu"] = k.cpu;
      e["features"] = k.features;
    } else {
      e["threads_per_block"] = k.threadsPerBlock;
      e["elements_per_thread"] = k.elementsPerThread;
      e["registers"] = k.registers;
      e["spill_stores"] = k.spillStores;
      e["spill_loads"] = k.spillLoads;
      if (!k.cubin.empty())
        e["cubin"] = k.cubin;
    }
    e["file"] = k.file;
    e["symbol"] = k.symbol;
    kernels.push_back(e);
  }
  j["kernels"] = kernels;
  j["abi"] = "void symbol(const int64_t *table, int64_t ntensors, const float "
             "*hypers, int64_t step, int64_t group_begin, int64_t group_end)";
  return j.dump(2) + "\n";
}
