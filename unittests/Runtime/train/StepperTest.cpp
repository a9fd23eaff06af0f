//===- StepperTest.cpp - The training step, without C handles -------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// runtime/src/train/Stepper.cpp over CPU optimizers of shipped bundles
/// (<build>/kernels) and of an accumulation bundle
/// (<build>/kernels-accumulate): each step shape against the same kernels
/// driven by hand through host::Optimizer, bit for bit; the counters; the
/// skip policy; clipping and the grad_scale it restores; the codes of what
/// is refused; data parallelism over an in-process engine (one rank, and a
/// second rank that disagrees).
///
//===----------------------------------------------------------------------===//

#include "train/Stepper.h"
#include "RuntimeTestSupport.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace flashopt;
using flashopt::testing::makeBundle;
using flashopt::testing::makeOptimizer;
using flashopt::testing::noEnv;
using train::NonFinitePolicy;
using train::StepKind;
using train::Stepper;

namespace {

std::unique_ptr<host::CpuOptimizer> load(const std::string &dir) {
  return testing::loadCpu(dir, 2);
}
std::string shipped(const std::string &name) {
  return testing::builtBundle("kernels", name);
}
std::string accumulating(const std::string &name) {
  return testing::builtBundle("kernels-accumulate", name);
}

/// Tensors not a multiple of the group size, one smaller than a group.
const std::vector<int64_t> kSizes = {1000, 77, 5};

/// f32 parameters and gradients of kSizes registered with an optimizer.
struct Tensors {
  std::vector<std::vector<float>> p, g;
  explicit Tensors(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t n : kSizes) {
      p.emplace_back(size_t(n));
      g.emplace_back(size_t(n));
      for (float &x : p.back())
        x = d(rng);
      for (float &x : g.back())
        x = 0.1f * d(rng);
    }
  }
  void add(host::Optimizer &opt, bool grads = true) {
    for (size_t i = 0; i < p.size(); ++i) {
      auto r = opt.add_param(0, p[i].data(), int64_t(p[i].size()),
                             grads ? g[i].data() : nullptr);
      REQUIRE_MESSAGE(r.ok(), r.error());
    }
  }
  void newGradients(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.1f);
    for (auto &v : g)
      for (float &x : v)
        x = d(rng);
  }
  bool sameParams(const Tensors &o) const {
    for (size_t i = 0; i < p.size(); ++i)
      if (std::memcmp(p[i].data(), o.p[i].data(), p[i].size() * 4) != 0)
        return false;
    return true;
  }
};

std::vector<int64_t> all() { return {0, 1, 2}; }

void requireOk(const host::Status &s) { REQUIRE_MESSAGE(s.ok(), s.message()); }

float gradScale(host::Optimizer &o, int g = 0) {
  auto v = o.hyper(g, abi::kGradScaleHyper);
  REQUIRE(v.ok());
  return *v;
}

} // namespace

TEST_CASE("stepper: a plain step is the optimizer's step over every tensor "
          "and advances every counter") {
  auto a = load(shipped("adam_f32"));
  auto b = load(shipped("adam_f32"));
  Tensors ta(1), tb(1);
  ta.add(*a);
  tb.add(*b);
  Stepper t(*a);
  CHECK(t.next_step_kind() == StepKind::Plain);
  for (int64_t k = 1; k <= 3; ++k) {
    requireOk(t.step());
    requireOk(b->step_tensors(all(), k));
    CHECK(ta.sameParams(tb));
    CHECK(t.step_count() == k);
    CHECK(a->step_count() == k);
    for (int64_t i : all())
      CHECK(t.tensor_step(i) == k);
  }
}

TEST_CASE("stepper: gradient release steps one tensor, and the next step runs "
          "one kernel call per distinct counter") {
  auto a = load(shipped("adam_f32"));
  auto b = load(shipped("adam_f32"));
  Tensors ta(2), tb(2);
  ta.add(*a);
  tb.add(*b);
  Stepper t(*a);
  requireOk(t.step_tensor(1));
  requireOk(t.step_tensor(1));
  CHECK(t.tensor_step(1) == 2);
  CHECK(t.tensor_step(0) == 0);
  CHECK(t.step_count() == 0);
  // Adam's bias corrections depend on t: tensor 1 steps as its third step.
  requireOk(t.step());
  requireOk(b->step_tensors({1}, 1));
  requireOk(b->step_tensors({1}, 2));
  requireOk(b->step_tensors({0, 2}, 1));
  requireOk(b->step_tensors({1}, 3));
  CHECK(ta.sameParams(tb));
  CHECK(t.tensor_step(0) == 1);
  CHECK(t.tensor_step(1) == 3);
  CHECK(t.step_count() == 1);
}

TEST_CASE("stepper: a missing gradient or an unset hyper-parameter is STATE "
          "and steps nothing") {
  auto a = load(shipped("sgd_f32"));
  Tensors ta(3), before(3);
  ta.add(*a, /*grads=*/false);
  Stepper t(*a, [](int64_t i) { return "parameter #" + std::to_string(i); });
  host::Status s = t.step();
  CHECK(s.code() == host::Code::State);
  CHECK(s.message().find("parameter #0 has no gradient") != std::string::npos);
  CHECK(t.step_tensor(2).code() == host::Code::State);
  CHECK(t.step_count() == 0);
  CHECK(t.tensor_step(2) == 0);
  CHECK(ta.sameParams(before));

  // A hyper-parameter without default (the fake bundle's lr, its default
  // null) that was never set.
  auto m = flashopt::testing::fakeManifest();
  m["hypers"][0]["default"] = nullptr;
  auto f = makeOptimizer({}, makeBundle("stepper_lr_unset", m));
  std::vector<float> p(64, 1.0f), g(64, 0.5f);
  REQUIRE(f->add_param(0, p.data(), 64, g.data()).ok());
  Stepper tf(*f);
  s = tf.step();
  CHECK(s.code() == host::Code::State);
  CHECK(s.message().find("never set") != std::string::npos);
  CHECK(tf.step_count() == 0);
}

TEST_CASE("stepper: the skip policy skips a non-finite step and counts it") {
  auto a = load(shipped("sgd_f32"));
  Tensors ta(4);
  ta.add(*a);
  Stepper t(*a);
  requireOk(t.set_nonfinite_policy(NonFinitePolicy::Skip));
  Tensors before = ta;
  ta.g[1][7] = std::numeric_limits<float>::infinity();
  requireOk(t.step());
  requireOk(t.step_tensor(1));
  CHECK(t.skipped_steps() == 2);
  CHECK(t.step_count() == 0);
  CHECK(t.tensor_step(1) == 0);
  CHECK(ta.sameParams(before));
  // A finite gradient steps again; under PROPAGATE the Inf reaches the
  // weights.
  ta.g[1][7] = 0.0f;
  requireOk(t.step());
  CHECK(t.step_count() == 1);
  CHECK(!ta.sameParams(before));
  requireOk(t.set_nonfinite_policy(NonFinitePolicy::Propagate));
  ta.g[1][7] = std::numeric_limits<float>::quiet_NaN();
  requireOk(t.step());
  CHECK(std::isnan(ta.p[1][7]));
  CHECK(t.skipped_steps() == 2);
}

TEST_CASE("stepper: clipping folds max_norm / norm into grad_scale for one "
          "step and puts the caller's grad_scale back") {
  auto a = load(shipped("sgd_f32"));
  auto b = load(shipped("sgd_f32"));
  Tensors ta(5), tb(5);
  ta.add(*a);
  tb.add(*b);
  requireOk(a->set_hyper(0, abi::kGradScaleHyper, 0.5f));
  requireOk(b->set_hyper(0, abi::kGradScaleHyper, 0.5f));
  Stepper t(*a);
  CHECK(t.last_grad_norm() == -1.0);
  requireOk(t.set_max_grad_norm(0.25));
  requireOk(t.step());
  // The norm of the scaled gradients, in double.
  double ss = 0.0;
  for (const auto &v : ta.g)
    for (float x : v)
      ss += double(x) * double(x);
  const double norm = std::sqrt(ss) * 0.5;
  CHECK(t.last_grad_norm() == doctest::Approx(norm).epsilon(1e-12));
  REQUIRE(norm > 0.25);
  requireOk(b->set_hyper(0, abi::kGradScaleHyper,
                         0.5f * float(0.25 / (t.last_grad_norm() + 1e-6))));
  requireOk(b->step_tensors(all(), 1));
  CHECK(ta.sameParams(tb));
  CHECK(gradScale(*a) == 0.5f);
  // Below the maximum nothing is scaled, but the norm is recorded.
  requireOk(t.set_max_grad_norm(1e6));
  requireOk(b->set_hyper(0, abi::kGradScaleHyper, 0.5f));
  requireOk(t.step());
  requireOk(b->step_tensors(all(), 2));
  CHECK(ta.sameParams(tb));
  CHECK(t.last_grad_norm() == doctest::Approx(norm).epsilon(1e-12));
  // Clipping needs every gradient: no gradient release.
  CHECK(t.step_tensor(0).code() == host::Code::State);
  requireOk(t.set_max_grad_norm(0.0));
  CHECK(t.last_grad_norm() == -1.0);
}

TEST_CASE("stepper: setters refuse what they cannot take, changing nothing") {
  auto a = load(shipped("sgd_f32"));
  Stepper t(*a);
  for (double bad :
       {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    CHECK(t.set_max_grad_norm(bad).code() == host::Code::InvalidArgument);
    CHECK(t.set_accumulation_normalizer(bad).code() ==
          host::Code::InvalidArgument);
  }
  CHECK(t.max_grad_norm() == 0.0);
  CHECK(t.accumulation_normalizer() == 0.0);
  // A bundle without an accumulator.
  Tensors ta(6);
  ta.add(*a);
  host::Status s = t.accumulate(all());
  CHECK(s.code() == host::Code::Unsupported);
  CHECK(s.message().find("no gradient accumulator") != std::string::npos);
  CHECK(!t.accumulation_pending());
}

TEST_CASE("stepper: an accumulation ends in the fused step, or with a "
          "decision to take in the accumulated one, the same bits") {
  const std::string dir = accumulating("sgd_f32_acc_f32");
  auto a = load(dir), c = load(dir), b = load(dir);
  Tensors ta(7), tc(7), tb(7);
  ta.add(*a);
  tc.add(*c);
  tb.add(*b);
  Stepper t(*a), tskip(*c);
  requireOk(tskip.set_nonfinite_policy(NonFinitePolicy::Skip));
  for (unsigned k = 0; k < 2; ++k) {
    for (Tensors *x : {&ta, &tc, &tb})
      x->newGradients(10 + k);
    requireOk(t.accumulate(all()));
    requireOk(tskip.accumulate(all()));
    requireOk(b->accumulate_tensors(all()));
  }
  CHECK(t.accumulated(1) == 2);
  CHECK(t.accumulation_pending());
  CHECK(t.next_step_kind() == StepKind::Fused);
  CHECK(tskip.next_step_kind() == StepKind::Accumulated);
  for (Tensors *x : {&ta, &tc, &tb})
    x->newGradients(20);
  requireOk(t.step());
  requireOk(tskip.step());
  // By hand: the third micro-batch joins the accumulator, 1/3 through
  // grad_scale, the accumulated step.
  requireOk(b->accumulate_tensors(all()));
  requireOk(b->set_hyper(0, abi::kGradScaleHyper, float(1.0 / 3.0)));
  requireOk(b->step_tensors(all(), 1, abi::KernelKind::StepAccumulated));
  CHECK(ta.sameParams(tb));
  CHECK(tc.sameParams(tb));
  for (Stepper *x : {&t, &tskip}) {
    CHECK(x->step_count() == 1);
    CHECK(x->accumulated(0) == 0);
    CHECK(!x->accumulation_pending());
  }
  CHECK(gradScale(*a) == 1.0f);
  CHECK(gradScale(*c) == 1.0f);

  // The normalizer replaces N.
  requireOk(t.set_accumulation_normalizer(4.0));
  requireOk(t.accumulate(all()));
  requireOk(t.step());
  requireOk(b->accumulate_tensors(all()));
  requireOk(b->accumulate_tensors(all()));
  requireOk(b->set_hyper(0, abi::kGradScaleHyper, 0.25f));
  requireOk(b->step_tensors(all(), 2, abi::KernelKind::StepAccumulated));
  CHECK(ta.sameParams(tb));

  // A non-finite accumulation is dropped: the accumulators are zeroed.
  tc.g[0][3] = std::numeric_limits<float>::quiet_NaN();
  requireOk(tskip.accumulate(all()));
  tc.g[0][3] = 0.0f;
  Tensors before = tc;
  requireOk(tskip.step());
  CHECK(tskip.skipped_steps() == 1);
  CHECK(tskip.step_count() == 1);
  CHECK(!tskip.accumulation_pending());
  CHECK(tc.sameParams(before));
  std::vector<float> acc(5, 1.0f);
  requireOk(c->read_accumulator(2, 0, 5, acc.data()));
  CHECK(acc == std::vector<float>(5, 0.0f));
}

TEST_CASE("stepper: micro-batches must be the same for every tensor, and "
          "keep gradient release out") {
  auto a = load(accumulating("sgd_f32_acc_f32"));
  Tensors ta(8), before(8);
  ta.add(*a);
  Stepper t(*a);
  requireOk(t.accumulate({0, 2}));
  CHECK(t.accumulated(0) == 1);
  CHECK(t.accumulated(1) == 0);
  host::Status s = t.step();
  CHECK(s.code() == host::Code::State);
  CHECK(s.message().find("tensor 1 has 0 accumulated micro-batches") !=
        std::string::npos);
  CHECK(t.step_tensor(1).code() == host::Code::State);
  CHECK(t.step_count() == 0);
  CHECK(ta.sameParams(before));
  CHECK(t.reduce_bucket(0).code() == host::Code::State); // no communicator
}

TEST_CASE("stepper: restore sets what a checkpoint holds") {
  auto a = load(shipped("adam_f32"));
  auto b = load(shipped("adam_f32"));
  Tensors ta(9), tb(9);
  ta.add(*a);
  tb.add(*b);
  Stepper t(*a);
  t.restore({4, 2, 7}, 5, 3);
  CHECK(t.step_count() == 5);
  CHECK(a->step_count() == 5);
  CHECK(t.skipped_steps() == 3);
  CHECK(t.tensor_step(2) == 7);
  requireOk(t.step());
  for (auto [i, k] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {1, 3}, {2, 8}})
    requireOk(b->step_tensors({i}, k));
  CHECK(ta.sameParams(tb));
  CHECK(t.step_count() == 6);
}

//===----------------------------------------------------------------------===//
// Data parallelism over an in-process engine
//===----------------------------------------------------------------------===//

namespace {

/// Rank 0 of `size` ranks whose other ranks are copies of this one: a
/// collective sees every rank send what this one sends. With `tamper`, the
/// first byte rank 1 sends in an all-gather differs.
struct EchoEngine {
  int size = 1;
  bool tamper = false;

  static int allGather(void *self, const void *send, void *recv, size_t n) {
    auto *e = static_cast<EchoEngine *>(self);
    for (int r = 0; r < e->size; ++r)
      std::memcpy(static_cast<char *>(recv) + size_t(r) * n, send, n);
    if (e->tamper && e->size > 1 && n > 0)
      static_cast<char *>(recv)[n] ^= 1;
    return 0;
  }
  static int allToAll(void *self, const void *send, void *recv, size_t n) {
    auto *e = static_cast<EchoEngine *>(self);
    // Every rank's block for rank 0 is this rank's own block 0.
    for (int r = 0; r < e->size; ++r)
      std::memcpy(static_cast<char *>(recv) + size_t(r) * n, send, n);
    return 0;
  }
  static int broadcast(void *, void *, size_t, int32_t) { return 0; }

  std::shared_ptr<dist::Communicator> communicator() {
    flashopt_comm_backend b{};
    b.abi_version = FLASHOPT_ABI_VERSION;
    b.name = "echo";
    b.rank = 0;
    b.size = size;
    b.self = this;
    b.all_gather = allGather;
    b.all_to_all = allToAll;
    b.broadcast = broadcast;
    auto c = dist::Communicator::create(b);
    REQUIRE_MESSAGE(c.ok(), c.error());
    return c.value();
  }
};

std::vector<dist::LayoutEntry> layoutOf(const Tensors &t) {
  std::vector<dist::LayoutEntry> out;
  for (size_t i = 0; i < t.p.size(); ++i)
    out.push_back({"w" + std::to_string(i), int64_t(t.p[i].size()), 0});
  return out;
}

} // namespace

TEST_CASE("stepper: data parallelism over one rank steps as without it") {
  for (bool sharded : {false, true}) {
    CAPTURE(sharded);
    auto a = load(shipped("adam_f32"));
    auto b = load(shipped("adam_f32"));
    Tensors ta(11), tb(11);
    ta.add(*a);
    tb.add(*b);
    Stepper t(*a);
    EchoEngine engine;
    requireOk(
        t.attach(engine.communicator(), layoutOf(ta), true, 1024, sharded));
    REQUIRE(t.data_parallel() != nullptr);
    CHECK(t.data_parallel()->sharded() == sharded);
    CHECK(t.data_parallel()->buckets().size() > 1);
    host::Status again =
        t.attach(engine.communicator(), layoutOf(ta), true, 1024, sharded);
    CHECK(again.code() == host::Code::State);
    CHECK(t.step_tensor(0).code() == host::Code::State);
    CHECK(t.reduce_bucket(99).code() == host::Code::InvalidArgument);
    requireOk(t.reduce_bucket(0));
    host::Status twice = t.reduce_bucket(0);
    CHECK(twice.code() == host::Code::State);
    CHECK(twice.message().find("already reduced") != std::string::npos);
    for (int64_t k = 1; k <= 2; ++k) {
      requireOk(t.step());
      requireOk(b->step_tensors(all(), k));
      CHECK(ta.sameParams(tb));
    }
    CHECK(t.step_count() == 2);
  }
}

TEST_CASE("stepper: ranks that disagree are a MISMATCH before anything "
          "changes") {
  auto a = load(shipped("sgd_f32"));
  Tensors ta(12), before(12);
  ta.add(*a);
  Stepper t(*a);
  EchoEngine engine;
  engine.size = 2;
  requireOk(t.attach(engine.communicator(), layoutOf(ta), true, 0, false));
  engine.tamper = true;
  host::Status s = t.step();
  CHECK(s.code() == host::Code::Mismatch);
  CHECK(s.message().find("the ranks disagree before this step: rank 1") !=
        std::string::npos);
  CHECK(t.step_count() == 0);
  CHECK(ta.sameParams(before));

  // A layout that differs from rank 0's is a MISMATCH at attach, named
  // "rank 0 of 2: ...".
  auto c = load(shipped("sgd_f32"));
  Tensors tc(12);
  tc.add(*c);
  Stepper tc2(*c);
  host::Status at =
      tc2.attach(engine.communicator(), layoutOf(tc), true, 0, false);
  CHECK(at.code() == host::Code::Mismatch);
  CHECK(at.message().rfind("rank 0 of 2: the ranks registered different "
                           "layouts",
                           0) == 0);
  CHECK(tc2.data_parallel() == nullptr);
}

TEST_CASE("stepper: an index out of range is INVALID_ARGUMENT") {
  auto a = load(shipped("sgd_f32"));
  Tensors ta(13);
  ta.add(*a);
  Stepper t(*a);
  CHECK(t.step_tensor(3).code() == host::Code::InvalidArgument);
  CHECK(t.step_tensor(-1).code() == host::Code::InvalidArgument);
  auto b = load(accumulating("sgd_f32_acc_f32"));
  Tensors tb(13);
  tb.add(*b);
  Stepper tt(*b);
  host::Status s = tt.accumulate({0, 7});
  CHECK(s.code() == host::Code::InvalidArgument);
  CHECK(s.message() == "tensor 7 does not exist (there are 3)");
  CHECK(!tt.accumulation_pending());
}
