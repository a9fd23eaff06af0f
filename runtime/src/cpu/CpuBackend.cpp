//===- CpuBackend.cpp - The optimizer on the host CPU ---------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The CPU backend (Backend.h): host arenas, the dlopen'ed kernel called on
/// the thread pool over group-aligned chunks, host memory reads and writes;
/// and CpuOptimizer, the core over it. See CpuOptimizer.h.
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/CpuOptimizer.h"

#include "ThreadPool.h"
#include "flashopt/host/Float16.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <new>

namespace flashopt::host {

namespace {

/// A 64-byte aligned, zero-filled, growable byte arena.
struct Arena {
  uint8_t *data = nullptr;
  int64_t capacity = 0; ///< bytes
  int64_t used = 0;     ///< entries (elements or groups) handed out
  int bits = 8;         ///< bits per entry (4: packed two per byte)

  Arena() = default;
  Arena(const Arena &) = delete;
  Arena &operator=(const Arena &) = delete;
  Arena(Arena &&o) noexcept { *this = std::move(o); }
  Arena &operator=(Arena &&o) noexcept {
    std::swap(data, o.data);
    std::swap(capacity, o.capacity);
    std::swap(used, o.used);
    std::swap(bits, o.bits);
    return *this;
  }
  ~Arena() { std::free(data); }

  /// Bytes of `entries` entries (a multiple of 64 entries is whole bytes at
  /// every width: 32 for a nibble buffer).
  int64_t bytesOf(int64_t entries) const { return (entries * bits + 7) / 8; }

  /// Reserves `count` entries starting at a 64-entry boundary; returns the
  /// entry offset. Throws std::bad_alloc.
  int64_t allocate(int64_t count) {
    int64_t offset = (used + 63) / 64 * 64;
    int64_t end = offset + count;
    int64_t needBytes = bytesOf((end + 63) / 64 * 64); // keep the tail padded
    if (needBytes > capacity) {
      int64_t cap = std::max<int64_t>(needBytes, capacity * 2);
      cap = (cap + 63) / 64 * 64;
      void *p = nullptr;
      if (posix_memalign(&p, 64, size_t(cap)) != 0 || !p)
        throw std::bad_alloc();
      std::memset(p, 0, size_t(cap));
      if (data)
        std::memcpy(p, data, size_t(bytesOf(used)));
      std::free(data);
      data = static_cast<uint8_t *>(p);
      capacity = cap;
    }
    used = end;
    return offset;
  }
};

/// Whether n values of a BF16/F16/F32 buffer are all finite.
bool allFinite(const void *data, DType dtype, int64_t begin, int64_t end) {
  switch (dtype) {
  case DType::F32: {
    const uint32_t *p = static_cast<const uint32_t *>(data);
    uint32_t bad = 0;
    for (int64_t i = begin; i < end; ++i)
      bad |= uint32_t((p[i] & 0x7F800000u) == 0x7F800000u);
    return bad == 0;
  }
  case DType::BF16:
  case DType::F16: {
    const uint16_t mask = dtype == DType::BF16 ? 0x7F80u : 0x7C00u;
    const uint16_t *p = static_cast<const uint16_t *>(data);
    uint32_t bad = 0;
    for (int64_t i = begin; i < end; ++i)
      bad |= uint32_t((p[i] & mask) == mask);
    return bad == 0;
  }
  default:
    return true; // integer gradients do not exist; nothing to scan
  }
}

/// The sum of x^2 over elements [begin, end) of a BF16/F16/F32 buffer, in
/// double, in order.
double sumSquares(const void *data, DType dtype, int64_t begin, int64_t end) {
  double s = 0.0;
  for (int64_t i = begin; i < end; ++i) {
    float x;
    switch (dtype) {
    case DType::F32:
      x = static_cast<const float *>(data)[i];
      break;
    case DType::BF16:
      x = bf16_to_f32(static_cast<const uint16_t *>(data)[i]);
      break;
    case DType::F16:
      x = f16_to_f32(static_cast<const uint16_t *>(data)[i]);
      break;
    default:
      x = 0.0f;
    }
    s += double(x) * double(x);
  }
  return s;
}

} // namespace

class CpuBackend final : public Backend {
public:
  CpuBackend(std::shared_ptr<CpuBundle> bundle, const CpuOptimizerOptions &opts)
      : bundle_(std::move(bundle)), m_(&bundle_->manifest()) {
    arenas_.resize(m_->buffers.size());
    for (size_t b = 0; b < arenas_.size(); ++b)
      arenas_[b].bits = dtype_bits(m_->buffers[b].dtype);
    minGroups_ = opts.min_groups_per_chunk > 0
                     ? opts.min_groups_per_chunk
                     : std::max<int64_t>(1, 32768 / m_->group_size);
    setThreads(std::clamp(opts.threads, 0, kMaxCpuThreads));
  }

  const CpuBundle &bundle() const { return *bundle_; }
  const std::shared_ptr<CpuBundle> &sharedBundle() const { return bundle_; }
  int threads() const { return threads_; }
  int64_t minGroups() const { return minGroups_; }

  /// Throws when threads cannot be started (pool_ is then empty).
  void setThreads(int n) {
    pool_.reset();
    threads_ = n <= 0 ? default_threads() : n;
    pool_ = std::make_unique<ThreadPool>(threads_ - 1);
  }
  void singleThreaded() { threads_ = 1; }

  /// The chunks of the group range [0, total) of records whose first groups
  /// (relative to the range) are `firsts`.
  std::vector<Chunk> chunks(int64_t total,
                            const std::vector<int64_t> &firsts) const {
    return split_groups(
        total, firsts, threads_, minGroups_,
        std::max<int64_t>(1, abi::kSliceAlignEntries / m_->group_size));
  }

  // ---- Backend -------------------------------------------------------------
  const Manifest &manifest() const override { return *m_; }
  const char *kind() const override { return "cpu"; }
  bool memory_is_device() const override { return false; }
  bool scans_gradients() const override { return true; }

  Status check_address(const char *, const char *,
                       const void *) const override {
    return Status::success(); // host kernels take any alignment
  }
  /// CPU kernels index with 64-bit math: one record per tensor.
  int64_t max_record_elements() const override {
    return std::numeric_limits<int64_t>::max();
  }

  Expected<int64_t> reserve(size_t b, int64_t entries) override {
    try {
      return arenas_[b].allocate(entries);
    } catch (const std::bad_alloc &) {
      return Status::error(Code::OutOfMemory,
                           "out of memory allocating state for " +
                           std::to_string(entries) + " entries of buffer \"" +
                           m_->buffers[b].name + "\"");
    }
  }
  Status commit() override { return Status::success(); }
  bool committed() const override { return true; }
  int64_t arena_address(size_t b) const override {
    return int64_t(reinterpret_cast<intptr_t>(arenas_[b].data));
  }
  Status release_arenas(const std::vector<bool> &which) override {
    for (size_t b = 0; b < arenas_.size(); ++b) {
      if (b >= which.size() || !which[b])
        continue;
      Arena &a = arenas_[b];
      Arena empty;
      empty.bits = a.bits;
      std::swap(a, empty);
    }
    return Status::success();
  }
  int64_t allocated_bytes() const override {
    int64_t n = 0;
    for (const Arena &a : arenas_)
      n += a.capacity;
    return n;
  }

  Status launch(const LaunchRequest &r, const std::vector<int64_t> &table,
                uint64_t, const HyperTable &hypers) override {
    const int64_t R = m_->record_words;
    const int64_t *records = r.use_compacted
                                 ? r.compacted->data()
                                 : table.data() + r.first_record * R;
    // Chunk boundaries align to 64-element boundaries of each record (a
    // record starts a tensor or a multiple of 64 groups into one).
    std::vector<int64_t> firsts(size_t(r.num_records));
    for (int64_t k = 0; k < r.num_records; ++k)
      firsts[size_t(k)] =
          records[k * R + abi::kRecordFirstGroup] - r.group_begin;
    std::vector<Chunk> cs = chunks(r.group_end - r.group_begin, firsts);
    KernelFn fn = bundle_->fn(r.kernel);
    if (!fn)
      return Status::error(Code::Unsupported,
                           std::string("step: ") + m_->name + " has no " +
                               abi::kernel_kind_name(r.kernel) + " kernel");
    const float *h = hypers.values().data();
    const int64_t n = r.num_records, t = r.step, base = r.group_begin;
    if (cs.size() == 1 || !pool_) {
      for (const Chunk &c : cs)
        fn(records, n, h, t, base + c.begin, base + c.end);
    } else {
      pool_->run(int64_t(cs.size()), [&](int64_t k) {
        const Chunk &c = cs[size_t(k)];
        fn(records, n, h, t, base + c.begin, base + c.end);
      });
    }
    return Status::success();
  }

  Expected<bool> all_finite(const std::vector<ScanRange> &ranges,
                            DType dtype) override {
    // Pieces of at most 1 << 16 elements, scanned on the pool.
    struct Piece {
      const void *data;
      int64_t begin, end;
    };
    std::vector<Piece> pieces;
    const int64_t kPiece = int64_t(1) << 16;
    for (const ScanRange &g : ranges)
      for (int64_t off = 0; off < g.numel; off += kPiece)
        pieces.push_back({g.data, off, std::min(g.numel, off + kPiece)});
    std::atomic<bool> finite{true};
    auto scan = [&](int64_t k) {
      if (!finite.load(std::memory_order_relaxed))
        return;
      const Piece &p = pieces[size_t(k)];
      if (!allFinite(p.data, dtype, p.begin, p.end))
        finite.store(false, std::memory_order_relaxed);
    };
    if (pool_ && pieces.size() > 1)
      pool_->run(int64_t(pieces.size()), scan);
    else
      for (size_t k = 0; k < pieces.size(); ++k)
        scan(int64_t(k));
    return finite.load();
  }

  Expected<std::vector<double>>
  sum_squares(const std::vector<ScanRange> &ranges, DType dtype) override {
    // Fixed pieces, each summed in order into its own slot, then added in
    // order: the same result whatever the pool does.
    struct Piece {
      const void *data;
      int64_t begin, end;
      size_t range;
    };
    std::vector<Piece> pieces;
    const int64_t kPiece = int64_t(1) << 16;
    for (size_t r = 0; r < ranges.size(); ++r)
      for (int64_t off = 0; off < ranges[r].numel; off += kPiece)
        pieces.push_back(
            {ranges[r].data, off, std::min(ranges[r].numel, off + kPiece), r});
    std::vector<double> partial(pieces.size(), 0.0);
    auto sum = [&](int64_t k) {
      const Piece &p = pieces[size_t(k)];
      partial[size_t(k)] = sumSquares(p.data, dtype, p.begin, p.end);
    };
    if (pool_ && pieces.size() > 1)
      pool_->run(int64_t(pieces.size()), sum);
    else
      for (size_t k = 0; k < pieces.size(); ++k)
        sum(int64_t(k));
    std::vector<double> out(ranges.size(), 0.0);
    for (size_t k = 0; k < pieces.size(); ++k)
      out[pieces[k].range] += partial[k];
    return out;
  }

  Status synchronize() override { return Status::success(); }

  Status read(const void *address, void *dst, int64_t bytes) override {
    std::memcpy(dst, address, size_t(bytes));
    return Status::success();
  }
  Status write(void *address, const void *src, int64_t bytes) override {
    std::memcpy(address, src, size_t(bytes));
    return Status::success();
  }

private:
  std::shared_ptr<CpuBundle> bundle_;
  const Manifest *m_;
  std::vector<Arena> arenas_; ///< per buffer (param/grad unused)
  int threads_ = 1;
  int64_t minGroups_ = 1;
  std::unique_ptr<ThreadPool> pool_;
};

CpuOptimizer::CpuOptimizer(std::unique_ptr<CpuBackend> backend)
    : Optimizer(std::move(backend)),
      cpu_(static_cast<CpuBackend *>(&this->backend())) {}

CpuOptimizer::~CpuOptimizer() = default;

Expected<std::unique_ptr<CpuOptimizer>>
CpuOptimizer::create(std::shared_ptr<CpuBundle> bundle,
                     const CpuOptimizerOptions &opts) {
  if (!bundle)
    return Status::error(Code::InvalidArgument,
                         "CpuOptimizer::create: null bundle");
  return create_over<CpuOptimizer, CpuBackend>("CpuOptimizer::create",
                                               std::move(bundle), opts);
}

Expected<std::unique_ptr<CpuOptimizer>>
CpuOptimizer::create(const std::string &dir, const CpuLoadOptions &load,
                     const CpuOptimizerOptions &opts) {
  Expected<std::shared_ptr<CpuBundle>> b = CpuBundle::load(dir, load);
  if (!b)
    return b.status();
  return create(std::move(b.value()), opts);
}

Expected<std::unique_ptr<Optimizer>> CpuOptimizer::create_sibling() const {
  CpuOptimizerOptions opts;
  opts.threads = cpu_->threads();
  opts.min_groups_per_chunk = cpu_->minGroups();
  Expected<std::unique_ptr<CpuOptimizer>> o =
      create(cpu_->sharedBundle(), opts);
  if (!o)
    return o.status();
  return std::unique_ptr<Optimizer>(std::move(o.value()));
}

const CpuBundle &CpuOptimizer::bundle() const { return cpu_->bundle(); }
int CpuOptimizer::threads() const { return cpu_->threads(); }

Status CpuOptimizer::set_threads(int n) {
  if (n < 0 || n > kMaxCpuThreads)
    return Status::error(Code::InvalidArgument,
                         "set_threads: threads must be in [0, " +
                             std::to_string(kMaxCpuThreads) +
                             "] (0 = all hardware threads), got " +
                             std::to_string(n));
  try {
    cpu_->setThreads(n);
  } catch (const std::exception &e) {
    cpu_->singleThreaded();
    // std::system_error (EAGAIN: no more threads) or std::bad_alloc.
    return Status::error(
        dynamic_cast<const std::bad_alloc *>(&e) ? Code::OutOfMemory
                                                 : Code::Internal,
        std::string("set_threads: cannot start threads: ") + e.what() +
            " (running on the calling thread only)");
  }
  return Status::success();
}

std::vector<Chunk> CpuOptimizer::plan_chunks() const {
  std::vector<int64_t> firsts;
  firsts.reserve(tensors().size());
  for (const TensorInfo &t : tensors())
    firsts.push_back(t.first_group);
  return cpu_->chunks(total_groups(), firsts);
}

} // namespace flashopt::host
