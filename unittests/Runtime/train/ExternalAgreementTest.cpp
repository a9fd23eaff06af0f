//===- ExternalAgreementTest.cpp - Externally reduced steps ---------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// train::Stepper's externally reduced data parallelism
/// (runtime/src/train/ExternalAgreement.cpp) without a framework: W ranks
/// are threads of this process, each with its own optimizer over its own
/// shards of the same tensors (cut at quantization-group boundaries, as the
/// PyTorch binding cuts FSDP2's), agreeing through a communicator whose
/// all_gather is an in-process barrier. The shards step as one process
/// steps the whole tensors, bit for bit; an error, a found_inf, a NaN under
/// the skip policy or a disagreement on one rank acts on every rank alike.
///
//===----------------------------------------------------------------------===//

#include "dist/Communicator.h"
#include "train/Stepper.h"
#include "RuntimeTestSupport.h"

#include <doctest/doctest.h>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

using namespace flashopt;
using flashopt::testing::noEnv;
using train::NonFinitePolicy;
using train::Stepper;
using host::Expected;

namespace {

/// W ranks in one process: all_gather is a two-phase barrier.
class ThreadWorld {
public:
  explicit ThreadWorld(int W) : W_(W), slots_(size_t(W)) {
    for (int r = 0; r < W; ++r)
      refs_.push_back({this, r});
  }

  std::shared_ptr<dist::Communicator> comm(int rank) {
    flashopt_comm_backend b{};
    b.abi_version = FLASHOPT_ABI_VERSION;
    b.name = "threads";
    b.rank = rank;
    b.size = W_;
    b.self = &refs_[size_t(rank)];
    b.all_gather = [](void *self, const void *send, void *recv,
                      size_t bytes) {
      auto *ref = static_cast<Ref *>(self);
      return ref->world->allGather(ref->rank, send, recv, bytes);
    };
    b.all_to_all = [](void *, const void *, void *, size_t) { return 1; };
    b.broadcast = [](void *, void *, size_t, int32_t) { return 1; };
    auto c = dist::Communicator::create(b);
    REQUIRE_MESSAGE(c.ok(), c.error());
    return c.value();
  }

  /// Runs `fn(rank)` on W threads and waits for them.
  void run(const std::function<void(int)> &fn) {
    std::vector<std::thread> ts;
    for (int r = 0; r < W_; ++r)
      ts.emplace_back(fn, r);
    for (std::thread &t : ts)
      t.join();
  }

private:
  struct Ref {
    ThreadWorld *world;
    int rank;
  };

  int allGather(int rank, const void *send, void *recv, size_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !reading_; });
    const auto *s = static_cast<const char *>(send);
    slots_[size_t(rank)].assign(s, s + bytes);
    if (++arrived_ == W_) {
      reading_ = true;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return reading_; });
    }
    for (int r = 0; r < W_; ++r)
      std::memcpy(static_cast<char *>(recv) + size_t(r) * bytes,
                  slots_[size_t(r)].data(), bytes);
    if (++left_ == W_) {
      arrived_ = left_ = 0;
      reading_ = false;
      cv_.notify_all();
    }
    return 0;
  }

  int W_;
  std::vector<std::vector<char>> slots_;
  std::vector<Ref> refs_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0, left_ = 0;
  bool reading_ = false;
};

std::unique_ptr<host::CpuOptimizer> load(const std::string &name) {
  return testing::loadCpu(testing::builtBundle("kernels", name), 1);
}

/// Whole tensors (not multiples of the 32-element group; the last one
/// smaller than W groups, so some ranks hold none of it).
const std::vector<int64_t> kSizes = {1000, 77, 40};
constexpr int kWorld = 3;

struct Whole {
  std::vector<std::vector<float>> p, g;
  explicit Whole(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t n : kSizes) {
      p.emplace_back(size_t(n));
      g.emplace_back(size_t(n));
      for (float &x : p.back())
        x = d(rng);
    }
    gradients(seed + 1);
  }
  void gradients(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.1f);
    for (auto &v : g)
      for (float &x : v)
        x = d(rng);
  }
};

/// Rank r's range of a tensor of n elements: W contiguous ranges cut at
/// group boundaries (as ceil(groups / W) groups each).
std::pair<int64_t, int64_t> shardOf(int64_t n, int r, int W) {
  const int64_t groups = (n + 31) / 32, per = (groups + W - 1) / W;
  const int64_t a = std::min(n, int64_t(r) * per * 32);
  const int64_t c = std::min(n, int64_t(r + 1) * per * 32);
  return {a, c};
}

/// One rank: its shards of every tensor (copies), registered with their
/// element offsets, under a Stepper with externally reduced parallelism.
struct Rank {
  std::unique_ptr<host::CpuOptimizer> opt;
  std::unique_ptr<Stepper> stepper;
  std::vector<std::vector<float>> p, g;
  std::vector<std::pair<int64_t, int64_t>> ranges; ///< [tensor]: [a, c)
  std::vector<int64_t> tensorOf; ///< [registered index]: whole tensor

  Rank(const Whole &w, int r, ThreadWorld &world) : opt(load("adam_f32")) {
    for (size_t t = 0; t < kSizes.size(); ++t) {
      auto [a, c] = shardOf(kSizes[t], r, kWorld);
      ranges.push_back({a, c});
      p.emplace_back(w.p[t].begin() + a, w.p[t].begin() + c);
      g.emplace_back(w.g[t].begin() + a, w.g[t].begin() + c);
    }
    for (size_t t = 0; t < kSizes.size(); ++t) {
      if (p[t].empty())
        continue;
      auto i = opt->add_param(0, p[t].data(), int64_t(p[t].size()),
                              g[t].data());
      REQUIRE_MESSAGE(i.ok(), i.error());
      REQUIRE(opt->set_element_offset(*i, ranges[t].first).ok());
      tensorOf.push_back(int64_t(t));
    }
    stepper = std::make_unique<Stepper>(*opt);
    REQUIRE(stepper->attach_external(world.comm(r)).ok());
  }
  std::vector<int64_t> all() const {
    std::vector<int64_t> v;
    for (size_t i = 0; i < tensorOf.size(); ++i)
      v.push_back(int64_t(i));
    return v;
  }
  /// This rank's gradients from the whole (reduced) ones.
  void take(const Whole &w) {
    for (size_t t = 0; t < kSizes.size(); ++t)
      std::copy(w.g[t].begin() + ranges[t].first,
                w.g[t].begin() + ranges[t].second, g[t].begin());
  }
  bool paramsAre(const Whole &w) const {
    for (size_t t = 0; t < kSizes.size(); ++t)
      if (!p[t].empty() &&
          std::memcmp(p[t].data(), w.p[t].data() + ranges[t].first,
                      p[t].size() * 4) != 0)
        return false;
    return true;
  }
};

/// What each rank's step_external returned.
struct Outcome {
  bool ok = false, stepped = false;
  host::Code code = host::Code::Ok;
  std::string message;
};

std::vector<Outcome>
stepAll(ThreadWorld &world, std::vector<std::unique_ptr<Rank>> &ranks,
        const std::function<Stepper::ExternalStep(int)> &mine) {
  std::vector<Outcome> out(static_cast<size_t>(kWorld));
  world.run([&](int r) {
    Rank &k = *ranks[size_t(r)];
    Expected<bool> s = k.stepper->step_external(k.all(), mine(r));
    Outcome &o = out[size_t(r)];
    o.ok = s.ok();
    if (s.ok())
      o.stepped = *s;
    else {
      o.code = s.status().code();
      o.message = s.status().message();
    }
  });
  return out;
}

/// Every rank steps the three whole tensors (the caller's parameters 0-2).
Stepper::ExternalStep plain(int) {
  Stepper::ExternalStep s;
  s.params = {0, 1, 2};
  return s;
}

} // namespace

TEST_CASE("externally reduced: W = 3 ranks' shards step as one process steps "
          "the whole tensors, bit for bit, and count alike") {
  Whole w(7), ref(7);
  auto one = load("adam_f32");
  for (size_t t = 0; t < kSizes.size(); ++t)
    REQUIRE(one->add_param(0, ref.p[t].data(), kSizes[t], ref.g[t].data())
                .ok());
  Stepper single(*one);
  ThreadWorld world(kWorld);
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < kWorld; ++r)
    ranks.push_back(std::make_unique<Rank>(w, r, world));
  CHECK(ranks[2]->tensorOf.size() == 2); // rank 2 holds none of the last
  for (unsigned s = 1; s <= 4; ++s) {
    w.gradients(100 + s);
    ref.gradients(100 + s);
    for (auto &k : ranks)
      k->take(w);
    REQUIRE(single.step().ok());
    std::vector<Outcome> out = stepAll(world, ranks, plain);
    for (const Outcome &o : out) {
      REQUIRE_MESSAGE(o.ok, o.message);
      CHECK(o.stepped);
    }
    for (auto &k : ranks) {
      CHECK(k->paramsAre(ref));
      CHECK(k->stepper->step_count() == int64_t(s));
      for (int64_t i : k->all())
        CHECK(k->stepper->tensor_step(i) == int64_t(s));
      // Rank 2 holds none of parameter 2, and counts it all the same.
      for (int64_t id : {0, 1, 2})
        CHECK(k->stepper->external_step(id) == int64_t(s));
    }
  }
  // A parameter's own step (gradient release): its counter alone.
  w.gradients(9);
  for (auto &k : ranks)
    k->take(w);
  std::vector<Outcome> out(static_cast<size_t>(kWorld));
  world.run([&](int r) {
    Rank &k = *ranks[size_t(r)];
    Stepper::ExternalStep one;
    one.params = {0};
    Expected<bool> s = k.stepper->step_external({0}, one);
    out[size_t(r)].ok = s.ok() && *s;
  });
  for (int r = 0; r < kWorld; ++r) {
    CHECK(out[size_t(r)].ok);
    CHECK(ranks[size_t(r)]->stepper->external_step(0) == 5);
    CHECK(ranks[size_t(r)]->stepper->external_step(1) == 4);
    CHECK(ranks[size_t(r)]->stepper->tensor_step(0) == 5);
    CHECK(ranks[size_t(r)]->stepper->tensor_step(1) == 4);
    CHECK(ranks[size_t(r)]->stepper->step_count() == 4);
  }
}

TEST_CASE("externally reduced: a found_inf, an error, a missing gradient or a "
          "disagreement on one rank acts on every rank, and changes nothing") {
  Whole w(11);
  ThreadWorld world(kWorld);
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < kWorld; ++r)
    ranks.push_back(std::make_unique<Rank>(w, r, world));
  // One good step first, so that the counters are not all zero.
  for (const Outcome &o : stepAll(world, ranks, plain))
    REQUIRE_MESSAGE(o.ok, o.message);
  std::vector<std::vector<std::vector<float>>> before;
  for (auto &k : ranks)
    before.push_back(k->p);
  auto unchanged = [&] {
    for (int r = 0; r < kWorld; ++r) {
      CHECK(ranks[size_t(r)]->stepper->external_step(0) == 1);
      CHECK(ranks[size_t(r)]->p == before[size_t(r)]);
      CHECK(ranks[size_t(r)]->stepper->step_count() == 1);
      CHECK(ranks[size_t(r)]->stepper->tensor_step(0) == 1);
    }
  };

  SUBCASE("found_inf on rank 1: every rank skips and counts it") {
    std::vector<Outcome> out = stepAll(world, ranks, [](int r) {
      Stepper::ExternalStep s = plain(r);
      s.found_inf = r == 1;
      return s;
    });
    for (int r = 0; r < kWorld; ++r) {
      CHECK(out[size_t(r)].ok);
      CHECK_FALSE(out[size_t(r)].stepped);
      CHECK(ranks[size_t(r)]->stepper->skipped_steps() == 1);
    }
    unchanged();
  }
  SUBCASE("the skip policy and a NaN gradient on rank 2: every rank skips") {
    for (auto &k : ranks)
      REQUIRE(k->stepper->set_nonfinite_policy(NonFinitePolicy::Skip).ok());
    ranks[2]->g[0][3] = std::numeric_limits<float>::quiet_NaN();
    std::vector<Outcome> out = stepAll(world, ranks, plain);
    for (const Outcome &o : out) {
      CHECK(o.ok);
      CHECK_FALSE(o.stepped);
    }
    unchanged();
  }
  SUBCASE("an error on rank 2: every rank fails with its code and message") {
    std::vector<Outcome> out = stepAll(world, ranks, [](int r) {
      Stepper::ExternalStep s = plain(r);
      if (r == 2)
        s.error = host::Status::error(host::Code::InvalidArgument,
                                      "the gradient of p0 is not a DTensor");
      return s;
    });
    for (const Outcome &o : out) {
      CHECK_FALSE(o.ok);
      CHECK(o.code == host::Code::InvalidArgument);
      CHECK(o.message == "rank 2 of 3 cannot step: the gradient of p0 is not "
                         "a DTensor; nothing was stepped on any rank");
    }
    unchanged();
  }
  SUBCASE("a gradient missing on rank 0: State on every rank, naming it") {
    REQUIRE(ranks[0]->opt->set_grad(1, nullptr).ok());
    std::vector<Outcome> out = stepAll(world, ranks, plain);
    for (const Outcome &o : out) {
      CHECK_FALSE(o.ok);
      CHECK(o.code == host::Code::State);
      CHECK(o.message.rfind("rank 0 of 3 cannot step: ", 0) == 0);
      CHECK(o.message.find("no gradient") != std::string::npos);
    }
    unchanged();
  }
  SUBCASE("different parameters or hyper-parameters: Mismatch on every "
          "rank") {
    std::vector<Outcome> out = stepAll(world, ranks, [](int r) {
      Stepper::ExternalStep s;
      s.params = r == 1 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0};
      return s;
    });
    for (const Outcome &o : out) {
      CHECK(o.code == host::Code::Mismatch);
      CHECK(o.message.find("rank 1 differs from rank 0 in which parameters "
                           "step") != std::string::npos);
    }
    REQUIRE(ranks[2]->opt->set_hyper(0, "lr", 0.5f).ok());
    out = stepAll(world, ranks, plain);
    for (const Outcome &o : out) {
      CHECK(o.code == host::Code::Mismatch);
      CHECK(o.message.find("rank 2 differs from rank 0 in the "
                           "hyper-parameters") != std::string::npos);
    }
    unchanged();
  }
  SUBCASE("clipping is refused on every rank") {
    REQUIRE(ranks[1]->stepper->set_max_grad_norm(1.0).ok());
    std::vector<Outcome> out = stepAll(world, ranks, plain);
    for (const Outcome &o : out) {
      CHECK(o.code == host::Code::Unsupported);
      CHECK(o.message.rfind("rank 1 of 3 cannot step: gradient-norm "
                            "clipping",
                            0) == 0);
    }
    unchanged();
  }
}

TEST_CASE("externally reduced: the other step entry points and a second "
          "attach are refused") {
  Whole w(3);
  ThreadWorld world(1);
  auto opt = load("adam_f32");
  REQUIRE(opt->add_param(0, w.p[0].data(), kSizes[0], w.g[0].data()).ok());
  Stepper t(*opt);
  CHECK(t.step_external({0}, {}).status().code() == host::Code::State);
  REQUIRE(t.attach_external(world.comm(0)).ok());
  CHECK(t.external());
  CHECK(t.step().code() == host::Code::State);
  CHECK(t.step_tensor(0).code() == host::Code::State);
  CHECK(t.attach_external(world.comm(0)).code() == host::Code::State);
  Expected<bool> one = t.step_external({0}, {});
  REQUIRE(one.ok());
  CHECK(*one);
}
