//===- MasterWeights.cpp - fp32 master weights in and out ------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The fp32 master weight of a parameter (its 16-bit param plus correction
/// term) exported and imported through the host codec.
///
//===----------------------------------------------------------------------===//

#include "MasterWeights.h"

#include "codec/Codec.h"

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

} // namespace flashopt::capi
