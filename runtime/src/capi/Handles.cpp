//===- Handles.cpp - Handles as never-reused ids --------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The registry of live contexts and optimizers.
///
//===----------------------------------------------------------------------===//

#include "Handles.h"

#include <algorithm>
#include <sstream>

namespace flashopt::capi {

Registry &registry() {
  static Registry *r = new Registry(); // never destroyed: safe at exit
  return *r;
}

namespace {

uint64_t idOf(const void *h) {
  return uint64_t(reinterpret_cast<uintptr_t>(h));
}

std::string handleText(const void *h) {
  std::ostringstream os;
  os << "0x" << std::hex << idOf(h);
  return os.str();
}

/// The live object behind handle `h` in `map` ("context"/"optimizer" in
/// messages); with `take`, it also leaves the registry (destroy).
template <typename T>
std::shared_ptr<T>
findHandle(std::unordered_map<uint64_t, std::shared_ptr<T>> &map, const void *h,
           const char *kind, bool take) {
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = map.find(idOf(h));
  if (!h || it == map.end())
    fail(FLASHOPT_ERROR_INVALID_HANDLE,
         std::string(kind) + " handle " + handleText(h) + " is not a live " +
             kind + " (destroyed, or never created)");
  std::shared_ptr<T> obj = it->second;
  if (take)
    map.erase(it);
  return obj;
}

} // namespace

std::shared_ptr<ContextObj> getContext(flashopt_context h, bool take) {
  return findHandle(registry().contexts, h, "context", take);
}

std::shared_ptr<OptObj> getOptimizer(flashopt_optimizer h, bool take) {
  return findHandle(registry().optimizers, h, "optimizer", take);
}

std::shared_ptr<dist::Communicator> getComm(flashopt_comm h, bool take) {
  return findHandle(registry().comms, h, "communicator", take);
}

flashopt_comm registerComm(std::shared_ptr<dist::Communicator> c) {
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t id = r.next++;
  r.comms.emplace(id, std::move(c));
  return reinterpret_cast<flashopt_comm>(uintptr_t(id));
}

flashopt_context registerContext(std::shared_ptr<ContextObj> c) {
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t id = r.next++;
  r.contexts.emplace(id, std::move(c));
  return reinterpret_cast<flashopt_context>(uintptr_t(id));
}

flashopt_optimizer registerOptimizer(const std::shared_ptr<ContextObj> &ctx,
                                     std::shared_ptr<OptObj> o) {
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    ctx->opts.erase(std::remove_if(ctx->opts.begin(), ctx->opts.end(),
                                   [](const std::weak_ptr<OptObj> &w) {
                                     return w.expired();
                                   }),
                    ctx->opts.end());
    ctx->opts.push_back(o);
  }
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t id = r.next++;
  r.optimizers.emplace(id, std::move(o));
  return reinterpret_cast<flashopt_optimizer>(uintptr_t(id));
}

} // namespace flashopt::capi
