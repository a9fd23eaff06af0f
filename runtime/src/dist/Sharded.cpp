//===- Sharded.cpp - Sharded data parallelism (ZeRO-1) --------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// DataParallel's sharded mode. Each tensor is cut at quantization-group
/// boundaries into W contiguous ranges, one per rank (owned_range); a rank's
/// correction terms and states exist only for its ranges, in a second
/// optimizer (`owner_`) whose tensors are those ranges: their parameters
/// point into the callers' parameters, their gradients into staging buffers
/// the reduce-scatter fills (scratch memory of the owner's backend: host
/// memory on the CPU, device memory on CUDA, where the collectives still
/// stage through the host). Since groups never straddle a range, stepping a
/// range is the same arithmetic on the same bits as stepping the whole
/// tensor, so sharded equals replicated bit for bit (with the same
/// deterministic reduction: each element summed in rank order in fp32 by
/// its owner, divided by W, rounded once).
///
//===----------------------------------------------------------------------===//

#include "DataParallel.h"

#include "codec/Codec.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>

namespace flashopt::dist {

using namespace flashopt::host;

OwnedRange owned_range(int64_t numel, int64_t group_size, int rank, int W) {
  const int64_t G = std::max<int64_t>(1, group_size);
  const int64_t groups = (numel + G - 1) / G;
  const int64_t gb = groups * rank / W, ge = groups * (rank + 1) / W;
  return {std::min(numel, gb * G), std::min(numel, ge * G)};
}

namespace {

bool runtimeOwned(const BufferSpec &b) {
  return b.role == BufferRole::Correction || b.role == BufferRole::State;
}

/// Bytes [first, last) of a buffer of `spec` that hold elements [begin, end)
/// of a tensor (a per-group buffer: the groups of those elements). Owned
/// ranges start at multiples of G (even) and end at one or at numel, so a
/// packed (4-bit) buffer's range is whole bytes, its pad nibble included.
std::pair<int64_t, int64_t> byteRange(const BufferSpec &spec, int64_t G,
                                      OwnedRange r) {
  auto bytes = [&](int64_t n) {
    return int64_t(dtype_bytes(spec.dtype, uint64_t(n)));
  };
  if (spec.per == Per::Group)
    return {bytes(r.begin / G), bytes((r.end + G - 1) / G)};
  return {bytes(r.begin), bytes(r.end)};
}

/// Copies every hyper-parameter value `from` has into `to`, the envelopes
/// (docs/NUMERICS.md §8.4) as they are, set or not.
Status syncHypers(Optimizer &from, Optimizer &to) {
  const Manifest &m = from.manifest();
  while (to.num_param_groups() < from.num_param_groups())
    if (to.add_param_group() < 0)
      return Status::error(Code::OutOfMemory,
                           "out of memory adding a param group");
  for (int g = 0; g < from.num_param_groups(); ++g)
    for (size_t hi = 0; hi < m.hypers.size(); ++hi) {
      const auto &h = m.hypers[hi];
      if (h.is_envelope()) {
        std::optional<float> v;
        if (from.hypers().given(g, hi))
          v = *from.hyper(g, h.name);
        if (Status s = to.restore_hyper(g, h.name, v); !s)
          return s;
        continue;
      }
      Expected<float> v = from.hyper(g, h.name);
      if (!v)
        continue; // never set and no default: the step says so
      Expected<float> w = to.hyper(g, h.name);
      if (w && std::memcmp(&*w, &*v, sizeof(float)) == 0)
        continue;
      if (Status s = to.set_hyper(g, h.name, *v); !s)
        return s;
    }
  return Status::success();
}

} // namespace

int64_t DataParallel::maxOwned(int b) const {
  int64_t most = 0;
  for (int q = 0; q < comm_->size(); ++q) {
    int64_t n = 0;
    for (const Piece &p : owned(b, q))
      n += p.count;
    most = std::max(most, n);
  }
  return most;
}

Status DataParallel::shard(Optimizer &opt,
                           const std::vector<LayoutEntry> &layout,
                           const OwnerFactory &make) {
  const Manifest &m = opt.manifest();
  const int W = comm_->size(), me = comm_->rank();
  const int64_t G = m.group_size;
  layout_ = layout;
  // Who owns what of every bucket.
  ownedPieces_.assign(buckets_.size() * size_t(W), {});
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (const Piece &pc : buckets_[b].pieces)
      for (int q = 0; q < W; ++q) {
        OwnedRange r = owned_range(layout[size_t(pc.tensor)].numel, G, q, W);
        int64_t lo = std::max(r.begin, pc.offset);
        int64_t hi = std::min(r.end, pc.offset + pc.count);
        if (lo < hi)
          ownedPieces_[b * size_t(W) + size_t(q)].push_back(
              {pc.tensor, lo, hi - lo});
      }
  Expected<std::unique_ptr<Optimizer>> o = make();
  if (!o)
    return o.status();
  owner_ = std::move(o.value());
  if (Status s = syncHypers(opt, *owner_); !s)
    return s;
  // Parameters and gradients are whole bytes per element (never packed).
  const int64_t ges = dtype_bits(m.grad) / 8, pes = dtype_bits(m.param) / 8;
  ranges_.clear();
  ownerIndex_.assign(layout.size(), -1);
  size_t owning = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    ranges_.push_back(owned_range(layout[i].numel, G, me, W));
    owning += ranges_.back().end > ranges_.back().begin;
  }
  stage_.reserve(owning); // the owner's gradient pointers stay put
  for (size_t i = 0; i < layout.size(); ++i) {
    const OwnedRange r = ranges_[i];
    if (r.end == r.begin)
      continue;
    // In memory the owner's kernels address (device memory on CUDA).
    Expected<std::shared_ptr<void>> st =
        owner_->backend().allocate_scratch((r.end - r.begin) * ges);
    if (!st)
      return st.status();
    stage_.push_back({std::move(st.value()), (r.end - r.begin) * ges});
    void *param =
        static_cast<uint8_t *>(opt.tensor(int64_t(i)).param) + r.begin * pes;
    Expected<int64_t> k = owner_->add_param(
        layout[i].group, param, r.end - r.begin, stage_.back().mem.get());
    if (!k)
      return k.status();
    ownerIndex_[i] = *k;
    // The piece steps as these elements of the whole tensor do (itself a
    // piece of a larger one when registered by flashopt_add_param_piece).
    if (Status s = owner_->set_element_offset(
            *k, opt.tensor(int64_t(i)).element_offset + r.begin);
        !s)
      return s;
    // This rank's slice of the correction terms and states (rank 0's, as
    // broadcast by attach).
    for (const BufferSpec &spec : m.buffers) {
      if (!runtimeOwned(spec))
        continue;
      Expected<std::vector<uint8_t>> full =
          opt.read_buffer(int64_t(i), spec.name);
      if (!full)
        return full.status();
      auto [a, z] = byteRange(spec, G, r);
      if (Status s =
              owner_->write_buffer(*k, spec.name, full->data() + a, z - a);
          !s)
        return s;
    }
  }
  owner_->set_step_count(opt.step_count());
  return opt.release_state();
}

Status DataParallel::averageBlocks(const std::vector<uint8_t> &send, DType grad,
                                   int64_t M, std::vector<uint8_t> &mine) {
  const int64_t W = comm_->size(), es = dtype_bits(grad) / 8;
  std::vector<float> sum(size_t(M), 0.0f);
  if (deterministic_) {
    std::vector<uint8_t> parts(send.size());
    if (Status s = comm_->all_to_all(send.data(), parts.data(), size_t(M * es));
        !s)
      return s;
    std::vector<float> wide(static_cast<size_t>(M));
    for (int64_t r = 0; r < W; ++r) {
      codec::widen(parts.data() + r * M * es, grad, M,
                   r == 0 ? sum.data() : wide.data());
      if (r > 0)
        for (int64_t k = 0; k < M; ++k)
          sum[size_t(k)] = sum[size_t(k)] + wide[size_t(k)];
    }
  } else {
    std::vector<float> flat(size_t(M * W));
    codec::widen(send.data(), grad, M * W, flat.data());
    if (Status s =
            comm_->reduce_scatter_f32(flat.data(), sum.data(), size_t(M));
        !s)
      return s;
  }
  const float w = float(W);
  for (float &x : sum)
    x = x / w;
  mine.assign(size_t(M * es), 0);
  codec::narrow(sum.data(), M, grad, mine.data());
  return Status::success();
}

Status DataParallel::reduce_sharded(Optimizer &opt, int bi) {
  try {
    const Manifest &m = opt.manifest();
    Backend &dev = opt.backend();
    const int W = comm_->size(), me = comm_->rank();
    const int64_t es = dtype_bits(m.grad) / 8; // gradients: whole bytes
    const int64_t M = maxOwned(bi);
    // Where piece `pc`'s gradient is in `opt`.
    auto gradOf = [&](const Piece &pc) -> Expected<uint8_t *> {
      Expected<BufferView> g = opt.buffer(pc.tensor, "grad");
      if (!g)
        return g.status();
      return static_cast<uint8_t *>(g->data) + pc.offset * es;
    };
    // Contributions packed by owner (forEachPackedPiece).
    std::vector<uint8_t> send(size_t(W * M * es), 0);
    if (Status s = forEachPackedPiece(
            bi,
            [&](const Piece &pc, int64_t at) -> Status {
              Expected<uint8_t *> g = gradOf(pc);
              return g ? dev.read(*g, send.data() + at * es, pc.count * es)
                       : g.status();
            });
        !s)
      return s;
    std::vector<uint8_t> mine;
    if (Status s = averageBlocks(send, m.grad, M, mine); !s)
      return s;
    if (Status s = forEachOwnedPiece(
            bi, me,
            [&](const Piece &pc, int64_t at) {
              const OwnedRange r = ranges_[size_t(pc.tensor)];
              // Owner tensor k's gradient is stage_[k] (added in order).
              const Stage &st = stage_[size_t(ownerIndex_[size_t(pc.tensor)])];
              return owner_->backend().write(
                  static_cast<uint8_t *>(st.mem.get()) +
                      (pc.offset - r.begin) * es,
                  mine.data() + at * es, pc.count * es);
            });
        !s)
      return s;
    if (!fullGrads_)
      return Status::success();
    // Clipping: every rank needs every averaged gradient.
    std::vector<uint8_t> all(send.size());
    if (Status s = comm_->all_gather(mine.data(), all.data(), size_t(M * es));
        !s)
      return s;
    return forEachPackedPiece(bi, [&](const Piece &pc, int64_t at) -> Status {
      Expected<uint8_t *> g = gradOf(pc);
      return g ? dev.write(*g, all.data() + at * es, pc.count * es)
               : g.status();
    });
  } catch (const std::exception &e) {
    return Status::from_exception(e, "reduce_bucket (sharded): ");
  }
}

Status DataParallel::step_shards(Optimizer &opt, int64_t t,
                                 abi::KernelKind kernel) {
  try {
    const Manifest &m = opt.manifest();
    // The full optimizer keeps the envelopes its checkpoints record.
    if (kernel != abi::KernelKind::Accumulate)
      opt.note_hyper_step();
    if (Status s = syncHypers(opt, *owner_); !s)
      return s;
    const int64_t pes = dtype_bits(m.param) / 8; // parameters: whole bytes
    std::vector<int64_t> idx;
    for (size_t i = 0; i < ownerIndex_.size(); ++i) {
      if (ownerIndex_[i] < 0)
        continue;
      // The caller may have re-pointed its parameter.
      void *p = static_cast<uint8_t *>(opt.tensor(int64_t(i)).param) +
                ranges_[i].begin * pes;
      if (Status s = owner_->set_param(ownerIndex_[i], p); !s)
        return s;
      idx.push_back(ownerIndex_[i]);
    }
    if (Status s = owner_->step_tensors(idx, t, kernel); !s)
      return s;
    owner_->set_step_count(t);
    if (Status s = owner_->synchronize(); !s)
      return s;
    // All-gather the stepped parameters, bucket by bucket.
    Backend &dev = opt.backend();
    const int W = comm_->size(), me = comm_->rank();
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const int64_t M = maxOwned(int(b));
      std::vector<uint8_t> mine(size_t(M * pes), 0), all(size_t(W * M * pes));
      if (Status s = forEachOwnedPiece(
              int(b), me,
              [&](const Piece &pc, int64_t at) {
                return dev.read(
                    static_cast<const uint8_t *>(opt.tensor(pc.tensor).param) +
                        pc.offset * pes,
                    mine.data() + at * pes, pc.count * pes);
              });
          !s)
        return s;
      if (Status s =
              comm_->all_gather(mine.data(), all.data(), size_t(M * pes));
          !s)
        return s;
      // Every other rank's parameters (this rank's are already in place).
      if (Status s = forEachPackedPiece(
              int(b),
              [&](const Piece &pc, int64_t at) {
                return dev.write(
                    static_cast<uint8_t *>(opt.tensor(pc.tensor).param) +
                        pc.offset * pes,
                    all.data() + at * pes, pc.count * pes);
              },
              /*except=*/me);
          !s)
        return s;
    }
    return Status::success();
  } catch (const std::exception &e) {
    return Status::from_exception(e, "step (sharded): ");
  }
}

Expected<const BufferSpec *>
DataParallel::shardedBuffer(const Manifest &m, const std::string &name) const {
  Expected<int> found = find_buffer(m, name);
  if (!found)
    return found.status();
  const BufferSpec &spec = m.buffers[size_t(*found)];
  return sharded() && runtimeOwned(spec) ? &spec : nullptr;
}

Expected<std::vector<uint8_t>>
DataParallel::gather_buffer(Optimizer &opt, int64_t tensor,
                            const std::string &name) {
  const Manifest &m = opt.manifest();
  Expected<const BufferSpec *> shardSpec = shardedBuffer(m, name);
  if (!shardSpec)
    return shardSpec.status();
  if (!*shardSpec)
    return opt.read_buffer(tensor, name);
  const BufferSpec &spec = **shardSpec;
  try {
    const int W = comm_->size();
    const int64_t G = m.group_size, numel = layout_[size_t(tensor)].numel;
    std::vector<std::pair<int64_t, int64_t>> spans;
    int64_t most = 0;
    for (int q = 0; q < W; ++q) {
      OwnedRange r = owned_range(numel, G, q, W);
      spans.push_back(r.end > r.begin ? byteRange(spec, G, r)
                                      : std::make_pair(int64_t(0), int64_t(0)));
      most = std::max(most, spans.back().second - spans.back().first);
    }
    std::vector<uint8_t> mine(size_t(most), 0);
    if (int64_t k = ownerIndex_[size_t(tensor)]; k >= 0) {
      Expected<std::vector<uint8_t>> b = owner_->read_buffer(k, name);
      if (!b)
        return b.status();
      std::memcpy(mine.data(), b->data(), b->size());
    }
    std::vector<uint8_t> all(size_t(most) * size_t(W));
    if (Status s = comm_->all_gather(mine.data(), all.data(), size_t(most)); !s)
      return s;
    std::vector<uint8_t> out(size_t(spans.back().second), 0);
    for (int q = 0; q < W; ++q)
      std::memcpy(out.data() + spans[size_t(q)].first,
                  all.data() + size_t(q) * size_t(most),
                  size_t(spans[size_t(q)].second - spans[size_t(q)].first));
    return out;
  } catch (const std::exception &e) {
    return Status::from_exception(e, "gather_buffer: ");
  }
}

Status DataParallel::scatter_buffer(Optimizer &opt, int64_t tensor,
                                    const std::string &name, const void *data,
                                    int64_t bytes) {
  const Manifest &m = opt.manifest();
  Expected<const BufferSpec *> shardSpec = shardedBuffer(m, name);
  if (!shardSpec)
    return shardSpec.status();
  if (!*shardSpec)
    return opt.write_buffer(tensor, name, data, bytes);
  const BufferSpec &spec = **shardSpec;
  const int64_t G = m.group_size, numel = layout_[size_t(tensor)].numel;
  const int64_t whole = int64_t(dtype_bytes(
      spec.dtype,
      uint64_t(spec.per == Per::Group ? (numel + G - 1) / G : numel)));
  if (bytes != whole)
    return Status::error(
        Code::InvalidArgument,
        "buffer " + name + " of tensor " + std::to_string(tensor) + " holds " +
            std::to_string(whole) + " bytes, not " + std::to_string(bytes));
  const int64_t k = ownerIndex_[size_t(tensor)];
  if (k < 0)
    return Status::success(); // another rank's
  auto [a, z] = byteRange(spec, G, ranges_[size_t(tensor)]);
  return owner_->write_buffer(k, name, static_cast<const uint8_t *>(data) + a,
                              z - a);
}

BytesReport DataParallel::shard_bytes() const {
  BytesReport r;
  if (!sharded())
    return r;
  BytesReport o = owner_->bytes();
  r.numel = o.numel;
  r.correction = o.correction;
  r.states = o.states;
  int64_t staging = 0;
  for (const Stage &s : stage_)
    staging += s.bytes;
  r.runtime_allocated = o.runtime_allocated + staging;
  return r;
}

} // namespace flashopt::dist
