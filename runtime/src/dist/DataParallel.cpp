//===- DataParallel.cpp - Replicated data parallelism
//----------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "DataParallel.h"

#include "codec/Codec.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <sstream>

namespace flashopt::dist {

using namespace flashopt::host;

std::vector<Bucket> plan_buckets(const std::vector<LayoutEntry> &layout,
                                 int grad_bytes, size_t cap_bytes) {
  std::vector<Bucket> out;
  const int64_t cap = std::max<int64_t>(
      1, int64_t(std::max<size_t>(cap_bytes, 1)) / grad_bytes);
  for (size_t i = 0; i < layout.size(); ++i)
    for (int64_t off = 0; off < layout[i].numel;) {
      if (out.empty() || out.back().numel == cap)
        out.push_back({});
      Bucket &bk = out.back();
      int64_t take = std::min(cap - bk.numel, layout[i].numel - off);
      bk.pieces.push_back({int64_t(i), off, take});
      bk.numel += take;
      off += take;
    }
  for (Bucket &bk : out) {
    bk.first = bk.pieces.front().tensor;
    bk.count = bk.pieces.back().tensor - bk.first + 1;
  }
  return out;
}

std::string layout_text(const Manifest &m, int num_param_groups,
                        const std::vector<LayoutEntry> &layout) {
  std::ostringstream os;
  os << "spec " << m.name << " (" << m.spec_hash << ")\n";
  os << num_param_groups << " param groups\n";
  os << layout.size() << " parameters\n";
  for (size_t i = 0; i < layout.size(); ++i)
    os << "parameter " << i << " '" << layout[i].name << "': numel "
       << layout[i].numel << ", param group " << layout[i].group << "\n";
  return os.str();
}

namespace {

std::vector<std::string> lines(const std::string &s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string l; std::getline(is, l);)
    out.push_back(l);
  return out;
}

/// Every rank's layout text; an error naming the first rank and line that
/// differ from rank 0's (the same message on every rank).
Status checkLayouts(Communicator &c, const std::string &mine) {
  const int W = c.size();
  uint64_t len = mine.size();
  std::vector<uint64_t> lens(static_cast<size_t>(W), 0);
  if (Status s = c.all_gather(&len, lens.data(), sizeof len); !s)
    return s;
  uint64_t maxLen = *std::max_element(lens.begin(), lens.end());
  // Bounded: a layout line per parameter, so a few MB even for huge models.
  std::vector<char> padded(size_t(maxLen), '\0');
  std::memcpy(padded.data(), mine.data(), mine.size());
  std::vector<char> all(size_t(maxLen) * size_t(W));
  if (Status s = c.all_gather(padded.data(), all.data(), size_t(maxLen)); !s)
    return s;
  auto textOf = [&](int r) {
    return std::string(all.data() + size_t(r) * maxLen,
                       size_t(lens[size_t(r)]));
  };
  const std::string root = textOf(0);
  for (int r = 1; r < W; ++r) {
    std::string other = textOf(r);
    if (other == root)
      continue;
    std::vector<std::string> a = lines(root), b = lines(other);
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k])
      ++k;
    std::string ra = k < a.size() ? "'" + a[k] + "'" : "nothing more";
    std::string rb = k < b.size() ? "'" + b[k] + "'" : "nothing more";
    return Status::error(Code::Mismatch,
                         "the ranks registered different layouts: rank " +
                         std::to_string(r) + " has " + rb +
                         " where rank 0 has " + ra + " (line " +
                         std::to_string(k + 1) + ")");
  }
  return Status::success();
}

/// The buffers rank 0 copies to the others: param, correction, states.
std::vector<std::string> replicatedBuffers(const Manifest &m) {
  std::vector<std::string> out;
  for (const BufferSpec &b : m.buffers)
    if (b.role != BufferRole::Grad)
      out.push_back(b.name);
  return out;
}

} // namespace

Expected<std::unique_ptr<DataParallel>>
DataParallel::attach(std::shared_ptr<Communicator> comm, Optimizer &opt,
                     const std::vector<LayoutEntry> &layout, bool deterministic,
                     size_t bucket_bytes, const OwnerFactory &make_owner) {
  try {
    const Manifest &m = opt.manifest();
    // The layout, and how it will be reduced: ranks that bucket or reduce
    // differently would call different collectives and hang.
    std::string text = layout_text(m, opt.num_param_groups(), layout);
    text += std::string(make_owner ? "sharded" : "replicated") + ", reduce " +
            (deterministic ? "deterministic" : "fast") + ", buckets of " +
            std::to_string(bucket_bytes) + " bytes\n";
    // Ranks that reduce through different engines would hang, too.
    text += std::string("gradients reduced in ") +
            (!make_owner && comm->has_reduce_mean_device() &&
                     opt.backend().memory_is_device()
                 ? "device memory"
                 : "host memory") +
            "\n";
    if (Status s = checkLayouts(*comm, text); !s)
      return s;
    if (!deterministic && !comm->has_reduce_scatter())
      return Status::error(Code::Unsupported,
                           comm->name() + " has no reduce_scatter_f32 for "
                                          "FLASHOPT_REDUCE_FAST");
    // Rank 0's parameters, correction terms and states, everywhere.
    for (int64_t i = 0; i < opt.num_tensors(); ++i)
      for (const std::string &name : replicatedBuffers(m)) {
        Expected<std::vector<uint8_t>> bytes = opt.read_buffer(i, name);
        if (!bytes)
          return bytes.status();
        if (Status s = comm->broadcast(bytes->data(), bytes->size(), 0); !s)
          return s;
        if (comm->rank() != 0)
          if (Status s = opt.write_buffer(i, name, bytes->data(),
                                          int64_t(bytes->size()));
              !s)
            return s;
      }
    std::unique_ptr<DataParallel> dp(new DataParallel());
    dp->comm_ = std::move(comm);
    dp->deterministic_ = deterministic;
    dp->buckets_ = plan_buckets(layout, dtype_bits(m.grad) / 8,
                                bucket_bytes ? bucket_bytes : size_t(25) << 20);
    dp->reduced_.assign(dp->buckets_.size(), false);
    if (make_owner) {
      // Every rank learns whether any failed to shard (else the others
      // would wait in their first collective).
      Status s = dp->shard(opt, layout, make_owner);
      Expected<bool> bad = dp->comm_->any(!s);
      if (!bad)
        return bad.status();
      if (!s)
        return s.prefixed("sharding: ");
      if (*bad)
        return Status::error(Code::Comm, "sharding failed on another rank");
    }
    return dp;
  } catch (const std::exception &e) {
    return Status::from_exception(e, "attach: ");
  }
}

Status DataParallel::reduceOnDevice(Optimizer &opt, const Bucket &bk) {
  static_assert(int(DType::BF16) == FLASHOPT_BF16 &&
                    int(DType::F16) == FLASHOPT_F16 &&
                    int(DType::F32) == FLASHOPT_F32,
                "host and C dtype numbering agree");
  const int64_t es = dtype_bits(opt.manifest().grad) / 8; // never packed
  std::vector<void *> ptrs;
  std::vector<int64_t> counts;
  for (const Piece &pc : bk.pieces) {
    Expected<BufferView> g = opt.buffer(pc.tensor, "grad");
    if (!g)
      return g.status();
    ptrs.push_back(static_cast<uint8_t *>(g->data) + pc.offset * es);
    counts.push_back(pc.count);
  }
  // The step's kernels and the caller's writes of the gradients are done.
  if (Status s = opt.backend().synchronize(); !s)
    return s;
  return comm_->reduce_mean_device(
      ptrs.data(), counts.data(), ptrs.size(), int32_t(opt.manifest().grad),
      deterministic_ ? FLASHOPT_REDUCE_DETERMINISTIC : FLASHOPT_REDUCE_FAST);
}

Status DataParallel::reduce_bucket(Optimizer &opt, int bi) {
  if (bi < 0 || bi >= int(buckets_.size()))
    return Status::error(Code::InvalidArgument,
                         "bucket " + std::to_string(bi) +
                             " does not exist (there are " +
                             std::to_string(buckets_.size()) + ")");
  if (reduced_[size_t(bi)])
    return Status::error(Code::State, "bucket " + std::to_string(bi) +
                                          " was already reduced for this step");
  if (sharded()) {
    Status s = reduce_sharded(opt, bi);
    if (s)
      reduced_[size_t(bi)] = true;
    return s;
  }
  try {
    const Bucket &bk = buckets_[size_t(bi)];
    const Manifest &m = opt.manifest();
    Backend &dev = opt.backend();
    if (comm_->has_reduce_mean_device() && dev.memory_is_device()) {
      // The engine averages the pieces in device memory (NCCL): the
      // gradients never leave the device.
      if (Status s = reduceOnDevice(opt, bk); !s)
        return s;
      reduced_[size_t(bi)] = true;
      return Status::success();
    }
    const int64_t W = comm_->size();
    const int64_t es = dtype_bits(m.grad) / 8; // gradients: whole bytes
    const int64_t slice = (bk.numel + W - 1) / W;
    // The bucket's gradients, packed in their own dtype and padded to W
    // slices (read straight from the gradient buffers, piece by piece).
    std::vector<uint8_t> packed(size_t(slice * W * es), 0);
    int64_t at = 0;
    for (const Piece &pc : bk.pieces) {
      Expected<BufferView> g = opt.buffer(pc.tensor, "grad");
      if (!g)
        return g.status();
      if (Status s =
              dev.read(static_cast<const uint8_t *>(g->data) + pc.offset * es,
                       packed.data() + at * es, pc.count * es);
          !s)
        return s;
      at += pc.count;
    }
    // Reduce-scatter: this rank's slice, summed over the ranks in fp32,
    // averaged and rounded once to the gradient dtype.
    std::vector<float> sum(size_t(slice), 0.0f);
    if (deterministic_) {
      // The W contributions travel in the gradient dtype (widening is
      // exact) and are summed in rank order.
      std::vector<uint8_t> parts(packed.size());
      if (Status s = comm_->all_to_all(packed.data(), parts.data(),
                                       size_t(slice * es));
          !s)
        return s;
      std::vector<float> wide(static_cast<size_t>(slice));
      for (int64_t r = 0; r < W; ++r) {
        codec::widen(parts.data() + r * slice * es, m.grad, slice,
                     r == 0 ? sum.data() : wide.data());
        if (r > 0)
          for (int64_t k = 0; k < slice; ++k)
            sum[size_t(k)] = sum[size_t(k)] + wide[size_t(k)];
      }
    } else {
      std::vector<float> flat(size_t(slice * W));
      codec::widen(packed.data(), m.grad, slice * W, flat.data());
      if (Status s =
              comm_->reduce_scatter_f32(flat.data(), sum.data(), size_t(slice));
          !s)
        return s;
    }
    const float w = float(W);
    for (float &x : sum)
      x = x / w;
    std::vector<uint8_t> mine(size_t(slice * es));
    codec::narrow(sum.data(), slice, m.grad, mine.data());
    // All-gather the averaged slices and write them back.
    if (Status s =
            comm_->all_gather(mine.data(), packed.data(), size_t(slice * es));
        !s)
      return s;
    at = 0;
    for (const Piece &pc : bk.pieces) {
      Expected<BufferView> g = opt.buffer(pc.tensor, "grad");
      if (!g)
        return g.status();
      if (Status s = dev.write(static_cast<uint8_t *>(g->data) + pc.offset * es,
                               packed.data() + at * es, pc.count * es);
          !s)
        return s;
      at += pc.count;
    }
    reduced_[size_t(bi)] = true;
    return Status::success();
  } catch (const std::exception &e) {
    return Status::from_exception(e, "reduce_bucket: ");
  }
}

Status DataParallel::reduce_remaining(Optimizer &opt) {
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!reduced_[b])
      if (Status s = reduce_bucket(opt, int(b)); !s)
        return s;
  return Status::success();
}

void DataParallel::step_done() { reduced_.assign(buckets_.size(), false); }

bool DataParallel::any_reduced() const {
  for (bool r : reduced_)
    if (r)
      return true;
  return false;
}

Expected<bool> DataParallel::agree(const StepView &mine) {
  struct Wire {
    uint8_t skip, finite, pad[6];
    double maxNorm;
    uint64_t hyperHash;
    int64_t step;
    int64_t microBatches;
    double normalizer;
  };
  static_assert(sizeof(Wire) == 48, "a fixed wire layout");
  Wire w{};
  w.skip = mine.skip_policy;
  w.finite = mine.finite;
  w.maxNorm = mine.max_grad_norm;
  w.hyperHash = mine.hyper_hash;
  w.step = mine.step;
  w.microBatches = mine.micro_batches;
  w.normalizer = mine.normalizer;
  std::vector<Wire> all(static_cast<size_t>(comm_->size()));
  if (Status s = comm_->all_gather(&w, all.data(), sizeof w); !s)
    return s;
  bool anyNonFinite = false;
  for (size_t r = 0; r < all.size(); ++r) {
    const Wire &x = all[r], &z = all[0];
    std::string what;
    if (x.skip != z.skip)
      what = std::string("the NaN policy (") + (x.skip ? "SKIP" : "PROPAGATE") +
             " vs " + (z.skip ? "SKIP" : "PROPAGATE") + ")";
    else if (std::memcmp(&x.maxNorm, &z.maxNorm, sizeof x.maxNorm) != 0)
      what = "the gradient-norm clipping threshold (" +
             std::to_string(x.maxNorm) + " vs " + std::to_string(z.maxNorm) +
             ")";
    else if (x.hyperHash != z.hyperHash)
      what = "the hyper-parameters (set the same values on every rank)";
    else if (x.step != z.step)
      what = "the step counter (" + std::to_string(x.step) + " vs " +
             std::to_string(z.step) + ")";
    else if (x.microBatches != z.microBatches)
      what = "the number of accumulated micro-batches (" +
             std::to_string(x.microBatches) + " vs " +
             std::to_string(z.microBatches) + ")";
    else if (std::memcmp(&x.normalizer, &z.normalizer, sizeof x.normalizer) !=
             0)
      what = "the accumulation normalizer (" + std::to_string(x.normalizer) +
             " vs " + std::to_string(z.normalizer) + ")";
    if (!what.empty())
      return Status::error(Code::Mismatch,
                           "the ranks disagree before this step: rank " +
                           std::to_string(r) + " differs from rank 0 in " +
                           what);
    anyNonFinite = anyNonFinite || (x.skip && !x.finite);
  }
  return anyNonFinite;
}

} // namespace flashopt::dist
