//===- StateHazardRuns.h - the hazard scenarios on the reference -*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// One tensor stepped by the scalar reference in fp32, FlashOptim's, the
/// bounded 8-bit and the 4-bit numerics, and the hazard scenarios of
/// docs/NUMERICS.md §8 on it (shared/reference/state-hazards.md): the
/// single-element probe, weights whose gradient stops, the outlier channel
/// and absent tokens. StateHazardsTest.cpp (8 bits) and
/// StateHazards4Test.cpp (4 bits) run them.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_UNITTESTS_NUMERICS_STATEHAZARDRUNS_H
#define FLASHOPT_UNITTESTS_NUMERICS_STATEHAZARDRUNS_H

#include "flashopt_reference.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace flashopt::ref::hazards {

/// One tensor of f32 parameters and its states, stepped by the reference.
struct Run {
  Config cfg;
  std::map<std::string, float> hypers;
  int64_t numel;
  std::vector<float> param, grad;
  std::vector<std::vector<uint8_t>> codes;  // per quantized state (packed
                                            // nibbles at 4 bits)
  std::vector<std::vector<uint16_t>> scales; // f16/bf16 bits per group
  std::vector<std::vector<float>> plain;    // per plain state
  int64_t t = 0;
  /// false: the bound of the current betas only (what the bounded numerics
  /// did before the envelopes), to show a test can see the difference.
  bool trackEnvelopes = true;

  /// `bits` 4: the 4-bit codes of docs/NUMERICS.md §2e in place of each
  /// 8-bit one (e2m1 for the softsign m, e3m1 for v), bf16 scales.
  Run(const std::string &rule, bool quantized, bool bounded, int64_t n,
      std::map<std::string, float> h, int bits = 8)
      : hypers(std::move(h)), numel(n), param(size_t(n), 0.0f),
        grad(size_t(n), 0.0f) {
    cfg.rule = rule;
    cfg.param = DType::F32;
    cfg.correction = DType::None;
    cfg.grad = DType::F32;
    cfg.bounded = bounded;
    // The shipped encodings of each numerics (specs/*.json): the bounded
    // numerics' softsign m and minifloat e4m4 v with bf16 scales
    // (docs/NUMERICS.md §8), FlashOptim's softsign and sqrt codes with f16
    // scales.
    std::vector<Compand> companders = {Compand::Softsign};
    if (rule == "adam" || rule == "adamw")
      companders.push_back(bounded ? Compand::E4M4 : Compand::Sqrt);
    int64_t groups = (n + 31) / 32;
    for (Compand c : companders) {
      StateEncoding e;
      e.quantized = quantized;
      e.plain = DType::F32;
      bool isSigned = c == Compand::Softsign || c == Compand::E3M4;
      e.q = QuantEncoding{isSigned, c, bounded ? DType::BF16 : DType::F16, 32};
      if (bits == 4)
        e.q = QuantEncoding{isSigned, isSigned ? Compand::E2M1 : Compand::E3M1,
                            DType::BF16, 32, 4};
      cfg.states.push_back(e);
      codes.emplace_back(size_t(bits == 4 ? (n + 1) / 2 : n), 0);
      scales.emplace_back(size_t(groups), 0);
      plain.emplace_back(size_t(n), 0.0f);
    }
  }

  void step() {
    ++t;
    // Adam's envelopes: the betas' extremes over the steps taken, as the
    // runtime keeps them (HyperTable::note_step).
    if (cfg.rule == "adam" || cfg.rule == "adamw")
      for (const char *b : {"beta1", "beta2"}) {
        auto it = hypers.find(b);
        float v = it != hypers.end() ? it->second
                                     : (std::string(b) == "beta1" ? 0.9f
                                                                  : 0.999f);
        std::string hi = std::string(b) + "_max", lo = std::string(b) + "_min";
        bool first = t == 1 || !trackEnvelopes;
        hypers[hi] = first ? v : std::max(hypers[hi], v);
        hypers[lo] = first ? v : std::min(hypers[lo], v);
      }
    std::vector<void *> bufs = {param.data(), grad.data()};
    for (size_t k = 0; k < cfg.states.size(); ++k) {
      if (cfg.states[k].quantized) {
        bufs.push_back(codes[k].data());
        bufs.push_back(scales[k].data());
      } else {
        bufs.push_back(plain[k].data());
      }
    }
    reference_step(cfg, hypers, t, numel, bufs);
  }

  /// The decoded state k of element i.
  float state(size_t k, int64_t i) const {
    if (!cfg.states[k].quantized)
      return plain[k][size_t(i)];
    const QuantEncoding &q = cfg.states[k].q;
    return dequantize(loadCode(q, codes[k].data(), i),
                      scales[k][size_t(i / 32)], q);
  }
};

/// The numerics a scenario runs in: fp32 states, FlashOptim's 8-bit codes,
/// the bounded 8-bit codes (the shipped default), the bounded 4-bit codes,
/// and 4-bit codes rounded to nearest without Adam's bound (to show where a
/// scenario reaches a 4-bit hazard).
enum class Mode { FlashOptim, Bounded, F32, Bounded4, Nearest4 };
inline const char *name(Mode m) {
  switch (m) {
  case Mode::FlashOptim:
    return "FlashOptim";
  case Mode::Bounded:
    return "bounded";
  case Mode::F32:
    return "fp32";
  case Mode::Bounded4:
    return "bounded 4-bit";
  case Mode::Nearest4:
    return "nearest 4-bit";
  }
  return "?";
}
inline Run make(const std::string &rule, Mode m, int64_t n,
                std::map<std::string, float> h) {
  bool four = m == Mode::Bounded4 || m == Mode::Nearest4;
  return Run(rule, m != Mode::F32, m == Mode::Bounded || m == Mode::Bounded4, n,
             std::move(h), four ? 4 : 8);
}

/// Adam's update bound in units of lr at step t (docs/NUMERICS.md §8).
inline float adamBound(int64_t t, float beta1 = 0.9f, float beta2 = 0.999f) {
  Rule r("adam", {{"lr", 1.0f}, {"beta1", beta1}, {"beta2", beta2}}, t);
  return r.maxUpd;
}

/// The single-element probe (shared/reference/state-hazards.md): elements
/// 1..4095 get N(0,1) gradients every step, element 0 gets `g0` at step 201
/// only. Returns element 0's largest |update| / lr over steps 202..260.
inline double probe(Mode m, float g0) {
  const int64_t n = 4096;
  const float lr = 1e-3f;
  Run r = make("adam", m, n, {{"lr", lr}});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double worst = 0;
  for (int s = 1; s <= 260; ++s) {
    for (int64_t i = 1; i < n; ++i)
      r.grad[size_t(i)] = normal(rng);
    r.grad[0] = s == 201 ? g0 : 0.0f;
    float before = r.param[0];
    r.step();
    if (s >= 202)
      worst = std::max(worst, std::fabs(double(r.param[0]) - before) / lr);
  }
  return worst;
}

/// Weights whose gradient stops: every element gets N(0, 1) gradients for
/// 200 steps, then elements 0, 64, 128, ... (one per two groups, beside 31
/// still active ones) get 0 for `after` steps. Returns each stopped
/// element's cumulative move over those steps.
inline std::vector<double> stoppedMoves(const std::string &rule, Mode m,
                                 std::map<std::string, float> h,
                                 int after = 1000) {
  const int64_t n = 4096;
  Run r = make(rule, m, n, std::move(h));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> start;
  for (int s = 1; s <= 200 + after; ++s) {
    for (int64_t i = 0; i < n; ++i)
      r.grad[size_t(i)] = normal(rng);
    if (s > 200)
      for (int64_t i = 0; i < n; i += 64)
        r.grad[size_t(i)] = 0.0f;
    if (s == 201)
      start = r.param;
    r.step();
  }
  std::vector<double> out;
  for (int64_t i = 0; i < n; i += 64)
    out.push_back(std::fabs(double(r.param[size_t(i)]) - start[size_t(i)]));
  return out;
}

/// The rules whose stopped weights the sticky-code tests follow, with their
/// hyper-parameters and learning rate.
struct StoppedCase {
  std::string rule;
  std::map<std::string, float> h;
  float lr;
};
inline const std::vector<StoppedCase> &stoppedCases() {
  static const std::vector<StoppedCase> cases = {
      {"adam", {{"lr", 1e-3f}}, 1e-3f},
      {"adamw", {{"lr", 1e-3f}, {"weight_decay", 0.0f}}, 1e-3f},
      {"sgd", {{"lr", 1e-2f}, {"momentum", 0.9f}}, 1e-2f}};
  return cases;
}

/// The largest and the median ratio of `x` to `ref`, element by element.
inline std::pair<double, double> ratios(const std::vector<double> &x,
                                 const std::vector<double> &ref) {
  std::vector<double> q;
  for (size_t i = 0; i < x.size(); ++i)
    q.push_back(x[i] / std::max(ref[i], 1e-30));
  std::sort(q.begin(), q.end());
  return {q.back(), q[q.size() / 2]};
}



/// The outlier channel (issue 39): in every group of 32, element 0 gets
/// N(0, 1) gradients and the other 31 get N(0, 1e-3) (a massive activation
/// gives whole weight columns like this); AdamW, lr 1e-3, no decay, 1000
/// steps over 256 groups. Returns {mean signed move of the small elements,
/// largest |move| of one}, in lr.
inline std::pair<double, double> outlierChannel(Mode m) {
  const int64_t n = 256 * 32;
  const float lr = 1e-3f;
  Run r = make("adamw", m, n, {{"lr", lr}, {"weight_decay", 0.0f}});
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int s = 1; s <= 1000; ++s) {
    for (int64_t i = 0; i < n; ++i)
      r.grad[size_t(i)] = (i % 32 == 0 ? 1.0f : 1e-3f) * normal(rng);
    r.step();
  }
  double sum = 0, worst = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0)
      continue;
    double move = -double(r.param[size_t(i)]) / lr; // params start at 0
    sum += move;
    worst = std::max(worst, std::fabs(move));
    ++count;
  }
  return {sum / double(count), worst};
}

/// Absent tokens (issue 39): a 64 x 64 embedding whose rows all get N(0, 1)
/// gradients for 200 steps; then the odd rows get none for `absent` steps,
/// and at the next step every row gets N(0, 1) again. Returns {the mean
/// decoded v of the absent rows before they return, the mean |update| of
/// the absent rows when they return / lr}.
inline std::pair<double, double> absentTokens(Mode m, float beta2, int absent) {
  const int64_t n = 64 * 64;
  const float lr = 1e-3f;
  Run r = make("adamw", m, n,
               {{"lr", lr}, {"beta2", beta2}, {"weight_decay", 0.0f}});
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto isAbsent = [](int64_t i) { return (i / 64) % 2 == 1; };
  for (int s = 1; s <= 200 + absent; ++s) {
    for (int64_t i = 0; i < n; ++i)
      r.grad[size_t(i)] = s > 200 && isAbsent(i) ? 0.0f : normal(rng);
    r.step();
  }
  double v = 0;
  for (int64_t i = 0; i < n; ++i)
    if (isAbsent(i))
      v += r.state(1, i);
  for (int64_t i = 0; i < n; ++i)
    r.grad[size_t(i)] = normal(rng);
  std::vector<float> before = r.param;
  r.step();
  double upd = 0;
  for (int64_t i = 0; i < n; ++i)
    if (isAbsent(i))
      upd += std::fabs(double(r.param[size_t(i)]) - before[size_t(i)]) / lr;
  return {v / (n / 2), upd / (n / 2)};
}

/// Lion's paused momentum (issue 39): every element gets N(0, 1) gradients
/// for 200 steps; then one per two groups gets none for 300 steps and then
/// -0.01 times the sign of its gradient at step 200 for 300 more. Returns
/// {how many of those 64 weights still move against the returning
/// gradient, their mean move along it in lr} over the last 300 steps.
inline std::pair<int, double> lionReversal(Mode m) {
  const int64_t n = 4096;
  Run r = make("lion", m, n, {{"lr", 1e-3f}});
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> sign, start;
  for (int s = 1; s <= 800; ++s) {
    for (int64_t i = 0; i < n; ++i)
      r.grad[size_t(i)] = normal(rng);
    if (s == 200)
      for (int64_t i = 0; i < n; i += 64)
        sign.push_back(r.grad[size_t(i)] > 0 ? 1.0f : -1.0f);
    if (s > 200)
      for (int64_t i = 0, k = 0; i < n; i += 64, ++k)
        r.grad[size_t(i)] = s <= 500 ? 0.0f : -0.01f * sign[size_t(k)];
    if (s == 501)
      start = r.param;
    r.step();
  }
  int against = 0;
  double sum = 0;
  for (int64_t i = 0, k = 0; i < n; i += 64, ++k) {
    double along = (double(r.param[size_t(i)]) - start[size_t(i)]) *
                   sign[size_t(k)] / 1e-3;
    against += along < 0;
    sum += along;
  }
  return {against, sum / 64.0};
}

} // namespace flashopt::ref::hazards

#endif // FLASHOPT_UNITTESTS_NUMERICS_STATEHAZARDRUNS_H
