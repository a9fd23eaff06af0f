//===- Comm.cpp - Communicators and data parallelism in the C ABI ---------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_comm handles over an engine's backend table, attaching one to an
/// optimizer and reducing buckets early (train::Stepper over
/// dist/DataParallel.h: layout check, rank 0's state everywhere, gradient
/// buckets).
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "Errors.h"
#include "Handles.h"
#include "Objects.h"

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
      fail(c.status(), std::string(backend->name ? backend->name : "backend") +
                           ": " + c.error());
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
  if (mode != FLASHOPT_REDUCE_DETERMINISTIC && mode != FLASHOPT_REDUCE_FAST)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "unknown reduce mode " + std::to_string(int(mode)));
  std::shared_ptr<flashopt::dist::Communicator> c = getComm(comm);
  Locked o(opt);
  std::vector<flashopt::dist::LayoutEntry> layout;
  for (const ParamRec &p : o->params)
    layout.push_back({p.name, p.numel, p.group});
  o->check(o->stepper->attach(std::move(c), layout,
                              mode == FLASHOPT_REDUCE_DETERMINISTIC,
                              bucket_bytes, sharded));
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

flashopt_status flashopt_optimizer_attach_comm_external(flashopt_optimizer opt,
                                                        flashopt_comm comm) {
  return guard("flashopt_optimizer_attach_comm_external", [&] {
    std::shared_ptr<flashopt::dist::Communicator> c = getComm(comm);
    Locked o(opt);
    o->check(o->stepper->attach_external(std::move(c)));
  });
}

flashopt_status flashopt_num_buckets(flashopt_optimizer opt, int32_t *out) {
  return guard("flashopt_num_buckets", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->dp() ? int32_t(o->dp()->buckets().size()) : 1;
  });
}

flashopt_status flashopt_bucket_params(flashopt_optimizer opt, int32_t bucket,
                                       int64_t *first, int64_t *count) {
  return guard("flashopt_bucket_params", [&] {
    needOut(first, "first");
    needOut(count, "count");
    Locked o(opt);
    if (!o->dp()) {
      if (bucket != 0)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
             "bucket " + std::to_string(bucket) +
                 " does not exist (no communicator: one bucket)");
      *first = 0;
      *count = int64_t(o->params.size());
      return;
    }
    const auto &b = o->dp()->buckets();
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
    o->check(o->stepper->reduce_bucket(bucket));
  });
}

} // extern "C"
