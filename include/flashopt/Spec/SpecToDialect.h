//===- SpecToDialect.h - Spec files → flashopt.optimizer --------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Applies a parsed spec (docs/SPEC.md) to its rule: the built-in rule text
/// or the spec's rule file is parsed, and the spec's name, master-weight
/// encoding, gradient dtype, state encodings and hyper-parameter defaults
/// are set on the rule's `flashopt.optimizer`. Mistakes that need the rule
/// to be seen (an unknown state or hyper-parameter, eliding a state that is
/// not elidable, mixed group sizes) are reported at the spec's file:line:col.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_SPEC_SPECTODIALECT_H
#define FLASHOPT_SPEC_SPECTODIALECT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashopt::spec {

/// A spec applied to its rule.
struct LoadedSpec {
  /// A module holding exactly one configured flashopt.optimizer.
  mlir::OwningOpRef<mlir::ModuleOp> module;
  /// "fnv1a64:<16 hex digits>" over the spec text and the rule text.
  std::string specHash;
  /// The built-in rule name, or "file:<path>" for a user rule.
  std::string rule;
  std::string description;
  /// The spec's targets ("cpu", "sm_80", ...).
  std::vector<std::string> targets;
};

/// Parses the spec at `path` and applies it to its rule. Diagnostics
/// (file:line:col: error: ...) go to `errs`; returns nullopt on any error.
std::optional<LoadedSpec> loadSpecAsOptimizer(mlir::MLIRContext &ctx,
                                              const std::string &path,
                                              llvm::raw_ostream &errs);

} // namespace flashopt::spec

#endif // FLASHOPT_SPEC_SPECTODIALECT_H
