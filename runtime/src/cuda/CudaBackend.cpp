//===- CudaBackend.cpp - The optimizer on a CUDA device -------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The CUDA backend (Backend.h): device arenas grown on commit, the tensor
/// and hyper tables uploaded only when their generation changes, one
/// launch per step on the optimizer's stream, reads and writes ordered
/// after it; and CudaOptimizer, the core over it. See CudaOptimizer.h.
///
/// Exceptions are used inside this file only (allocation) and are always
/// turned into a Status before returning to the caller.
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/CudaOptimizer.h"

#include <exception>
#include <limits>
#include <sstream>

namespace flashopt::host {

using namespace cu;

namespace {

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

/// A zero-filled device arena of one buffer: slices are reserved on the
/// host (64-entry boundaries, as the CPU arena) and the memory is brought up
/// to the reserved size by commit().
struct DeviceArena {
  CUdeviceptr data = 0;
  int64_t capacity = 0; ///< bytes allocated
  int64_t used = 0;     ///< entries reserved
  int bits = 8;         ///< bits per entry (4: packed two per byte)

  int64_t reserve(int64_t count) {
    constexpr int64_t A = abi::kSliceAlignEntries;
    int64_t offset = (used + A - 1) / A * A;
    used = offset + count;
    return offset;
  }
  int64_t neededBytes() const {
    constexpr int64_t A = abi::kSliceAlignEntries;
    // A multiple of 64 entries is whole bytes at every width (32 for a
    // nibble buffer), so every slice starts 16-byte aligned.
    return ((used + A - 1) / A * A * bits + 7) / 8;
  }
};

} // namespace

class CudaBackend final : public Backend {
public:
  CudaBackend(std::shared_ptr<CudaBundle> bundle,
              const CudaOptimizerOptions &opts)
      : bundle_(std::move(bundle)), opts_(opts), ctx_(bundle_->context()),
        d_(&ctx_->driver()), m_(&bundle_->manifest()), stream_(opts.stream),
        blocksPerSm_(opts.blocks_per_sm > 0 ? opts.blocks_per_sm : 8),
        maxRecord_(opts.max_record_elements > 0
                       ? opts.max_record_elements
                       : gpu_max_record_elements(m_->group_size)) {
    arenas_.resize(m_->buffers.size());
    for (size_t b = 0; b < arenas_.size(); ++b)
      arenas_[b].bits = dtype_bits(m_->buffers[b].dtype);
  }

  ~CudaBackend() override {
    CudaContext::Scope scope(*ctx_);
    if (!scope.ok())
      return;
    d_->cuStreamSynchronize(stream_);
    for (DeviceArena &a : arenas_)
      if (a.data)
        d_->cuMemFree(a.data);
    for (CUdeviceptr p : {devTable_, devHypers_, devSubTable_})
      if (p)
        d_->cuMemFree(p);
  }

  const CudaBundle &bundle() const { return *bundle_; }
  const std::shared_ptr<CudaBundle> &sharedBundle() const { return bundle_; }
  const CudaOptimizerOptions &options() const { return opts_; }
  int64_t tableUploads() const { return tableUploads_; }
  int64_t hyperUploads() const { return hyperUploads_; }

  /// The grid of a launch of the `kind` kernel over `groups` groups.
  int64_t grid(int64_t groups,
               abi::KernelKind kind = abi::KernelKind::Step) const {
    const GpuKernelChoice &c = bundle_->choice();
    return gpu_grid_size(groups, m_->group_size,
                         bundle_->elements_per_thread(kind),
                         c.threads_per_block, ctx_->info().sm_count,
                         blocksPerSm_);
  }
  int64_t block() const { return bundle_->choice().threads_per_block; }

  // ---- Backend -------------------------------------------------------------
  const Manifest &manifest() const override { return *m_; }
  const char *kind() const override { return "cuda"; }
  bool memory_is_device() const override { return true; }
  /// No device-side scan or reduction yet (all_finite, sum_squares).
  bool scans_gradients() const override { return false; }

  Status check_address(const char *who, const char *what,
                       const void *address) const override {
    uint64_t p = uint64_t(reinterpret_cast<uintptr_t>(address));
    if (p % 16 == 0)
      return Status::success();
    return Status::error(Code::InvalidArgument,
                         std::string(who) + ": " + what + " address " + hex(p) +
                             " is not 16-byte aligned (GPU kernels use 128-bit "
                             "accesses)");
  }
  int64_t max_record_elements() const override { return maxRecord_; }

  Expected<int64_t> reserve(size_t b, int64_t entries) override {
    return arenas_[b].reserve(entries);
  }

  Status commit() override {
    if (committed())
      return Status::success();
    CudaContext::Scope scope(*ctx_);
    if (!scope.ok())
      return scope.status();
    for (size_t b = 0; b < arenas_.size(); ++b) {
      DeviceArena &a = arenas_[b];
      int64_t need = a.neededBytes();
      if (a.used == 0 || need <= a.capacity)
        continue;
      CUdeviceptr p = 0;
      Status s =
          d_->check(d_->cuMemAlloc(&p, size_t(need)),
                    "allocating " + std::to_string(need) + " bytes for " +
                        m_->name + " buffer \"" + m_->buffers[b].name +
                        "\" on " + ctx_->info().name);
      if (!s)
        return s;
      s = d_->check(d_->cuMemsetD8Async(p, 0, size_t(need), stream_),
                    "cuMemsetD8Async");
      if (s && a.data)
        s = d_->check(
            d_->cuMemcpyDtoDAsync(p, a.data, size_t(a.capacity), stream_),
            "cuMemcpyDtoDAsync (growing a state arena)");
      if (!s) {
        freeAfterStream(p);
        return s;
      }
      freeAfterStream(a.data);
      a.data = p;
      a.capacity = need;
    }
    return Status::success();
  }

  bool committed() const override {
    for (const DeviceArena &a : arenas_)
      if (a.used > 0 && a.neededBytes() > a.capacity)
        return false;
    return true;
  }

  int64_t arena_address(size_t b) const override {
    return int64_t(arenas_[b].data);
  }

  Status release_arenas(const std::vector<bool> &which) override {
    CudaContext::Scope scope(*ctx_);
    if (!scope.ok())
      return scope.status();
    for (size_t b = 0; b < arenas_.size(); ++b) {
      if (b >= which.size() || !which[b])
        continue;
      freeAfterStream(arenas_[b].data);
      DeviceArena empty;
      empty.bits = arenas_[b].bits;
      arenas_[b] = empty;
    }
    return Status::success();
  }

  int64_t allocated_bytes() const override {
    int64_t n = devTableBytes_ + devHypersBytes_;
    for (const DeviceArena &a : arenas_)
      n += a.capacity;
    return n;
  }

  Status launch(const LaunchRequest &r, const std::vector<int64_t> &table,
                uint64_t tableGeneration, const HyperTable &hypers) override {
    CUfunction fn = bundle_->function(r.kernel);
    if (!fn)
      return Status::error(Code::Unsupported,
                           m_->name + " has no " +
                               abi::kernel_kind_name(r.kernel) +
                               " kernel loaded (no accumulator in its spec)");
    const int64_t blk = block();
    const int64_t grd = grid(r.group_end - r.group_begin, r.kernel);
    // The kernels take group_begin/end and the grid-stride index in 32 bits.
    if (r.group_end + grd * blk > std::numeric_limits<int32_t>::max())
      return Status::error(
          Code::Unsupported,
          "step: " + std::to_string(r.group_end) +
              " groups are more than one launch of this kernel "
              "can index (2^31 - 1 minus one grid stride)");
    CudaContext::Scope scope(*ctx_);
    if (!scope.ok())
      return scope.status();
    Status s;
    if (!tableUploaded_ || uploadedTable_ != tableGeneration) {
      if (!(s = uploadTo(&devTable_, &devTableBytes_, table.data(),
                         int64_t(table.size() * sizeof(int64_t)),
                         "tensor table")))
        return s;
      tableUploaded_ = true;
      uploadedTable_ = tableGeneration;
      ++tableUploads_;
    }
    const std::vector<float> &hv = hypers.values();
    if (!hypersUploaded_ || uploadedHypers_ != hypers.generation()) {
      if (!(s = uploadTo(&devHypers_, &devHypersBytes_, hv.data(),
                         int64_t(hv.size() * sizeof(float)), "hyper table")))
        return s;
      hypersUploaded_ = true;
      uploadedHypers_ = hypers.generation();
      ++hyperUploads_;
    }
    CUdeviceptr records = 0;
    if (r.use_compacted) {
      if (!(s = uploadTo(&devSubTable_, &devSubTableBytes_, r.compacted->data(),
                         int64_t(r.compacted->size() * sizeof(int64_t)),
                         "partial tensor table")))
        return s;
      records = devSubTable_;
    } else {
      records = devTable_ + CUdeviceptr(r.first_record * m_->record_words *
                                        int64_t(sizeof(int64_t)));
    }
    int64_t args[6] = {int64_t(records), r.num_records, int64_t(devHypers_),
                       r.step,           r.group_begin, r.group_end};
    void *params[6] = {&args[0], &args[1], &args[2],
                       &args[3], &args[4], &args[5]};
    return d_->check(
        d_->cuLaunchKernel(fn, unsigned(grd), 1, 1, unsigned(blk), 1, 1, 0,
                           stream_, params, nullptr),
        std::string(abi::kernel_kind_name(r.kernel)) + ": cuLaunchKernel(" +
            bundle_->choice().symbol + abi::kernel_kind_suffix(r.kernel) +
            ", grid " + std::to_string(grd) + ")");
  }

  Expected<bool> all_finite(const std::vector<ScanRange> &, DType) override {
    return Status::error(Code::Unsupported,
                         "scanning gradients for NaN/Inf is not supported on "
                         "CUDA yet (it needs a device-side scan)");
  }

  Expected<std::vector<double>> sum_squares(const std::vector<ScanRange> &,
                                            DType) override {
    return Status::error(Code::Unsupported,
                         "gradient norms are not computed on CUDA yet (it "
                         "needs a device-side reduction)");
  }

  Status synchronize() override {
    CudaContext::Scope scope(*ctx_);
    if (!scope.ok())
      return scope.status();
    return d_->check(d_->cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }

  Status read(const void *address, void *dst, int64_t bytes) override {
    CudaContext::Scope scope(*ctx_);
    if (!scope.ok())
      return scope.status();
    Status s =
        d_->check(d_->cuMemcpyDtoHAsync(dst, CUdeviceptr(uintptr_t(address)),
                                        size_t(bytes), stream_),
                  "read: cuMemcpyDtoHAsync");
    if (s)
      s = d_->check(d_->cuStreamSynchronize(stream_),
                    "read: cuStreamSynchronize");
    return s;
  }

  Status write(void *address, const void *src, int64_t bytes) override {
    Status s = synchronize();
    if (s)
      s = ctx_->upload(CUdeviceptr(uintptr_t(address)), src, bytes);
    return s;
  }

  Expected<std::shared_ptr<void>> allocate_scratch(int64_t bytes) override {
    Expected<DeviceBuffer> b =
        DeviceBuffer::allocate(ctx_, std::max<int64_t>(1, bytes));
    if (!b)
      return b.status();
    auto held = std::make_shared<DeviceBuffer>(std::move(b.value()));
    {
      CudaContext::Scope scope(*ctx_);
      if (!scope.ok())
        return scope.status();
      if (Status s = d_->check(d_->cuMemsetD8(held->ptr(), 0,
                                              size_t(held->bytes())),
                               "scratch: cuMemsetD8");
          !s)
        return s;
    }
    return std::shared_ptr<void>(
        held, reinterpret_cast<void *>(uintptr_t(held->ptr())));
  }

private:
  /// Frees device memory once the stream is done with it.
  void freeAfterStream(CUdeviceptr p) {
    if (!p)
      return;
    d_->cuStreamSynchronize(stream_);
    d_->cuMemFree(p);
  }

  /// Copies `bytes` of `src` to the device buffer *dst (grown to fit), on
  /// the stream (context pushed).
  Status uploadTo(CUdeviceptr *dst, int64_t *capacity, const void *src,
                  int64_t bytes, const char *what) {
    if (bytes > *capacity) {
      CUdeviceptr p = 0;
      Status s = d_->check(d_->cuMemAlloc(&p, size_t(bytes)),
                           std::string("allocating the ") + what);
      if (!s)
        return s;
      freeAfterStream(*dst);
      *dst = p;
      *capacity = bytes;
    }
    if (bytes == 0)
      return Status::success();
    // Pageable source: the driver stages it before returning, so the host
    // copy may change afterwards; ordered on the stream after earlier steps.
    return d_->check(d_->cuMemcpyHtoDAsync(*dst, src, size_t(bytes), stream_),
                     std::string("uploading the ") + what);
  }

  std::shared_ptr<CudaBundle> bundle_;
  CudaOptimizerOptions opts_;
  std::shared_ptr<CudaContext> ctx_;
  const CudaDriver *d_;
  const Manifest *m_;
  CUstream stream_;
  int blocksPerSm_;
  int64_t maxRecord_;
  std::vector<DeviceArena> arenas_;
  CUdeviceptr devTable_ = 0, devHypers_ = 0, devSubTable_ = 0;
  int64_t devTableBytes_ = 0, devHypersBytes_ = 0, devSubTableBytes_ = 0;
  bool tableUploaded_ = false, hypersUploaded_ = false;
  uint64_t uploadedTable_ = 0, uploadedHypers_ = 0;
  int64_t tableUploads_ = 0, hyperUploads_ = 0;
};

CudaOptimizer::CudaOptimizer(std::unique_ptr<CudaBackend> backend)
    : Optimizer(std::move(backend)),
      cuda_(static_cast<CudaBackend *>(&this->backend())) {}

CudaOptimizer::~CudaOptimizer() = default;

Expected<std::unique_ptr<CudaOptimizer>>
CudaOptimizer::create(std::shared_ptr<CudaBundle> bundle,
                      const CudaOptimizerOptions &opts) {
  if (!bundle)
    return Status::error(Code::InvalidArgument,
                         "CudaOptimizer::create: null bundle");
  return create_over<CudaOptimizer, CudaBackend>("CudaOptimizer::create",
                                                 std::move(bundle), opts);
}

Expected<std::unique_ptr<CudaOptimizer>>
CudaOptimizer::create(std::shared_ptr<CudaContext> ctx, const std::string &dir,
                      const CudaOptimizerOptions &opts) {
  Expected<std::shared_ptr<CudaBundle>> b =
      CudaBundle::load(std::move(ctx), dir);
  if (!b)
    return b.status();
  return create(std::move(b.value()), opts);
}

Expected<std::unique_ptr<Optimizer>> CudaOptimizer::create_sibling() const {
  Expected<std::unique_ptr<CudaOptimizer>> o =
      create(cuda_->sharedBundle(), cuda_->options());
  if (!o)
    return o.status();
  return std::unique_ptr<Optimizer>(std::move(o.value()));
}

const CudaBundle &CudaOptimizer::bundle() const { return cuda_->bundle(); }

Expected<int64_t> CudaOptimizer::add_param(int slot, CUdeviceptr param,
                                           int64_t numel, CUdeviceptr grad) {
  return Optimizer::add_param(slot, reinterpret_cast<void *>(uintptr_t(param)),
                              numel, reinterpret_cast<void *>(uintptr_t(grad)));
}

Status CudaOptimizer::set_grad(int64_t tensor, CUdeviceptr grad) {
  return Optimizer::set_grad(tensor, reinterpret_cast<void *>(uintptr_t(grad)));
}

Status CudaOptimizer::set_param(int64_t tensor, CUdeviceptr param) {
  return Optimizer::set_param(tensor,
                              reinterpret_cast<void *>(uintptr_t(param)));
}

LaunchConfig CudaOptimizer::launch_config() const {
  LaunchConfig lc;
  lc.block = cuda_->block();
  lc.total_groups = total_groups();
  lc.grid = cuda_->grid(total_groups());
  lc.records = num_records();
  return lc;
}

int64_t CudaOptimizer::table_uploads() const { return cuda_->tableUploads(); }
int64_t CudaOptimizer::hyper_uploads() const { return cuda_->hyperUploads(); }

} // namespace flashopt::host
