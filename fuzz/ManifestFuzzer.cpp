//===- ManifestFuzzer.cpp - Fuzz target: the manifest reader ---------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// abi::parse_manifest on arbitrary bytes: it must return a manifest or an
/// error naming the origin, never crash; an accepted manifest must survive
/// write -> parse unchanged (the reader and the writer agree).
///
//===----------------------------------------------------------------------===//

#include "flashopt/abi/Manifest.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace flashopt::abi;
  std::string_view text(reinterpret_cast<const char *>(data), size);
  Expected<Manifest> m = parse_manifest(text, "fuzz.json");
  if (!m) {
    if (m.error().rfind("fuzz.json", 0) != 0) {
      std::fprintf(stderr, "error without origin: %s\n", m.error().c_str());
      std::abort();
    }
    return 0;
  }
  std::string written = write_manifest(*m);
  Expected<Manifest> again = parse_manifest(written, "rewritten.json");
  if (!again || write_manifest(*again) != written) {
    std::fprintf(stderr, "write -> parse -> write differs: %s\n",
                 again ? "(text differs)" : again.error().c_str());
    std::abort();
  }
  (void)kernel_abi_description(*m);
  return 0;
}
