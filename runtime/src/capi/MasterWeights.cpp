//===- MasterWeights.cpp - fp32 master weights in and out -----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The fp32 master weight of a parameter (its 16-bit param plus correction
/// term) and its fp32 states, exported and imported through the host codec
/// (flashopt_{export,import}_{master,state}_f32, checkpoints' f32 form).
///
//===----------------------------------------------------------------------===//

#include "MasterWeights.h"

#include "codec/Codec.h"

#include <cmath>
#include <cstdio>

namespace flashopt::capi {

std::vector<float> exportMaster(OptObj &o, int64_t i) {
  const Manifest &m = *o.m;
  int64_t n = o.params[size_t(i)].numel;
  std::vector<float> out(static_cast<size_t>(n));
  std::vector<uint8_t> param = o.read(i, "param");
  std::vector<uint8_t> corr;
  if (m.correction)
    corr = o.read(i, "correction");
  codec::decode_master(param.data(), m.param,
                       m.correction ? corr.data() : nullptr, m.correction, n,
                       out.data());
  return out;
}

void checkMasterFits(const OptObj &o, int64_t i, const float *in,
                     flashopt_status code, const std::string &where) {
  const Manifest &m = *o.m;
  if (m.param == DType::F32)
    return;
  int64_t n = o.params[size_t(i)].numel;
  std::vector<uint16_t> param(static_cast<size_t>(n));
  std::vector<uint8_t> corr;
  if (m.correction)
    corr.resize(size_t(n * dtype_size(*m.correction)));
  codec::encode_master(in, n, param.data(), m.param,
                       m.correction ? corr.data() : nullptr, m.correction);
  const uint16_t infBits = m.param == DType::BF16 ? 0x7F80 : 0x7C00;
  for (int64_t k = 0; k < n; ++k)
    if (std::isfinite(in[k]) && (param[size_t(k)] & 0x7FFF) == infBits) {
      char v[32];
      std::snprintf(v, sizeof v, "%.9g", double(in[k]));
      fail(code, where + ": " + o.describe(i) + ": element " +
                     std::to_string(k) + " is " + v +
                     ", finite but beyond the " + dtype_name(m.param) +
                     " range of the parameter (it would "
                     "become infinite)");
    }
}

void importMaster(OptObj &o, int64_t i, const float *in) {
  const Manifest &m = *o.m;
  int64_t n = o.params[size_t(i)].numel;
  std::vector<uint8_t> param(size_t(n * dtype_size(m.param)));
  std::vector<uint8_t> corr;
  if (m.correction)
    corr.resize(size_t(n * dtype_size(*m.correction)));
  codec::encode_master(in, n, param.data(), m.param,
                       m.correction ? corr.data() : nullptr, m.correction);
  o.write(i, "param", param.data(), int64_t(param.size()));
  if (m.correction)
    o.write(i, "correction", corr.data(), int64_t(corr.size()));
}

const StateSpec *storedState(const Manifest &m, const std::string &state) {
  for (const StateSpec &s : m.states)
    if (s.name == state && !abi::state_buffers(s).empty())
      return &s;
  return nullptr;
}

std::vector<float> exportState(OptObj &o, int64_t i, const StateSpec &s) {
  const Manifest &m = *o.m;
  const int64_t numel = o.params[size_t(i)].numel;
  std::vector<float> v(static_cast<size_t>(numel));
  std::vector<std::vector<uint8_t>> stored;
  std::vector<const void *> buffers;
  for (const abi::StateBuffer &b : abi::state_buffers(s))
    stored.push_back(o.read(i, s.name + b.suffix));
  for (const std::vector<uint8_t> &b : stored)
    buffers.push_back(b.data());
  codec::decode_state(s, buffers, m.group_size, numel, v.data());
  return v;
}

void importState(OptObj &o, int64_t i, const StateSpec &s, const float *in) {
  const Manifest &m = *o.m;
  const int64_t numel = o.params[size_t(i)].numel;
  const int64_t ng = (numel + m.group_size - 1) / m.group_size;
  std::vector<abi::StateBuffer> layout = abi::state_buffers(s);
  std::vector<std::vector<uint8_t>> stored;
  std::vector<void *> buffers;
  for (const abi::StateBuffer &b : layout)
    stored.emplace_back(
        size_t((b.per == Per::Group ? ng : numel) * dtype_size(b.dtype)));
  for (std::vector<uint8_t> &b : stored)
    buffers.push_back(b.data());
  codec::encode_state(s, in, m.group_size, numel, buffers);
  for (size_t k = 0; k < layout.size(); ++k)
    o.write(i, s.name + layout[k].suffix, stored[k].data(),
            int64_t(stored[k].size()));
}

} // namespace flashopt::capi
