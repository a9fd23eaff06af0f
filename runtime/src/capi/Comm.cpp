//===- Comm.cpp - Communicators and data parallelism in the C ABI
//----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_comm handles over an engine's backend table, and attaching one
/// to an optimizer (dist/DataParallel.h: layout check, rank 0's state
/// everywhere, gradient buckets).
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "Errors.h"
#include "Handles.h"
#include "Objects.h"
#include "Stepping.h"

using namespace flashopt::capi;

extern "C" {

flashopt_status flashopt_comm_create(const flashopt_comm_backend *backend,
                                     flashopt_comm *out) {
  return guard("flashopt_comm_create", [&] {
    needOut(out, "out");
    needOut(backend, "backend");
    Expected<std::shared_ptr<flashopt::dist::Communicator>> c =
        flashopt::dist::Communicator::create(*backend);
    if (!c)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           std::string(backend->name ? backend->name : "backend") + ": " +
               c.error());
    *out = registerComm(std::move(c.value()));
  });
}

flashopt_status flashopt_comm_destroy(flashopt_comm comm) {
  return guard("flashopt_comm_destroy", [&] {
    // Released here (and the engine's destroy run) once no optimizer holds
    // it any more.
    std::shared_ptr<flashopt::dist::Communicator> c =
        getComm(comm, /*take=*/true);
  });
}

flashopt_status flashopt_comm_get_rank(flashopt_comm comm, int32_t *rank,
                                       int32_t *size) {
  return guard("flashopt_comm_get_rank", [&] {
    std::shared_ptr<flashopt::dist::Communicator> c = getComm(comm);
    if (rank)
      *rank = c->rank();
    if (size)
      *size = c->size();
  });
}

namespace {
void attach(flashopt_optimizer opt, flashopt_comm comm,
            flashopt_reduce_mode mode, size_t bucket_bytes, bool sharded) {
  {
    if (mode != FLASHOPT_REDUCE_DETERMINISTIC && mode != FLASHOPT_REDUCE_FAST)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "unknown reduce mode " + std::to_string(int(mode)));
    std::shared_ptr<flashopt::dist::Communicator> c = getComm(comm);
    Locked o(opt);
    if (o->dp)
      fail(FLASHOPT_ERROR_STATE, "a communicator is already attached");
    std::vector<flashopt::dist::LayoutEntry> layout;
    for (const ParamRec &p : o->params)
      layout.push_back({p.name, p.numel, p.group});
    flashopt::dist::OwnerFactory owner;
    if (sharded && o->isGpu()) {
      // The shards' optimizer: the same bundle (not owned: the full
      // optimizer outlives it) on the same context and stream defaults;
      // its gradients are device staging (Backend::allocate_scratch).
      auto *full = static_cast<flashopt::host::CudaOptimizer *>(o->opt.get());
      owner = [full]() -> Expected<std::unique_ptr<flashopt::host::Optimizer>> {
        std::shared_ptr<flashopt::host::CudaBundle> b(
            std::shared_ptr<void>(),
            const_cast<flashopt::host::CudaBundle *>(&full->bundle()));
        Expected<std::unique_ptr<flashopt::host::CudaOptimizer>> x =
            flashopt::host::CudaOptimizer::create(b);
        if (!x)
          return x.status();
        return std::unique_ptr<flashopt::host::Optimizer>(
            std::move(x.value()));
      };
    } else if (sharded) {
      // The shards' optimizer: the same bundle (not owned: the full
      // optimizer outlives it), the same threads.
      CpuOptimizer *cpu = o->cpu;
      int threads = cpu->threads();
      owner = [cpu, threads]()
          -> Expected<std::unique_ptr<flashopt::host::Optimizer>> {
        std::shared_ptr<Bundle> b(std::shared_ptr<void>(),
                                  const_cast<Bundle *>(&cpu->bundle()));
        OptimizerOptions opts;
        opts.threads = threads;
        Expected<std::unique_ptr<CpuOptimizer>> x =
            CpuOptimizer::create(b, opts);
        if (!x)
          return x.status();
        return std::unique_ptr<flashopt::host::Optimizer>(
            std::move(x.value()));
      };
    }
    Expected<std::unique_ptr<flashopt::dist::DataParallel>> dp =
        flashopt::dist::DataParallel::attach(
            c, *o->opt, layout, mode == FLASHOPT_REDUCE_DETERMINISTIC,
            bucket_bytes, owner);
    if (!dp) {
      const std::string &e = dp.error();
      fail(e.find("different layouts") != std::string::npos
               ? FLASHOPT_ERROR_MISMATCH
           : e.find("reduce_scatter_f32") != std::string::npos
               ? FLASHOPT_ERROR_UNSUPPORTED
               : FLASHOPT_ERROR_COMM,
           "rank " + std::to_string(c->rank()) + " of " +
               std::to_string(c->size()) + ": " + e);
    }
    o->dp = std::move(dp.value());
  }
}
} // namespace

flashopt_status flashopt_optimizer_attach_comm(flashopt_optimizer opt,
                                               flashopt_comm comm,
                                               flashopt_reduce_mode mode,
                                               size_t bucket_bytes) {
  return guard("flashopt_optimizer_attach_comm", [&] {
    attach(opt, comm, mode, bucket_bytes, /*sharded=*/false);
  });
}

flashopt_status flashopt_optimizer_attach_comm_sharded(
    flashopt_optimizer opt, flashopt_comm comm, flashopt_reduce_mode mode,
    size_t bucket_bytes) {
  return guard("flashopt_optimizer_attach_comm_sharded", [&] {
    attach(opt, comm, mode, bucket_bytes, /*sharded=*/true);
  });
}

flashopt_status flashopt_num_buckets(flashopt_optimizer opt, int32_t *out) {
  return guard("flashopt_num_buckets", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->dp ? int32_t(o->dp->buckets().size()) : 1;
  });
}

flashopt_status flashopt_bucket_params(flashopt_optimizer opt, int32_t bucket,
                                       int64_t *first, int64_t *count) {
  return guard("flashopt_bucket_params", [&] {
    needOut(first, "first");
    needOut(count, "count");
    Locked o(opt);
    if (!o->dp) {
      if (bucket != 0)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
             "bucket " + std::to_string(bucket) +
                 " does not exist (no communicator: one bucket)");
      *first = 0;
      *count = int64_t(o->params.size());
      return;
    }
    const auto &b = o->dp->buckets();
    if (bucket < 0 || bucket >= int32_t(b.size()))
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT, "bucket " + std::to_string(bucket) +
                                                " does not exist (there are " +
                                                std::to_string(b.size()) + ")");
    *first = b[size_t(bucket)].first;
    *count = b[size_t(bucket)].count;
  });
}

flashopt_status flashopt_reduce_bucket(flashopt_optimizer opt, int32_t bucket) {
  return guard("flashopt_reduce_bucket", [&] {
    Locked o(opt);
    if (!o->dp)
      fail(FLASHOPT_ERROR_STATE, "no communicator is attached");
    const auto &b = o->dp->buckets();
    if (bucket < 0 || bucket >= int32_t(b.size()))
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT, "bucket " + std::to_string(bucket) +
                                                " does not exist (there are " +
                                                std::to_string(b.size()) + ")");
    if (accumulationPending(*o))
      fail(FLASHOPT_ERROR_STATE,
           "bucket " + std::to_string(bucket) +
               ": micro-batches are accumulated, so flashopt_step reduces "
               "the accumulators (the last micro-batch included) in every "
               "bucket; flashopt_reduce_bucket reduces gradients of a step "
               "without accumulation");
    for (int64_t i = b[size_t(bucket)].first;
         i < b[size_t(bucket)].first + b[size_t(bucket)].count; ++i)
      if (!o->opt->tensor(i).grad)
        fail(FLASHOPT_ERROR_STATE, o->describe(i) + " has no gradient");
    o->dp->set_full_grads(o->maxGradNorm > 0.0);
    Status s = o->dp->reduce_bucket(*o->opt, bucket);
    if (!s)
      fail(s.message().find("already reduced") != std::string::npos
               ? FLASHOPT_ERROR_STATE
               : FLASHOPT_ERROR_COMM,
           s.message());
  });
}

} // extern "C"
