//===- Manifest.cpp - The bundle manifest model
//----------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The model's queries and derived fields. The reader is in
/// ManifestReader.cpp, the writer in ManifestWriter.cpp.
///
//===----------------------------------------------------------------------===//

#include "flashopt/abi/Manifest.h"

namespace flashopt::abi {

const char *state_kind_name(StateKind k) {
  switch (k) {
  case StateKind::Quantized:
    return "quantized";
  case StateKind::Plain:
    return "plain";
  case StateKind::Elided:
    return "elided";
  }
  return "?";
}

std::optional<StateKind> parse_state_kind(std::string_view n) {
  for (StateKind k :
       {StateKind::Quantized, StateKind::Plain, StateKind::Elided})
    if (n == state_kind_name(k))
      return k;
  return std::nullopt;
}

const std::vector<std::string> &known_companders() {
  static const std::vector<std::string> names = {"none", "softsign", "sqrt",
                                                 "e3m4", "e4m4",     "e2m1",
                                                 "e3m0", "e3m1",     "e4m0"};
  return names;
}

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

const KernelEntry *Manifest::find_kernel(KernelKind kind,
                                         std::string_view target,
                                         std::string_view cpu) const {
  for (const KernelEntry &k : kernels)
    if (k.kind == kind && k.target == target && (cpu.empty() || k.cpu == cpu))
      return &k;
  return nullptr;
}

BytesPerParam Manifest::computed_bytes_per_param() const {
  BytesPerParam b;
  for (const BufferSpec &buf : buffers) {
    double bytes = double(dtype_bits(buf.dtype)) / 8.0;
    double per = buf.per == Per::Group ? bytes / double(group_size) : bytes;
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
    case BufferRole::Accum:
      b.accumulator += per;
      break;
    }
  }
  b.total = b.param + b.correction + b.grad + b.states + b.accumulator;
  b.total_with_grad_release = b.total - b.grad;
  return b;
}

std::vector<StateBuffer> state_buffers(const StateSpec &s) {
  switch (s.kind) {
  case StateKind::Quantized:
    return {{".codes", s.storage, Per::Element},
            {".scales", s.scale, Per::Group}};
  case StateKind::Plain:
    return {{"", s.storage, Per::Element}};
  case StateKind::Elided:
    return {};
  }
  return {};
}

std::vector<BufferSpec> implied_buffers(const Manifest &m) {
  std::vector<BufferSpec> out;
  out.push_back({"param", m.param, Per::Element, true, BufferRole::Param});
  if (m.correction)
    out.push_back({"correction", *m.correction, Per::Element, true,
                   BufferRole::Correction});
  out.push_back({"grad", m.grad, Per::Element, false, BufferRole::Grad});
  if (m.accumulator) {
    out.push_back(
        {"accum", m.accumulator->dtype, Per::Element, true, BufferRole::Accum});
    if (m.accumulator->correction)
      out.push_back({"accum_correction", *m.accumulator->correction,
                     Per::Element, true, BufferRole::Accum});
  }
  for (const StateSpec &s : m.states)
    for (const StateBuffer &b : state_buffers(s))
      out.push_back(
          {s.name + b.suffix, b.dtype, b.per, true, BufferRole::State});
  return out;
}

void complete_manifest(Manifest &m) {
  m.buffers = implied_buffers(m);
  m.header_words = kTableHeaderWords;
  m.record_words = record_words(int64_t(m.buffers.size()));
  m.bytes_per_param = m.computed_bytes_per_param();
}

Expected<int> find_buffer(const Manifest &m, std::string_view name) {
  int b = m.buffer_index(name);
  if (b >= 0)
    return b;
  std::string names;
  for (const BufferSpec &s : m.buffers)
    names += (names.empty() ? "" : ", ") + s.name;
  return Status::error(Code::InvalidArgument,
                       "buffer: " + m.name + " has no buffer \"" +
                           std::string(name) + "\" (buffers: " + names + ")");
}

} // namespace flashopt::abi
