//===- Accumulator.cpp - Gradient accumulation in the optimizer core ------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// host::Optimizer's gradient accumulator (docs/KERNEL-ABI.md "Gradient
/// accumulation"): reading it, accumulating and stepping from it, zeroing it,
/// and its finiteness and norm checks. See Optimizer.h.
///
//===----------------------------------------------------------------------===//

#include "OptimizerImpl.h"

#include "codec/Codec.h"

#include <cmath>

namespace flashopt::host {

namespace {

/// The accumulator's buffers (BufferRole::Accum, in manifest order: the
/// value, "accum", and for bf16 + i8 its correction term) as indices into
/// the manifest's buffers, with their dtypes.
struct AccumBuffers {
  int value = -1, correction = -1;
  DType valueType = DType::F32, correctionType = DType::I8;
};

AccumBuffers accumBuffers(const Manifest &m) {
  AccumBuffers a;
  for (size_t b = 0; b < m.buffers.size(); ++b) {
    if (m.buffers[b].role != BufferRole::Accum)
      continue;
    if (a.value < 0)
      a.value = int(b), a.valueType = m.buffers[b].dtype;
    else
      a.correction = int(b), a.correctionType = m.buffers[b].dtype;
  }
  return a;
}

} // namespace

Status Optimizer::read_accumulator(int64_t tensor, int64_t offset,
                                   int64_t count, float *out) {
  Impl &I = *impl_;
  try {
    if (Status s = I.checkAccumulator(tensor, offset, count, "read_accumulator"); !s)
      return s;
    const AccumBuffers ab = accumBuffers(*I.m);
    std::vector<uint8_t> hi(size_t(dtype_bytes(ab.valueType, uint64_t(count))));
    if (Status s = I.readElements(size_t(tensor), size_t(ab.value), offset,
                                  count, hi.data());
        !s)
      return s;
    if (ab.correction < 0) {
      codec::widen(hi.data(), ab.valueType, count, out);
      return Status::success();
    }
    std::vector<uint8_t> lo(size_t(dtype_bytes(ab.correctionType, uint64_t(count))));
    if (Status s = I.readElements(size_t(tensor), size_t(ab.correction),
                                  offset, count, lo.data());
        !s)
      return s;
    codec::decode_master(hi.data(), ab.valueType, lo.data(),
                         ab.correctionType, count, out);
    return Status::success();
  } catch (const std::exception &e) {
    return Status::from_exception(e, "read_accumulator: ");
  }
}

Status Optimizer::write_accumulator(int64_t tensor, int64_t offset,
                                    int64_t count, const float *in) {
  Impl &I = *impl_;
  try {
    if (Status s = I.checkAccumulator(tensor, offset, count, "write_accumulator"); !s)
      return s;
    const AccumBuffers ab = accumBuffers(*I.m);
    std::vector<uint8_t> hi(size_t(dtype_bytes(ab.valueType, uint64_t(count))));
    std::vector<uint8_t> lo;
    if (ab.correction >= 0) {
      lo.resize(size_t(dtype_bytes(ab.correctionType, uint64_t(count))));
      codec::encode_master(in, count, hi.data(), ab.valueType, lo.data(),
                           ab.correctionType);
    } else {
      codec::narrow(in, count, ab.valueType, hi.data());
    }
    if (Status s = I.writeElements(size_t(tensor), size_t(ab.value), offset,
                                   count, hi.data());
        !s)
      return s;
    if (ab.correction < 0)
      return Status::success();
    return I.writeElements(size_t(tensor), size_t(ab.correction), offset,
                           count, lo.data());
  } catch (const std::exception &e) {
    return Status::from_exception(e, "write_accumulator: ");
  }
}

Status Optimizer::zero_accumulators() {
  Impl &I = *impl_;
  if (!I.m->accumulator)
    return Status::success();
  try {
    for (size_t b = 0; b < I.B; ++b) {
      if (I.m->buffers[b].role != BufferRole::Accum)
        continue;
      for (size_t i = 0; i < I.tensors.size(); ++i) {
        Expected<BufferView> v = buffer(int64_t(i), I.m->buffers[b].name);
        if (!v)
          return v.status();
        std::vector<uint8_t> zeros(size_t(v->bytes), 0);
        if (Status s = I.backend->write(v->data, zeros.data(), v->bytes); !s)
          return s;
      }
    }
    return Status::success();
  } catch (const std::exception &e) {
    return Status::from_exception(e, "zero_accumulators: ");
  }
}

Expected<bool>
Optimizer::accumulators_finite(const std::vector<int64_t> &indices) {
  try {
    for (int64_t i : indices) {
      if (Status s = impl_->checkTensor(i, "accumulators_finite"); !s)
        return s;
      const int64_t n = impl_->tensors[size_t(i)].numel;
      std::vector<float> v(static_cast<size_t>(n));
      if (Status s = read_accumulator(i, 0, n, v.data()); !s)
        return s;
      for (float x : v)
        if (!std::isfinite(x))
          return false;
    }
    return true;
  } catch (const std::exception &e) {
    return Status::from_exception(e, "accumulators_finite: ");
  }
}

Expected<std::vector<double>>
Optimizer::accumulator_sum_squares(const std::vector<int64_t> &indices) {
  Impl &I = *impl_;
  // The decoded accumulators are host memory: the backend must sum that.
  if (I.backend->memory_is_device() || !I.backend->scans_gradients())
    return Status::error(Code::Unsupported,
                         std::string("accumulator_sum_squares: the ") +
                             I.backend->kind() +
                             " backend does not sum host memory (CPU contexts "
                             "only)");
  try {
    // Decoded to f32 in host memory, then summed exactly as the gradients
    // of an f32-gradient optimizer would be (Backend::sum_squares).
    std::vector<std::vector<float>> decoded;
    std::vector<ScanRange> ranges;
    decoded.reserve(indices.size());
    for (int64_t i : indices) {
      if (Status s = I.checkTensor(i, "accumulator_sum_squares"); !s)
        return s;
      const int64_t n = I.tensors[size_t(i)].numel;
      decoded.emplace_back(static_cast<size_t>(n));
      if (Status s = read_accumulator(i, 0, n, decoded.back().data()); !s)
        return s;
      ranges.push_back({decoded.back().data(), n});
    }
    return I.backend->sum_squares(ranges, DType::F32);
  } catch (const std::exception &e) {
    return Status::from_exception(e, "accumulator_sum_squares: ");
  }
}

} // namespace flashopt::host
