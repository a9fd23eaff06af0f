//===- DataParallel.cpp - Replicated data parallelism ----------------------===//
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
  const int64_t cap = int64_t(std::max<size_t>(cap_bytes, 1));
  for (size_t i = 0; i < layout.size(); ++i) {
    int64_t bytes = layout[i].numel * grad_bytes;
    if (out.empty() || (out.back().numel * grad_bytes + bytes > cap &&
                        out.back().count > 0))
      out.push_back({int64_t(i), 0, 0});
    out.back().count += 1;
    out.back().numel += layout[i].numel;
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
    return std::string(all.data() + size_t(r) * maxLen, size_t(lens[size_t(r)]));
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
    return Status::error("the ranks registered different layouts: rank " +
                         std::to_string(r) + " has " + rb + " where rank 0 has " +
                         ra + " (line " + std::to_string(k + 1) + ")");
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
                     size_t bucket_bytes) {
  try {
    const Manifest &m = opt.manifest();
    if (Status s = checkLayouts(
            *comm, layout_text(m, opt.num_param_groups(), layout));
        !s)
      return s;
    if (!deterministic && !comm->has_reduce_scatter())
      return Status::error(comm->name() + " has no reduce_scatter_f32 for "
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
    dp->buckets_ = plan_buckets(layout, dtype_size(m.grad),
                                bucket_bytes ? bucket_bytes : size_t(25) << 20);
    dp->reduced_.assign(dp->buckets_.size(), false);
    return dp;
  } catch (const std::exception &e) {
    return Status::error(std::string("attach: ") + e.what());
  }
}

Status DataParallel::reduce_bucket(Optimizer &opt, int bi) {
  if (bi < 0 || bi >= int(buckets_.size()))
    return Status::error("bucket " + std::to_string(bi) +
                         " does not exist (there are " +
                         std::to_string(buckets_.size()) + ")");
  if (reduced_[size_t(bi)])
    return Status::error("bucket " + std::to_string(bi) +
                         " was already reduced for this step");
  try {
    const Bucket &bk = buckets_[size_t(bi)];
    const Manifest &m = opt.manifest();
    const int64_t W = comm_->size();
    const int64_t slice = (bk.numel + W - 1) / W;
    // The bucket's gradients as fp32, padded to W slices.
    std::vector<float> flat(size_t(slice * W), 0.0f);
    int64_t at = 0;
    for (int64_t i = bk.first; i < bk.first + bk.count; ++i) {
      Expected<std::vector<uint8_t>> g = opt.read_buffer(i, "grad");
      if (!g)
        return g.status();
      int64_t n = opt.tensor(i).numel;
      codec::widen(g->data(), m.grad, n, flat.data() + at);
      at += n;
    }
    // Reduce-scatter: this rank's slice, summed over the ranks.
    std::vector<float> mine(size_t(slice), 0.0f);
    if (deterministic_) {
      std::vector<float> parts(size_t(slice * W));
      if (Status s = comm_->all_to_all(flat.data(), parts.data(),
                                       size_t(slice) * sizeof(float));
          !s)
        return s;
      for (int64_t r = 0; r < W; ++r) // rank order, fp32
        for (int64_t k = 0; k < slice; ++k)
          mine[size_t(k)] = r == 0 ? parts[size_t(k)]
                                   : mine[size_t(k)] + parts[size_t(r * slice + k)];
    } else if (Status s = comm_->reduce_scatter_f32(flat.data(), mine.data(),
                                                    size_t(slice));
               !s) {
      return s;
    }
    const float w = float(W);
    for (float &x : mine)
      x = x / w;
    // All-gather the averaged slices and write them back, rounded once.
    if (Status s = comm_->all_gather(mine.data(), flat.data(),
                                     size_t(slice) * sizeof(float));
        !s)
      return s;
    at = 0;
    for (int64_t i = bk.first; i < bk.first + bk.count; ++i) {
      int64_t n = opt.tensor(i).numel;
      std::vector<uint8_t> out(size_t(n * dtype_size(m.grad)));
      codec::narrow(flat.data() + at, n, m.grad, out.data());
      if (Status s = opt.write_buffer(i, "grad", out.data(), int64_t(out.size()));
          !s)
        return s;
      at += n;
    }
    reduced_[size_t(bi)] = true;
    return Status::success();
  } catch (const std::exception &e) {
    return Status::error(std::string("reduce_bucket: ") + e.what());
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

Expected<bool> DataParallel::all_finite(Optimizer &opt) {
  std::vector<int64_t> all(size_t(opt.num_tensors()));
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = int64_t(i);
  Expected<bool> mine = opt.grads_finite(all);
  if (!mine)
    return mine.status();
  Expected<bool> bad = comm_->any(!*mine);
  if (!bad)
    return bad.status();
  return !*bad;
}

} // namespace flashopt::dist
