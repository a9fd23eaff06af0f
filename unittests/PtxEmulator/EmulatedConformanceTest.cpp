//===- EmulatedConformanceTest.cpp - Shipped PTX == CPU kernels, emulated -===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Every shipped spec's PTX for sm_80, sm_90 and sm_100, run by the PTX
/// interpreter through the runtime's real CUDA path (CudaOptimizer over the
/// emulating stand-in driver: table and hyper uploads, record splitting,
/// grid size, argument packing), against the runtime's CPU Optimizer on
/// identical inputs: every buffer bit-identical. Plus: a 300-tensor launch,
/// step_tensors, the interpreter's opcode coverage of the shipped PTX, and
/// mutation tests (a broken PTX text must be caught).
///
//===----------------------------------------------------------------------===//

#include "EmulatedGpu.h"

#include "ptx-emulator/PtxEmulator.h"

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace flashopt::emutest;
using namespace flashopt::host;

namespace {

const int kChips[] = {80, 90, 100};

std::string readFile(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string bundleDir(const std::string &spec) {
  return kernelsDir() + "/" + spec;
}

/// The sizes of the issue: tails of every kind around the group (32) and
/// the lane vector, a tensor spanning many grid strides.
const std::vector<int64_t> kSizes = {1, 31, 33, 4097, 65543};

/// Every element bit-identical.
void requireIdentical(const Outcome &o, const std::string &what) {
  INFO(what);
  REQUIRE_MESSAGE(o.ran, o.error);
  CHECK(o.compared_bytes > 0);
  CHECK_MESSAGE(o.mismatches == 0,
                o.mismatches << " elements differ (" << o.nan_payload_only
                             << " of them NaN vs NaN with another payload); "
                                "first: "
                             << o.first);
}

/// A scratch copy of a bundle (its manifest, CPU kernels and PTX; no
/// cubins) whose `chip` PTX is `ptx`.
std::string scratchBundle(const std::string &spec, int chip,
                          const std::string &ptx, const std::string &tag) {
  fs::path dst = fs::temp_directory_path() /
                 ("flashopt-ptx-mutation-" + std::to_string(getpid())) / tag /
                 spec;
  fs::create_directories(dst);
  for (auto &e : fs::directory_iterator(bundleDir(spec))) {
    std::string name = e.path().filename().string();
    if (e.path().extension() == ".cubin")
      continue; // the emulating stand-in refuses cubins anyway
    fs::copy_file(e.path(), dst / name, fs::copy_options::overwrite_existing);
  }
  std::ofstream(dst / (spec + ".sm_" + std::to_string(chip) + ".ptx"),
                std::ios::binary)
      << ptx;
  return dst.string();
}

/// `text` with the `nth` (0-based) match of `re` replaced by `with`
/// (format string); REQUIREs that it matched.
std::string mutate(const std::string &text, const std::string &re,
                   const std::string &with, int nth = 0) {
  std::regex r(re);
  auto it = std::sregex_iterator(text.begin(), text.end(), r);
  for (int i = 0; i < nth && it != std::sregex_iterator(); ++i)
    ++it;
  REQUIRE_MESSAGE(it != std::sregex_iterator(),
                  "the mutation's pattern " << re
                                            << " no longer matches the PTX: "
                                               "update the test");
  const std::smatch &m = *it;
  return text.substr(0, size_t(m.position(0))) + m.format(with) +
         text.substr(size_t(m.position(0) + m.length(0)));
}

} // namespace

TEST_CASE("emulated GPU: every shipped spec has PTX for sm_80, sm_90, sm_100") {
  auto specs = shippedSpecs();
  CHECK(specs.size() >= 26);
  for (const std::string &s : specs)
    for (int chip : kChips) {
      fs::path p = fs::path(bundleDir(s)) / (s + ".sm_" + std::to_string(chip) + ".ptx");
      CHECK_MESSAGE(fs::exists(p), p.string());
    }
}

TEST_CASE("emulated GPU: the interpreter implements every opcode the shipped "
          "PTX uses") {
  std::map<std::string, int> uses; // opcode -> files
  int files = 0;
  for (const std::string &s : shippedSpecs())
    for (int chip : kChips) {
      fs::path p = fs::path(bundleDir(s)) / (s + ".sm_" + std::to_string(chip) + ".ptx");
      std::string text = readFile(p);
      // Independently of the parser: every statement's opcode, by text.
      std::regex op(R"((?:^|[\n;{])\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_]*(?:\.[A-Za-z0-9_]+)*)[\s;])");
      std::set<std::string> here;
      for (auto it = std::sregex_iterator(text.begin(), text.end(), op);
           it != std::sregex_iterator(); ++it)
        here.insert((*it)[1]);
      for (const std::string &o : here)
        ++uses[o];
      std::string err;
      auto m = flashopt::ptxemu::Module::parse(text, &err);
      CHECK_MESSAGE(m != nullptr, p.string() << ": " << err);
      if (m)
        for (const std::string &o : m->opcodes())
          CHECK_MESSAGE(here.count(o), o << " parsed but not seen by text");
      ++files;
    }
  CHECK(files == int(shippedSpecs().size()) * 3);
  std::ostringstream list;
  int missing = 0;
  for (auto &[o, n] : uses) {
    std::string why;
    bool ok = flashopt::ptxemu::implemented(o, &why);
    list << "  " << o << " (" << n << " files)" << (ok ? "" : "  NOT IMPLEMENTED: " + why)
         << "\n";
    missing += !ok;
    CHECK_MESSAGE(ok, o << ": " << why);
  }
  MESSAGE(uses.size() << " distinct opcodes in " << files
                      << " shipped PTX files:\n"
                      << list.str());
  CHECK(missing == 0);
  CHECK(uses.size() > 50);
}

TEST_CASE("emulated GPU: shipped PTX == CPU kernels, bit for bit") {
  for (const std::string &spec : shippedSpecs()) {
    SUBCASE(spec.c_str()) {
      for (int chip : kChips) {
        const std::string what = spec + " sm_" + std::to_string(chip);
        auto t0 = std::chrono::steady_clock::now();
        // Finite data: every bit of every buffer.
        Run run;
        run.sizes = kSizes;
        run.steps = 5;
        run.seed = 7;
        Outcome o = compare(bundleDir(spec), chip, run);
        requireIdentical(o, what);
        CHECK(o.launches == 5);
        // Records capped at 64 groups (the split a tensor over 2^31
        // elements gets), a one-SM device (8 blocks: the 65543 tensor takes
        // 8 grid-stride iterations), NaN/Inf gradients in the 33 and 4097
        // tensors.
        Run nf = run;
        nf.seed = 8;
        nf.maxRecordElements = 64 * 32;
        nf.smCount = 1;
        nf.nonFiniteTensors = {2, 3};
        Outcome p = compare(bundleDir(spec), chip, nf);
        CHECK(p.grid == 8);
        // NaN/Inf gradients too: both back ends store the canonical NaN
        // (docs/NUMERICS.md §5), so every bit agrees.
        requireIdentical(p, what + " (NaN/Inf gradients, split records)");
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - t0)
                      .count();
        MESSAGE(what << ": " << o.compared_bytes + p.compared_bytes
                     << " bytes compared, identical (" << ms << " ms)");
      }
    }
  }
}

namespace {

/// 300 tensors of mixed sizes: a fifth below one group, many around a few
/// groups, some of thousands of elements, a few large.
std::vector<int64_t> mixedSizes(uint64_t seed) {
  std::vector<int64_t> out;
  uint64_t s = seed;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 33;
  };
  for (int i = 0; i < 300; ++i) {
    uint64_t k = next() % 10;
    if (k < 2)
      out.push_back(int64_t(1 + next() % 31)); // sub-group
    else if (k < 6)
      out.push_back(int64_t(32 + next() % 200));
    else if (k < 9)
      out.push_back(int64_t(1 + next() % 3000));
    else
      out.push_back(int64_t(10000 + next() % 20000));
  }
  return out;
}

const char *const kMultiSpecs[] = {"adamw_bf16_m24", "lion_f16_m24",
                                   "sgd_f32"};

} // namespace

TEST_CASE("emulated GPU: one launch over 300 tensors == CPU") {
  for (const char *spec : kMultiSpecs)
    for (int chip : kChips) {
      Run run;
      run.sizes = mixedSizes(uint64_t(chip));
      run.steps = 2;
      run.seed = 11;
      run.nonFiniteTensors = {5, 77, 299};
      Outcome o = compare(bundleDir(spec), chip, run);
      requireIdentical(o, std::string(spec) + " sm_" + std::to_string(chip) +
                              ", 300 tensors");
      CHECK(o.launches == 2); // one launch per step for all 300 tensors
    }
}

TEST_CASE("emulated GPU: step_tensors (a contiguous run and a compacted "
          "subset) == one CPU step") {
  for (int chip : kChips) {
    Run run;
    run.sizes = {33, 1, 4097, 31, 700, 65, 2000};
    run.steps = 3;
    run.seed = 5;
    // {2, 3, 4}: a pointer into the middle of the device table; {0, 1, 5,
    // 6}: a compacted copy with word 1 renumbered.
    run.partialSteps = {{2, 3, 4}, {0, 1, 5, 6}};
    run.maxRecordElements = 64 * 32;
    Outcome o = compare(bundleDir("adamw_bf16_m24"), chip, run);
    requireIdentical(o, "adamw_bf16_m24 sm_" + std::to_string(chip));
    CHECK(o.launches == 6);
  }
}

TEST_CASE("emulated GPU: a broken kernel is caught (mutation tests)") {
  const std::string spec = "adamw_bf16_m24";
  const int chip = 90;
  const std::string ptx =
      readFile(fs::path(bundleDir(spec)) / (spec + ".sm_90.ptx"));
  Run run;
  run.sizes = kSizes;
  run.steps = 2;
  run.seed = 3;

  // The unmodified text, through the same scratch path, passes.
  Outcome control = compare(scratchBundle(spec, chip, ptx, "control"), chip, run);
  requireIdentical(control, "unmutated copy");

  struct Mutation {
    std::string what, pattern, with;
    int nth;
  };
  const Mutation mutations[] = {
      // The butterfly's last step exchanges with the wrong lane (xor 2
      // again instead of 1): group maxima (scales) go wrong.
      {"wrong xor mask in the butterfly",
       R"((shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, )1(, 31, -1;))", "$012$2", 0},
      // The full-vector test of the tail is off by one (first + 7 <=
      // numel; AdamW runs 8 elements per thread): the lane holding 7 valid
      // elements takes the unmasked 8-element path and touches one element
      // past the end.
      {"tail predicate off by one",
       R"((add\.s32\s+%r\d+, %r\d+, )8;(\s+setp\.le\.s32))", "$017;$2", 0},
      // The record search's upper bound is ntensors - 2 (ntensors is
      // param 1, cvt.u32.u64 then - 1): the last record is never found, its
      // tensor never stepped.
      {"dropped record",
       R"((cvt\.u32\.u64\s+(%r\d+), %rd\d+;[\s\S]*?add\.s32\s+%r\d+, \2, )-1;)",
       "$01-2;", 0},
  };
  for (const Mutation &m : mutations) {
    std::string text = mutate(ptx, m.pattern, m.with, m.nth);
    REQUIRE(text != ptx);
    Outcome o = compare(scratchBundle(spec, chip, text, m.what), chip, run);
    INFO(m.what);
    bool caught = !o.ran || o.mismatches > 0;
    CHECK_MESSAGE(caught, "a broken kernel passed the comparison (if the "
                          "shipped PTX changed shape, update the mutation)");
    MESSAGE(m.what << ": caught: "
                   << (o.ran ? std::to_string(o.mismatches) +
                                   " elements differ, first: " + o.first
                             : o.error));
  }
  std::error_code ec;
  fs::remove_all(fs::temp_directory_path() /
                     ("flashopt-ptx-mutation-" + std::to_string(getpid())),
                 ec);
}
