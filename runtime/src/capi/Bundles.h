//===- Bundles.h - Optimizers from bundles ----------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// See Bundles.cpp.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_BUNDLES_H
#define FLASHOPT_CAPI_BUNDLES_H

#include "Objects.h"

namespace flashopt::capi {

/// The buffers of `m` a binding sees: the library-owned ones (correction
/// term and states; not the parameter, the gradient or an accumulator), in
/// the manifest's order.
std::vector<const flashopt::abi::BufferSpec *> ownedBuffers(const Manifest &m);

/// Fails for a bundle directory that did not load: NOT_FOUND when it or its
/// manifest.json is missing, else with `s` (its status and message).
[[noreturn]] void bundleFailure(const std::string &dir, const Status &s);

/// The optimizer of context `ctx` over the bundle directory `dir`; fails
/// with NOT_FOUND or the status of what failed (FORMAT, IO, UNSUPPORTED,
/// CUDA, OUT_OF_MEMORY, ...), saying why.
std::shared_ptr<OptObj> createOptimizer(const std::shared_ptr<ContextObj> &ctx,
                                        const std::string &dir);

/// The same for an embedded bundle, unpacked into a temporary directory
/// (removed again once the kernels are loaded).
std::shared_ptr<OptObj>
createEmbeddedOptimizer(const std::shared_ptr<ContextObj> &ctx,
                        const flashopt_embedded_bundle *bundle);

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_BUNDLES_H
