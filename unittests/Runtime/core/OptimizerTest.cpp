//===- OptimizerTest.cpp - The optimizer core ----------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// runtime/src/core/ (Optimizer.cpp, Tables.cpp) over the CPU backend: the
/// tensor table word for word (docs/KERNEL-ABI.md), state slices, stepping
/// against a scalar reference, param groups and hyper tables, the bytes
/// report, re-pointed gradients and argument checks.
///
//===----------------------------------------------------------------------===//

#include "RuntimeTestSupport.h"

#include <algorithm>
#include <cmath>

using namespace flashopt::testing;

TEST_CASE("the tensor table follows the kernel ABI word for word") {
  auto opt = makeOptimizer();
  const Manifest &m = opt->manifest();
  const std::vector<int64_t> sizes = {1, 31, 33, 1000, 4097, 65543};
  std::vector<std::vector<float>> params, grads;
  for (int64_t n : sizes) {
    params.emplace_back(size_t(n), 1.0f);
    grads.emplace_back(size_t(n), 0.5f);
  }
  int slot1 = opt->add_param_group();
  CHECK(slot1 == 1);
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto idx = opt->add_param(int(i % 2), params[i].data(), sizes[i],
                              grads[i].data());
    REQUIRE_MESSAGE(idx.ok(), idx.error());
    CHECK(*idx == int64_t(i));
  }
  const std::vector<int64_t> &t = opt->table();
  const int64_t R = m.record_words;
  REQUIRE(int64_t(t.size()) == R * int64_t(sizes.size()));
  int64_t expectFirst = 0;
  uintptr_t stateBase = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t *rec = t.data() + i * size_t(R);
    INFO("tensor " << i << " numel " << sizes[i]);
    CHECK(rec[0] == sizes[i]);
    CHECK(rec[1] == expectFirst); // ordered by word 1 and contiguous
    CHECK(rec[2] == int64_t(i % 2));
    CHECK(rec[3] == 0);
    CHECK(rec[4] == int64_t(reinterpret_cast<intptr_t>(params[i].data())));
    CHECK(rec[5] == int64_t(reinterpret_cast<intptr_t>(grads[i].data())));
    // State slice: 64-byte aligned and at a 64-element boundary of its arena.
    uintptr_t state = uintptr_t(rec[6]);
    CHECK(state % 64 == 0);
    if (i == 0)
      stateBase = state;
    CHECK((state - stateBase) % (64 * sizeof(float)) == 0);
    // Zero-initialized.
    const float *s = reinterpret_cast<const float *>(state);
    bool zero = true;
    for (int64_t k = 0; k < sizes[i]; ++k)
      zero = zero && s[k] == 0.0f && !std::signbit(s[k]);
    CHECK(zero);
    const TensorInfo &ti = opt->tensor(int64_t(i));
    CHECK(ti.first_group == expectFirst);
    CHECK(ti.num_groups == (sizes[i] + 31) / 32);
    expectFirst += (sizes[i] + 31) / 32;
  }
  CHECK(opt->total_groups() == expectFirst);
  CHECK(opt->total_numel() == 1 + 31 + 33 + 1000 + 4097 + 65543);
  // The state accessor agrees with the table.
  auto v = opt->buffer(3, "momentum_buffer");
  REQUIRE(v.ok());
  CHECK(reinterpret_cast<intptr_t>(v->data) == t[3 * size_t(R) + 6]);
  CHECK(v->count == 1000);
  CHECK(v->bytes == 4000);
  CHECK(v->runtime_owned);
  auto pv = opt->buffer(3, "param");
  REQUIRE(pv.ok());
  CHECK(pv->data == params[3].data());
  CHECK_FALSE(pv->runtime_owned);
  auto bad = opt->buffer(3, "exp_avg");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("momentum_buffer") != std::string::npos);
}

TEST_CASE("per-group buffers get their own 64-entry aligned, zeroed slices") {
  std::string dir = makeBundle("adamw_like_layout", adamwLikeManifest());
  auto opt = makeOptimizer({}, dir);
  const std::vector<int64_t> sizes = {1, 31, 33, 1000, 4097, 65543};
  std::vector<std::vector<uint16_t>> params, grads;
  for (int64_t n : sizes) {
    params.emplace_back(size_t(n), uint16_t(0x3F80));
    grads.emplace_back(size_t(n), uint16_t(0));
    REQUIRE(opt->add_param(0, params.back().data(), n, grads.back().data()).ok());
  }
  const int64_t R = opt->manifest().record_words;
  CHECK(R == 11);
  for (const char *name : {"correction", "exp_avg.codes", "exp_avg.scales",
                           "exp_avg_sq.codes", "exp_avg_sq.scales"}) {
    int b = opt->manifest().buffer_index(name);
    REQUIRE(b >= 0);
    int width = dtype_bits(opt->manifest().buffers[size_t(b)].dtype) / 8;
    uintptr_t base = uintptr_t(opt->table()[size_t(4 + b)]);
    int64_t prevEnd = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      INFO(name << " tensor " << i);
      uintptr_t a = uintptr_t(opt->table()[i * size_t(R) + size_t(4 + b)]);
      CHECK(a % 64 == 0);
      CHECK((a - base) % uintptr_t(64 * width) == 0);
      int64_t entry = int64_t(a - base) / width;
      CHECK(entry >= prevEnd); // slices never overlap
      auto v = opt->buffer(int64_t(i), name);
      REQUIRE(v.ok());
      prevEnd = entry + v->count;
      std::vector<uint8_t> zeros(size_t(v->bytes), 0);
      CHECK(sameBits(v->data, zeros.data(), size_t(v->bytes)));
      CHECK(v->count == (std::string(name).find(".scales") != std::string::npos
                             ? (sizes[i] + 31) / 32
                             : sizes[i]));
    }
  }
}

TEST_CASE("step runs the kernel: results match a scalar reference") {
  auto opt = makeOptimizer();
  std::mt19937 rng(7);
  const std::vector<int64_t> sizes = {1, 31, 33, 1000};
  std::vector<std::vector<float>> p, g, refP, refM;
  for (int64_t n : sizes) {
    p.push_back(randomVector(rng, size_t(n)));
    g.push_back(randomVector(rng, size_t(n)));
    refP.push_back(p.back());
    refM.emplace_back(size_t(n), 0.0f);
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    REQUIRE(opt->add_param(0, p[i].data(), sizes[i], g[i].data()).ok());
  REQUIRE(opt->set_hyper(0, "lr", 0.05f).ok());
  CHECK(opt->step_count() == 0);
  for (int s = 1; s <= 4; ++s) {
    REQUIRE(opt->step().ok());
    CHECK(opt->step_count() == s);
    for (size_t i = 0; i < sizes.size(); ++i)
      referenceStep(refP[i], refM[i], g[i], 0.05f, 0.9f);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("tensor " << i);
    CHECK(sameBits(p[i].data(), refP[i].data(), p[i].size() * 4));
    auto m = opt->buffer(int64_t(i), "momentum_buffer");
    REQUIRE(m.ok());
    CHECK(sameBits(m->data, refM[i].data(), refM[i].size() * 4));
  }
}

TEST_CASE("param groups are hyper slots with their own values") {
  auto opt = makeOptimizer();
  CHECK(opt->num_param_groups() == 1);
  int s1 = opt->add_param_group();
  int s2 = opt->add_param_group();
  CHECK(s1 == 1);
  CHECK(s2 == 2);
  REQUIRE(opt->set_hyper(1, "lr", 0.5f).ok());
  REQUIRE(opt->set_hyper(2, "momentum", 0.0f).ok());
  const std::vector<float> &h = opt->hyper_table(); // slot-major, H = 2
  REQUIRE(h.size() == 6);
  CHECK(h[0] == 0.01f);
  CHECK(h[1] == 0.9f);
  CHECK(h[2] == 0.5f);
  CHECK(h[3] == 0.9f);
  CHECK(h[4] == 0.01f);
  CHECK(h[5] == 0.0f);
  CHECK(*opt->hyper(1, "lr") == 0.5f);

  std::vector<float> p0(40, 1.0f), p1(40, 1.0f), p2(40, 1.0f), g(40, 1.0f);
  REQUIRE(opt->add_param(0, p0.data(), 40, g.data()).ok());
  REQUIRE(opt->add_param(1, p1.data(), 40, g.data()).ok());
  REQUIRE(opt->add_param(2, p2.data(), 40, g.data()).ok());
  REQUIRE(opt->step().ok());
  REQUIRE(opt->step().ok());
  // m1 = 1, m2 = m1 * momentum + 1; p = 1 - lr * (m1 + m2).
  CHECK(p0[39] == doctest::Approx(1.0 - 0.01 * (1 + 1.9)));
  CHECK(p1[39] == doctest::Approx(1.0 - 0.5 * (1 + 1.9)));
  CHECK(p2[39] == doctest::Approx(1.0 - 0.01 * 2));
  // An LR schedule: one number in the table changes, the next step sees it.
  REQUIRE(opt->set_hyper_all("lr", 0.0f).ok());
  float before = p1[0];
  REQUIRE(opt->step().ok());
  CHECK(p1[0] == before);
}

TEST_CASE("set_hyper rejects unknown names, bad groups and bad values") {
  auto opt = makeOptimizer();
  Status s = opt->set_hyper(0, "learning_rate", 0.1f);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("unknown hyper-parameter \"learning_rate\"") !=
        std::string::npos);
  CHECK(s.message().find("lr, momentum") != std::string::npos);
  s = opt->set_hyper(1, "lr", 0.1f);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("param group 1 does not exist") != std::string::npos);
  CHECK_FALSE(opt->set_hyper(-1, "lr", 0.1f).ok());
  CHECK_FALSE(opt->set_hyper(0, "lr", std::nanf("")).ok());
  CHECK_FALSE(opt->set_hyper(0, "lr", INFINITY).ok());
  CHECK_FALSE(opt->set_hyper_all("beta1", 0.1f).ok());
  CHECK_FALSE(opt->hyper(0, "beta1").ok());
  CHECK(*opt->hyper(0, "lr") == 0.01f); // unchanged by the failures
}

TEST_CASE("hypers without default and elided states are enforced") {
  json m = fakeManifest();
  m["hypers"][0]["default"] = nullptr; // lr must be given
  auto opt = makeOptimizer({}, makeBundle("no_default", m));
  std::vector<float> p(8, 1.0f), g(8, 1.0f);
  REQUIRE(opt->add_param(0, p.data(), 8, g.data()).ok());
  Status s = opt->step();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("\"lr\" has no default") != std::string::npos);
  CHECK(opt->step_count() == 0);
  REQUIRE(opt->set_hyper(0, "lr", 0.1f).ok());
  CHECK(opt->step().ok());

  // A bundle whose momentum buffer is elided: momentum must stay 0.
  json e = fakeManifest();
  e["hypers"][1]["default"] = 0.0;
  e["states"][0]["encoding"] = {{"kind", "elided"}};
  e["states"][0]["elidable_if_zero"] = "momentum";
  e["buffers"].erase(2);
  e["table"]["record_words"] = 6;
  e["bytes_per_param"]["states"] = 0;
  e["bytes_per_param"]["total"] = 8;
  e["bytes_per_param"]["total_with_grad_release"] = 4;
  auto opt2 = makeOptimizer({}, makeBundle("elided", e));
  CHECK(opt2->set_hyper(0, "momentum", 0.0f).ok());
  s = opt2->set_hyper(0, "momentum", 0.9f);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("elided") != std::string::npos);
}

TEST_CASE("bytes report: exact sizes by category, per-param as the manifest") {
  auto opt = makeOptimizer();
  std::vector<float> p(1000), g(1000);
  REQUIRE(opt->add_param(0, p.data(), 1000, g.data()).ok());
  BytesReport r = opt->bytes();
  CHECK(r.numel == 1000);
  CHECK(r.param == 4000);
  CHECK(r.correction == 0);
  CHECK(r.grad == 4000);
  CHECK(r.states == 4000);
  CHECK(r.total == 12000);
  CHECK(r.total_with_grad_release == 8000);
  CHECK(r.runtime_allocated >= 4000);
  CHECK(r.runtime_allocated % 64 == 0);
  CHECK(r.per_param.total == 12.0);

  // The AdamW-shaped manifest: quantized states with f16 scales.
  auto a = makeOptimizer({}, makeBundle("adamw_like_bytes", adamwLikeManifest()));
  const int64_t n = 1 << 20; // a multiple of G: per-param is exact
  std::vector<uint16_t> bp(static_cast<size_t>(n)), bg(static_cast<size_t>(n));
  REQUIRE(a->add_param(0, bp.data(), n, bg.data()).ok());
  r = a->bytes();
  CHECK(r.param == 2 * n);
  CHECK(r.correction == n);
  CHECK(r.grad == 2 * n);
  CHECK(r.states == 2 * n + 2 * 2 * (n / 32));
  const BytesPerParam &man = a->manifest().bytes_per_param;
  CHECK(r.per_param.param == man.param);
  CHECK(r.per_param.correction == man.correction);
  CHECK(r.per_param.grad == man.grad);
  CHECK(r.per_param.states == man.states);
  CHECK(r.per_param.total == man.total);
  CHECK(r.per_param.total == 7.125);
  CHECK(r.per_param.total_with_grad_release == 5.125);
  // A small odd tensor: partial groups count whole scales.
  std::vector<uint16_t> sp(33), sg(33);
  REQUIRE(a->add_param(0, sp.data(), 33, sg.data()).ok());
  r = a->bytes();
  CHECK(r.states == 2 * (n + 33) + 2 * 2 * (n / 32 + 2));
}

TEST_CASE("4-bit states: packed buffers, 32-byte slices, the pad nibble and "
          "the bytes report") {
  // docs/design/4bit-states.md §1/§6: AdamW bf16 + i8 with i4 e2m1 and ui4
  // e3m1 codes, bf16 scales, G = 32 (a scratch bundle: nothing steps).
  auto a = makeOptimizer({}, makeBundle("adamw_4bit_bytes",
                                        adamw4bitLikeManifest()));
  const int64_t n = 1 << 20; // a multiple of G: per-param is exact
  std::vector<uint16_t> bp(static_cast<size_t>(n)), bg(static_cast<size_t>(n));
  REQUIRE(a->add_param(0, bp.data(), n, bg.data()).ok());
  BytesReport r = a->bytes();
  CHECK(r.param == 2 * n);
  CHECK(r.correction == n);
  CHECK(r.grad == 2 * n);
  CHECK(r.states == 2 * (n / 2) + 2 * 2 * (n / 32));
  CHECK(r.per_param.states == 1.125);
  CHECK(r.per_param.total == 6.125);
  CHECK(r.per_param.total_with_grad_release == 4.125);
  CHECK(r.per_param.total == a->manifest().bytes_per_param.total);
  // Odd tensors: ceil(n / 2) bytes of codes each (the pad nibble's byte).
  const std::vector<int64_t> sizes = {1, 33, 64, 4097};
  std::vector<std::vector<uint16_t>> ps, gs;
  for (int64_t k : sizes) {
    ps.emplace_back(size_t(k), uint16_t(0x3F80));
    gs.emplace_back(size_t(k), uint16_t(0));
    REQUIRE(a->add_param(0, ps.back().data(), k, gs.back().data()).ok());
  }
  r = a->bytes();
  CHECK(r.states == 2 * (n / 2 + 1 + 17 + 32 + 2049) +
                        2 * 2 * (n / 32 + 1 + 2 + 2 + 129));
  REQUIRE(a->allocate().ok());
  const int64_t R = a->manifest().record_words;
  for (const char *name : {"exp_avg.codes", "exp_avg_sq.codes"}) {
    CAPTURE(name);
    const int b = a->manifest().buffer_index(name);
    REQUIRE(b >= 0);
    CHECK(dtype_is_packed(a->manifest().buffers[size_t(b)].dtype));
    const uintptr_t base = uintptr_t(a->table()[size_t(4 + b)]);
    int64_t prevEnd = 0;
    for (size_t i = 0; i <= sizes.size(); ++i) {
      const int64_t numel = i == 0 ? n : sizes[i - 1];
      CAPTURE(numel);
      auto v = a->buffer(int64_t(i), name);
      REQUIRE(v.ok());
      CHECK(v->count == numel);
      CHECK(v->bytes == (numel + 1) / 2);
      // 64-element slices: 32 bytes of nibbles, never overlapping.
      const uintptr_t at = uintptr_t(a->table()[i * size_t(R) + size_t(4 + b)]);
      CHECK(at == uintptr_t(v->data));
      CHECK(at % 32 == 0);
      const int64_t entry = int64_t(at - base) * 2;
      CHECK(entry % 64 == 0);
      CHECK(entry >= prevEnd);
      prevEnd = entry + numel;
      // write_buffer stores the pad nibble of an odd length as 0.
      std::vector<uint8_t> ones(size_t(v->bytes), 0xFF);
      REQUIRE(a->write_buffer(int64_t(i), name, ones.data(), v->bytes).ok());
      auto back = a->read_buffer(int64_t(i), name);
      REQUIRE(back.ok());
      REQUIRE(back->size() == size_t(v->bytes));
      CHECK(std::count(back->begin(), back->end() - 1, uint8_t(0xFF)) ==
            int64_t(back->size()) - 1);
      CHECK(back->back() == (numel % 2 ? 0x0F : 0xFF));
      CHECK_FALSE(a->write_buffer(int64_t(i), name, ones.data(), v->bytes + 1)
                      .ok());
    }
  }
  CHECK(a->bytes().runtime_allocated >= a->bytes().states + a->bytes().correction);
}

TEST_CASE("grads are re-pointed between steps and errors leave t unchanged") {
  auto opt = makeOptimizer();
  std::vector<float> p(64, 0.0f), g1(64, 1.0f), g2(64, -1.0f);
  auto idx = opt->add_param(0, p.data(), 64, nullptr);
  REQUIRE(idx.ok());
  Status s = opt->step();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("tensor 0 (numel 64) has no gradient") !=
        std::string::npos);
  CHECK(opt->step_count() == 0);
  REQUIRE(opt->set_grad(*idx, g1.data()).ok());
  CHECK(opt->table()[5] == int64_t(reinterpret_cast<intptr_t>(g1.data())));
  REQUIRE(opt->step().ok()); // m = 1, p = -0.01
  REQUIRE(opt->set_grad(*idx, g2.data()).ok());
  REQUIRE(opt->step().ok()); // m = 0.9 - 1 = -0.1, p = -0.01 + 0.001
  CHECK(p[0] == doctest::Approx(-0.009));
  CHECK(opt->step_count() == 2);
  CHECK_FALSE(opt->set_grad(5, g1.data()).ok());
  // set_param re-points the parameter storage too.
  std::vector<float> q(64, 3.0f);
  REQUIRE(opt->set_param(*idx, q.data()).ok());
  REQUIRE(opt->step().ok());
  CHECK(q[0] != 3.0f);
  opt->set_step_count(100);
  REQUIRE(opt->step().ok());
  CHECK(opt->step_count() == 101);
}

TEST_CASE("add_param validates, and arena growth keeps earlier states") {
  auto opt = makeOptimizer();
  std::vector<float> p(100, 1.0f), g(100, 1.0f);
  CHECK_FALSE(opt->add_param(1, p.data(), 100, g.data()).ok());
  CHECK_FALSE(opt->add_param(0, nullptr, 100, g.data()).ok());
  auto zero = opt->add_param(0, p.data(), 0, g.data());
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.error().find("numel must be > 0") != std::string::npos);
  CHECK(opt->num_tensors() == 0);

  REQUIRE(opt->add_param(0, p.data(), 100, g.data()).ok());
  REQUIRE(opt->step().ok());
  std::vector<float> m0;
  {
    auto v = opt->buffer(0, "momentum_buffer");
    REQUIRE(v.ok());
    const float *d = static_cast<const float *>(v->data);
    m0.assign(d, d + 100);
  }
  // Registering big tensors later grows the arena (it moves); the earlier
  // tensor's state is kept and the new one starts at zero.
  std::vector<std::vector<float>> more;
  for (int i = 0; i < 5; ++i) {
    more.emplace_back(size_t(100000), 2.0f);
    REQUIRE(opt->add_param(0, more.back().data(), 100000, g.data()).ok());
  }
  auto v = opt->buffer(0, "momentum_buffer");
  REQUIRE(v.ok());
  CHECK(sameBits(v->data, m0.data(), 400));
  CHECK(opt->table()[6] == int64_t(reinterpret_cast<intptr_t>(v->data)));
  auto w = opt->buffer(5, "momentum_buffer");
  REQUIRE(w.ok());
  std::vector<float> zeros(100000, 0.0f);
  CHECK(sameBits(w->data, zeros.data(), 400000));
  // g is only 100 long: give the big tensors their own gradients.
  std::vector<float> bigG(100000, 0.0f);
  for (int64_t i = 1; i <= 5; ++i)
    REQUIRE(opt->set_grad(i, bigG.data()).ok());
  REQUIRE(opt->step().ok());
  CHECK(more[4][0] == 2.0f);
}

TEST_CASE("envelope hyper-parameters keep the running extremes of theirs") {
  // Adam's bound reads the betas' extremes over the steps taken
  // (docs/NUMERICS.md §8.4): columns the table keeps itself.
  Manifest m;
  m.name = "envelopes";
  m.hypers = {{"beta1", 0.9, "", ""},
              {"beta1_max", std::nullopt, "max", "beta1"},
              {"beta1_min", std::nullopt, "min", "beta1"}};
  HyperTable t(m);
  REQUIRE(t.add_slot() == 0);
  REQUIRE(t.add_slot() == 1);
  // No value before the first step, and none is needed.
  CHECK_FALSE(t.given(0, 1));
  CHECK(t.check_complete().ok());
  // They cannot be set.
  Status s = t.set(0, "beta1_max", 0.5f);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == Code::InvalidArgument);
  CHECK(s.message().find("running max of \"beta1\"") != std::string::npos);
  CHECK(s.message().find("set \"beta1\"") != std::string::npos);
  // The first step takes the value itself, later ones the extremes.
  t.note_step();
  CHECK(*t.get(0, "beta1_max") == 0.9f);
  CHECK(*t.get(0, "beta1_min") == 0.9f);
  REQUIRE(t.set(0, "beta1", 0.85f).ok());
  uint64_t g = t.generation();
  t.note_step();
  CHECK(t.generation() != g); // the device copy is stale
  CHECK(*t.get(0, "beta1_max") == 0.9f);
  CHECK(*t.get(0, "beta1_min") == 0.85f);
  REQUIRE(t.set(0, "beta1", 0.95f).ok());
  t.note_step();
  CHECK(*t.get(0, "beta1_max") == 0.95f);
  CHECK(*t.get(0, "beta1_min") == 0.85f);
  // Another slot keeps its own.
  CHECK(*t.get(1, "beta1_max") == 0.9f);
  CHECK(*t.get(1, "beta1_min") == 0.9f);
  // An unchanged step changes nothing.
  g = t.generation();
  t.note_step();
  CHECK(t.generation() == g);
  // A checkpoint restores them, or their absence before the first step.
  REQUIRE(t.restore(1, "beta1_max", 0.99f).ok());
  CHECK(*t.get(1, "beta1_max") == 0.99f);
  REQUIRE(t.restore(1, "beta1_min", std::nullopt).ok());
  CHECK_FALSE(t.given(1, 2));
  t.note_step();
  CHECK(*t.get(1, "beta1_min") == 0.9f);
  CHECK(*t.get(1, "beta1_max") == 0.99f);
  // A plain hyper-parameter always has a value.
  CHECK_FALSE(t.restore(0, "beta1", std::nullopt).ok());
}
