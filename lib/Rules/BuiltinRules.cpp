//===- BuiltinRules.cpp - The built-in update rules -------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/Rules/BuiltinRules.h"

namespace {
struct Rule {
  const char *name;
  const char *text;
};
const Rule kRules[] = {
#include "BuiltinRules.inc"
};
} // namespace

std::optional<std::string_view> flashopt::getBuiltinRule(std::string_view name) {
  for (const Rule &r : kRules)
    if (name == r.name)
      return std::string_view(r.text);
  return std::nullopt;
}

std::vector<std::string_view> flashopt::listBuiltinRules() {
  std::vector<std::string_view> names;
  for (const Rule &r : kRules)
    names.push_back(r.name);
  return names;
}
