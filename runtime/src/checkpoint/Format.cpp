//===- Format.cpp - What a checkpoint file holds --------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The tensors of a checkpoint in each form, and its checksums.
///
//===----------------------------------------------------------------------===//

#include "checkpoint/Format.h"

#include "safetensors/Safetensors.h"

#include <cstdio>

namespace flashopt::checkpoint {

std::vector<Entry> expected_tensors(const Subject &s, Form form) {
  const Manifest &m = s.manifest();
  const TensorNames &names = s.names();
  std::vector<Entry> out;
  for (int64_t i = 0; i < names.size(); ++i) {
    const std::string &name = names.name(i);
    const std::vector<int64_t> &shape = names.shape(i);
    std::vector<int64_t> groups{(s.numel(i) + m.group_size - 1) / m.group_size};
    if (form == Form::F32) {
      out.push_back({name, i, "", "", DType::F32, shape});
      for (const StateSpec &st : m.states)
        if (!abi::state_buffers(st).empty())
          out.push_back(
              {name + "." + st.name, i, "", st.name, DType::F32, shape});
      continue;
    }
    out.push_back({name, i, "param", "", m.param, shape});
    if (m.correction)
      out.push_back(
          {name + ".correction", i, "correction", "", *m.correction, shape});
    for (const StateSpec &st : m.states)
      for (const abi::StateBuffer &b : abi::state_buffers(st)) {
        Entry e{name + "." + st.name + b.suffix,
                i,
                st.name + b.suffix,
                "",
                b.dtype,
                b.per == Per::Group ? groups : shape};
        // safetensors has whole bytes per element: packed codes are stored
        // as their bytes, U8 [ceil(n / 2)] (pad nibble included).
        if (abi::dtype_is_packed(b.dtype) && b.per == Per::Element) {
          e.dtype = DType::U8;
          e.shape = {int64_t(abi::dtype_bytes(b.dtype, uint64_t(s.numel(i))))};
        }
        out.push_back(std::move(e));
      }
  }
  return out;
}

std::string state_encodings(const Manifest &m) {
  std::string out;
  for (const StateSpec &st : m.states) {
    if (!out.empty())
      out += ';';
    out += st.name + "=" + abi::state_kind_name(st.kind);
    if (st.kind == StateKind::Quantized)
      out += std::string(":") + abi::dtype_name(st.storage) + ":" + st.compand +
             ":" + std::to_string(st.group) + ":" + abi::dtype_name(st.scale);
    else if (st.kind == StateKind::Plain)
      out += std::string(":") + abi::dtype_name(st.storage);
  }
  return out;
}

bool has_packed_buffers(const Manifest &m) {
  for (const StateSpec &st : m.states)
    for (const abi::StateBuffer &b : abi::state_buffers(st))
      if (abi::dtype_is_packed(b.dtype))
        return true;
  return false;
}

std::vector<std::string> tensor_names(const Manifest &m,
                                      const std::string &name) {
  std::vector<std::string> out{name};
  if (m.correction)
    out.push_back(name + ".correction");
  for (const StateSpec &s : m.states) {
    std::vector<abi::StateBuffer> buffers = abi::state_buffers(s);
    if (buffers.empty())
      continue;
    out.push_back(name + "." + s.name); // the f32 form
    for (const abi::StateBuffer &b : buffers)
      if (!b.suffix.empty())
        out.push_back(name + "." + s.name + b.suffix);
  }
  return out;
}

Expected<const StateSpec *> state_named(const Manifest &m,
                                        const std::string &name) {
  for (const StateSpec &s : m.states)
    if (s.name == name)
      return &s;
  return Status::error(Code::Internal, m.name + " has no state " + quote(name));
}

std::string checksum_text(const void *data, size_t n) {
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", safetensors::crc32c(data, n));
  return std::string("crc32c:") + hex;
}

std::string metadata_checksum(const std::map<std::string, std::string> &meta) {
  std::string canon;
  for (const auto &kv : meta) {
    if (kv.first == kMetadataChecksumKey)
      continue;
    canon += kv.first;
    canon.push_back('\0');
    canon += kv.second;
    canon.push_back('\0');
  }
  return checksum_text(canon.data(), canon.size());
}

} // namespace flashopt::checkpoint
