//===- MasterWeights.cpp - fp32 master weights and states -----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A tensor's buffers through the host codec, in and out as fp32.
///
//===----------------------------------------------------------------------===//

#include "checkpoint/MasterWeights.h"

#include "codec/Codec.h"

#include <cmath>
#include <cstdio>

namespace flashopt::checkpoint {

namespace {

Expected<std::vector<float>> exportMaster(const Subject &s, int64_t i) {
  const Manifest &m = s.manifest();
  int64_t n = s.numel(i);
  std::vector<float> out(static_cast<size_t>(n));
  Expected<std::vector<uint8_t>> param = s.read(i, "param");
  if (!param)
    return param.status();
  Expected<std::vector<uint8_t>> corr = std::vector<uint8_t>();
  if (m.correction)
    corr = s.read(i, "correction");
  if (!corr)
    return corr.status();
  codec::decode_master(param->data(), m.param,
                       m.correction ? corr->data() : nullptr, m.correction, n,
                       out.data());
  return out;
}

Status checkMasterFits(const Subject &s, int64_t i, const float *in, Code code,
                       const std::string &where) {
  const Manifest &m = s.manifest();
  if (m.param == DType::F32)
    return Status::success();
  int64_t n = s.numel(i);
  std::vector<uint16_t> param(static_cast<size_t>(n));
  std::vector<uint8_t> corr;
  if (m.correction)
    corr.resize(size_t(dtype_bytes(*m.correction, uint64_t(n))));
  codec::encode_master(in, n, param.data(), m.param,
                       m.correction ? corr.data() : nullptr, m.correction);
  const uint16_t infBits = m.param == DType::BF16 ? 0x7F80 : 0x7C00;
  for (int64_t k = 0; k < n; ++k)
    if (std::isfinite(in[k]) && (param[size_t(k)] & 0x7FFF) == infBits) {
      char v[32];
      std::snprintf(v, sizeof v, "%.9g", double(in[k]));
      return Status::error(code, where + ": " + s.describe(i) + ": element " +
                                     std::to_string(k) + " is " + v +
                                     ", finite but beyond the " +
                                     dtype_name(m.param) +
                                     " range of the parameter (it would "
                                     "become infinite)");
    }
  return Status::success();
}

Status importMaster(const Subject &s, int64_t i, const float *in) {
  const Manifest &m = s.manifest();
  int64_t n = s.numel(i);
  std::vector<uint8_t> param(size_t(dtype_bytes(m.param, uint64_t(n))));
  std::vector<uint8_t> corr;
  if (m.correction)
    corr.resize(size_t(dtype_bytes(*m.correction, uint64_t(n))));
  codec::encode_master(in, n, param.data(), m.param,
                       m.correction ? corr.data() : nullptr, m.correction);
  if (Status st = s.write(i, "param", param.data(), int64_t(param.size())); !st)
    return st;
  if (m.correction)
    return s.write(i, "correction", corr.data(), int64_t(corr.size()));
  return Status::success();
}

Expected<std::vector<float>> exportState(const Subject &s, int64_t i,
                                         const StateSpec &state) {
  const Manifest &m = s.manifest();
  const int64_t numel = s.numel(i);
  std::vector<float> v(static_cast<size_t>(numel));
  std::vector<std::vector<uint8_t>> stored;
  std::vector<const void *> buffers;
  for (const abi::StateBuffer &b : abi::state_buffers(state)) {
    Expected<std::vector<uint8_t>> bytes = s.read(i, state.name + b.suffix);
    if (!bytes)
      return bytes.status();
    stored.push_back(std::move(bytes.value()));
  }
  for (const std::vector<uint8_t> &b : stored)
    buffers.push_back(b.data());
  codec::decode_state(state, buffers, m.group_size, numel, v.data());
  return v;
}

Status importState(const Subject &s, int64_t i, const StateSpec &state,
                   const float *in) {
  const Manifest &m = s.manifest();
  const int64_t numel = s.numel(i);
  const int64_t ng = (numel + m.group_size - 1) / m.group_size;
  std::vector<abi::StateBuffer> layout = abi::state_buffers(state);
  std::vector<std::vector<uint8_t>> stored;
  std::vector<void *> buffers;
  for (const abi::StateBuffer &b : layout)
    stored.emplace_back(size_t(
        dtype_bytes(b.dtype, uint64_t(b.per == Per::Group ? ng : numel))));
  for (std::vector<uint8_t> &b : stored)
    buffers.push_back(b.data());
  codec::encode_state(state, in, m.group_size, numel, buffers);
  for (size_t k = 0; k < layout.size(); ++k)
    if (Status st = s.write(i, state.name + layout[k].suffix, stored[k].data(),
                            int64_t(stored[k].size()));
        !st)
      return st;
  return Status::success();
}

} // namespace

Expected<std::vector<float>> export_master(const Subject &s, int64_t i) {
  return no_throw([&] { return exportMaster(s, i); });
}

Status import_master(const Subject &s, int64_t i, const float *in) {
  return no_throw([&] { return importMaster(s, i, in); });
}

Status check_master_fits(const Subject &s, int64_t i, const float *in,
                         Code code, const std::string &where) {
  return no_throw([&] { return checkMasterFits(s, i, in, code, where); });
}

const StateSpec *stored_state(const Manifest &m, const std::string &state) {
  for (const StateSpec &s : m.states)
    if (s.name == state && !abi::state_buffers(s).empty())
      return &s;
  return nullptr;
}

Expected<std::vector<float>> export_state(const Subject &s, int64_t i,
                                          const StateSpec &state) {
  return no_throw([&] { return exportState(s, i, state); });
}

Status import_state(const Subject &s, int64_t i, const StateSpec &state,
                    const float *in) {
  return no_throw([&] { return importState(s, i, state, in); });
}

} // namespace flashopt::checkpoint
