//===- Handles.h - Handles as never-reused ids ------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Handles are ids (never reused) looked up in a global registry under a
/// mutex; a destroyed or unknown handle is FLASHOPT_ERROR_INVALID_HANDLE,
/// never dereferenced. Each optimizer call holds the optimizer's mutex
/// (Locked).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_HANDLES_H
#define FLASHOPT_CAPI_HANDLES_H

#include "Objects.h"

#include <memory>
#include <mutex>
#include <unordered_map>

namespace flashopt::capi {

struct Registry {
  std::mutex mu;
  uint64_t next = 1;
  std::unordered_map<uint64_t, std::shared_ptr<ContextObj>> contexts;
  std::unordered_map<uint64_t, std::shared_ptr<OptObj>> optimizers;
  std::unordered_map<uint64_t, std::shared_ptr<dist::Communicator>> comms;
};

/// The process-wide registry (never destroyed: safe at exit).
Registry &registry();

/// The live context behind `h`; with `take`, it also leaves the registry.
std::shared_ptr<ContextObj> getContext(flashopt_context h, bool take = false);
/// The live optimizer behind `h`; with `take`, it also leaves the registry.
std::shared_ptr<OptObj> getOptimizer(flashopt_optimizer h, bool take = false);

/// The live communicator behind `h`; with `take`, it also leaves the
/// registry.
std::shared_ptr<dist::Communicator> getComm(flashopt_comm h, bool take = false);
/// Registers a communicator; returns its handle.
flashopt_comm registerComm(std::shared_ptr<dist::Communicator> c);

/// Registers a context; returns its handle.
flashopt_context registerContext(std::shared_ptr<ContextObj> c);
/// Registers an optimizer of context `ctx`; returns its handle.
flashopt_optimizer registerOptimizer(const std::shared_ptr<ContextObj> &ctx,
                                     std::shared_ptr<OptObj> o);

/// Looks up an optimizer and holds its mutex for the call.
struct Locked {
  std::shared_ptr<OptObj> obj;
  std::unique_lock<std::mutex> lock;
  explicit Locked(flashopt_optimizer h) : obj(getOptimizer(h)), lock(obj->mu) {}
  OptObj *operator->() const { return obj.get(); }
  OptObj &operator*() const { return *obj; }
};

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_HANDLES_H
