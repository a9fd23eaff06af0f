//===- BuiltinRules.h - The built-in update rules ---------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The five built-in optimizers (sgd, sgdw, adam, adamw, lion) as dialect
/// text, embedded from lib/Rules/*.mlir at build time.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_RULES_BUILTINRULES_H
#define FLASHOPT_RULES_BUILTINRULES_H

#include <optional>
#include <string_view>
#include <vector>

namespace flashopt {

/// The dialect text of the built-in rule `name`, if there is one.
std::optional<std::string_view> getBuiltinRule(std::string_view name);

/// The names of all built-in rules, in a stable order.
std::vector<std::string_view> listBuiltinRules();

} // namespace flashopt

#endif // FLASHOPT_RULES_BUILTINRULES_H
