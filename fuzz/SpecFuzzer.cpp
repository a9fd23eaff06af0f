//===- SpecFuzzer.cpp - Fuzz target: the spec front end --------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// spec::parseSpecText on arbitrary bytes: a Spec, or at least one
/// diagnostic with a file:line:col location; never a crash, never both
/// silence and failure.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Spec/Spec.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace flashopt::spec;
  std::string_view text(reinterpret_cast<const char *>(data), size);
  std::vector<Diagnostic> diags;
  std::optional<Spec> s = parseSpecText(text, "/fuzz/spec.json", diags);
  if (!s && diags.empty()) {
    std::fprintf(stderr, "rejected without a diagnostic\n");
    std::abort();
  }
  for (const Diagnostic &d : diags)
    if (d.str().rfind("/fuzz/spec.json", 0) != 0) {
      std::fprintf(stderr, "diagnostic without the file: %s\n", d.str().c_str());
      std::abort();
    }
  return 0;
}
