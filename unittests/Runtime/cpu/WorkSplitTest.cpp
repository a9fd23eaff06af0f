//===- WorkSplitTest.cpp - CPU work split --------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// runtime/src/cpu/WorkSplit.cpp and the CPU backend's chunking:
/// group- and 64-element-aligned chunk boundaries, results independent of
/// the thread count, small problems on one thread.
///
//===----------------------------------------------------------------------===//

#include "RuntimeTestSupport.h"

#include <cmath>

using namespace flashopt::testing;

TEST_CASE("group-aligned chunking over 1..7 threads matches one thread") {
  const std::vector<int64_t> sizes = {1, 31, 33, 1000, 4097, 65543, 31, 1, 4097};
  auto run = [&](int threads, std::vector<std::vector<float>> &p,
                 std::vector<std::vector<float>> &mOut, int64_t *calls) {
    CpuOptimizerOptions o;
    o.threads = threads;
    o.min_groups_per_chunk = 1; // use every thread even on these sizes
    auto opt = makeOptimizer(o);
    std::mt19937 rng(42);
    std::vector<std::vector<float>> g;
    p.clear();
    for (int64_t n : sizes) {
      p.push_back(randomVector(rng, size_t(n)));
      g.push_back(randomVector(rng, size_t(n)));
    }
    int s1 = opt->add_param_group();
    REQUIRE(opt->set_hyper(s1, "lr", 0.003f).ok());
    REQUIRE(opt->set_hyper(s1, "momentum", 0.5f).ok());
    for (size_t i = 0; i < sizes.size(); ++i)
      REQUIRE(opt->add_param(int(i % 2), p[i].data(), sizes[i], g[i].data()).ok());
    std::vector<Chunk> chunks = opt->plan_chunks();
    // Chunks cover [0, total) in order, each nonempty.
    REQUIRE(!chunks.empty());
    CHECK(chunks.front().begin == 0);
    CHECK(chunks.back().end == opt->total_groups());
    for (size_t c = 0; c + 1 < chunks.size(); ++c)
      CHECK(chunks[c].end == chunks[c + 1].begin);
    CHECK(int(chunks.size()) == threads);
    auto callsFn = reinterpret_cast<CallsFn>(opt->bundle().symbol("fake_sgd_calls"));
    REQUIRE(bool(callsFn));
    int64_t before = callsFn();
    for (int s = 0; s < 3; ++s) {
      REQUIRE(opt->step().ok());
      for (auto &gv : g) // new gradients between steps
        for (float &x : gv)
          x = x * 0.5f + 0.25f;
    }
    *calls = callsFn() - before;
    mOut.clear();
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto v = opt->buffer(int64_t(i), "momentum_buffer");
      REQUIRE(v.ok());
      const float *d = static_cast<const float *>(v->data);
      mOut.emplace_back(d, d + sizes[i]);
    }
  };
  std::vector<std::vector<float>> p1, m1;
  int64_t calls1 = 0;
  run(1, p1, m1, &calls1);
  CHECK(calls1 == 3);
  for (int threads = 2; threads <= 7; ++threads) {
    std::vector<std::vector<float>> pn, mn;
    int64_t calls = 0;
    run(threads, pn, mn, &calls);
    CHECK(calls == 3 * threads);
    for (size_t i = 0; i < sizes.size(); ++i) {
      INFO("threads " << threads << ", tensor " << i << " (numel " << sizes[i]
                      << ")");
      CHECK(sameBits(pn[i].data(), p1[i].data(), p1[i].size() * 4));
      CHECK(sameBits(mn[i].data(), m1[i].data(), m1[i].size() * 4));
    }
  }
}

TEST_CASE("split_groups: boundaries are group- and 64-element aligned") {
  // Tensors of 1, 31, 33, 1000, 4097, 65543 elements with G = 32.
  std::vector<int64_t> first;
  int64_t total = 0;
  for (int64_t n : {1, 31, 33, 1000, 4097, 65543}) {
    first.push_back(total);
    total += (n + 31) / 32;
  }
  for (int n = 1; n <= 16; ++n) {
    auto chunks = split_groups(total, first, n, 1, /*align_groups=*/2);
    INFO(n << " chunks");
    REQUIRE(!chunks.empty());
    CHECK(int(chunks.size()) <= n);
    CHECK(chunks.front().begin == 0);
    CHECK(chunks.back().end == total);
    for (size_t c = 0; c < chunks.size(); ++c) {
      CHECK(chunks[c].end > chunks[c].begin);
      if (c + 1 < chunks.size()) {
        CHECK(chunks[c].end == chunks[c + 1].begin);
        int64_t b = chunks[c].end;
        size_t t = size_t(std::upper_bound(first.begin(), first.end(), b) -
                          first.begin() - 1);
        CHECK((b - first[t]) % 2 == 0); // tensor-local 64-element boundary
      }
    }
  }
  // Small problems use one chunk; the minimum chunk size caps the count.
  CHECK(split_groups(10, {0}, 8, 1024, 1).size() == 1);
  CHECK(split_groups(4096, {0}, 8, 1024, 1).size() == 4);
  CHECK(split_groups(0, {}, 8, 1, 1).empty());
  // More threads than groups: one group per chunk at most.
  CHECK(split_groups(3, {0, 1, 2}, 8, 1, 2).size() == 3);
}

TEST_CASE("default chunking keeps small problems on one thread") {
  CpuOptimizerOptions o;
  o.threads = 4;
  auto opt = makeOptimizer(o);
  CHECK(opt->threads() == 4);
  std::vector<float> p(1000, 1.0f), g(1000, 1.0f);
  REQUIRE(opt->add_param(0, p.data(), 1000, g.data()).ok());
  CHECK(opt->plan_chunks().size() == 1);
  std::vector<float> big(1 << 20, 1.0f), bigG(1 << 20, 0.0f);
  REQUIRE(opt->add_param(0, big.data(), int64_t(big.size()), bigG.data()).ok());
  CHECK(opt->plan_chunks().size() == 4);
  REQUIRE(opt->step().ok());
  CHECK(p[0] == doctest::Approx(1.0f - 0.01f));
  REQUIRE(opt->set_threads(1).ok());
  CHECK(opt->plan_chunks().size() == 1);
  REQUIRE(opt->step().ok());
  CpuOptimizerOptions d; // default: hardware concurrency
  auto opt2 = makeOptimizer(d);
  CHECK(opt2->threads() >= 1);
}
