//===- train_mlp.cpp - Train a small MLP with a flashopt bundle -------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A CPU demo trainer: a 2-layer MLP (64 -> 128 -> 10, tanh, softmax
/// cross-entropy) learns synthetic labels from a random teacher network. Two
/// copies start from the same initialization:
///
///  (a) flashopt: params stored in the bundle's param dtype (bf16, f16 or
///      f32), forward/backward in f32 from the widened params, gradients
///      narrowed to the bundle's grad dtype, the step run by the bundle's CPU
///      kernel through the host harness (runtime/);
///  (b) a textbook fp32 AdamW written below.
///
/// Both see the same mini-batches. The program prints both loss curves, the
/// final test accuracies and the optimizer memory per parameter.
///
///   flashopt-train-mlp --bundle build/kernels/adamw_bf16_m24 [--steps 300]
///       [--lr 0.01] [--threads N] [--seed 1] [--batch 128] [--cpu x86-64]
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/Float16.h"
#include "flashopt/host/Harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace flashopt::host;

namespace {

constexpr int kIn = 64, kHidden = 128, kClasses = 10, kTeacherHidden = 32;
constexpr int kTrain = 16384, kTest = 2048;

struct Options {
  std::string bundle;
  std::string cpu;
  int steps = 300;
  float lr = 0.01f;
  int threads = 0;
  uint32_t seed = 1;
  int batch = 128;
  int printEvery = 25;
};

void usage(FILE *out) {
  std::fprintf(out,
               "usage: flashopt-train-mlp --bundle DIR [--steps N] [--lr X] "
               "[--threads N]\n"
               "                          [--seed N] [--batch N] "
               "[--print-every N] [--cpu NAME]\n"
               "  --bundle DIR   a flashopt bundle (DIR/manifest.json), e.g. "
               "build/kernels/adamw_bf16_m24\n"
               "  --steps N      optimizer steps (default 300)\n"
               "  --lr X         learning rate of both optimizers (default 0.01)\n"
               "  --threads N    harness threads (default: all cores)\n"
               "  --seed N       data, teacher and init seed (default 1)\n"
               "  --batch N      mini-batch size (default 128)\n"
               "  --print-every N  loss print interval (default 25)\n"
               "  --cpu NAME     force a CPU kernel flavour (e.g. x86-64)\n");
}

bool parseArgs(int argc, char **argv, Options &o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    size_t eq = a.find('=');
    bool inlineValue = a.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inlineValue) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    }
    auto value = [&]() -> bool {
      if (inlineValue)
        return true;
      if (i + 1 >= argc) {
        std::fprintf(stderr, "flashopt-train-mlp: %s needs a value\n", a.c_str());
        return false;
      }
      v = argv[++i];
      return true;
    };
    auto number = [&](double &out) {
      char *end = nullptr;
      out = std::strtod(v.c_str(), &end);
      if (v.empty() || *end) {
        std::fprintf(stderr, "flashopt-train-mlp: %s: not a number: '%s'\n",
                     a.c_str(), v.c_str());
        return false;
      }
      return true;
    };
    double d = 0;
    if (a == "--bundle") {
      if (!value())
        return false;
      o.bundle = v;
    } else if (a == "--cpu") {
      if (!value())
        return false;
      o.cpu = v;
    } else if (a == "--steps" || a == "--lr" || a == "--threads" ||
               a == "--seed" || a == "--batch" || a == "--print-every") {
      if (!value() || !number(d))
        return false;
      if (a == "--steps")
        o.steps = int(d);
      else if (a == "--lr")
        o.lr = float(d);
      else if (a == "--threads")
        o.threads = int(d);
      else if (a == "--seed")
        o.seed = uint32_t(d);
      else if (a == "--batch")
        o.batch = int(d);
      else
        o.printEvery = int(d);
    } else {
      std::fprintf(stderr, "flashopt-train-mlp: unknown option '%s'\n",
                   argv[i]);
      return false;
    }
  }
  if (o.steps < 1 || o.batch < 1 || o.printEvery < 1 || o.threads < 0 ||
      !(o.lr > 0) || !std::isfinite(o.lr)) {
    std::fprintf(stderr, "flashopt-train-mlp: --steps, --batch and "
                         "--print-every must be >= 1, --threads >= 0, --lr > 0\n");
    return false;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// The model: parameters as four tensors in one flat f32 vector.
//===----------------------------------------------------------------------===//

struct Layout {
  // W1 [kHidden][kIn], b1 [kHidden], W2 [kClasses][kHidden], b2 [kClasses]
  static constexpr int64_t sizes[4] = {int64_t(kHidden) * kIn, kHidden,
                                       int64_t(kClasses) * kHidden, kClasses};
  static constexpr int64_t offsets[4] = {0, sizes[0], sizes[0] + sizes[1],
                                         sizes[0] + sizes[1] + sizes[2]};
  static constexpr int64_t total = offsets[3] + sizes[3];
  static constexpr bool isBias[4] = {false, true, false, true};
};

struct Data {
  std::vector<float> x; // [n][kIn]
  std::vector<int> y;
};

/// Labels from a random teacher (64 -> 32 tanh -> 10, argmax).
void makeData(uint32_t seed, Data &train, Data &test) {
  std::mt19937 rng(seed * 2654435761u + 17u);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> t1(size_t(kTeacherHidden) * kIn), t2(size_t(kClasses) * kTeacherHidden);
  for (float &w : t1)
    w = nd(rng) * 0.7f / std::sqrt(float(kIn));
  for (float &w : t2)
    w = nd(rng) * 2.0f / std::sqrt(float(kTeacherHidden));
  auto fill = [&](Data &d, int n) {
    d.x.resize(size_t(n) * kIn);
    d.y.resize(size_t(n));
    for (int s = 0; s < n; ++s) {
      float *x = &d.x[size_t(s) * kIn];
      for (int i = 0; i < kIn; ++i)
        x[i] = nd(rng);
      float h[kTeacherHidden];
      for (int j = 0; j < kTeacherHidden; ++j) {
        float a = 0;
        for (int i = 0; i < kIn; ++i)
          a += t1[size_t(j) * kIn + size_t(i)] * x[i];
        h[j] = std::tanh(a);
      }
      int best = 0;
      float bestV = -INFINITY;
      for (int c = 0; c < kClasses; ++c) {
        float a = 0;
        for (int j = 0; j < kTeacherHidden; ++j)
          a += t2[size_t(c) * kTeacherHidden + size_t(j)] * h[j];
        if (a > bestV) {
          bestV = a;
          best = c;
        }
      }
      d.y[size_t(s)] = best;
    }
  };
  fill(train, kTrain);
  fill(test, kTest);
}

std::vector<float> initParams(uint32_t seed) {
  std::mt19937 rng(seed * 40503u + 3u);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(size_t(Layout::total), 0.0f);
  for (int64_t i = 0; i < Layout::sizes[0]; ++i)
    w[size_t(Layout::offsets[0] + i)] = nd(rng) / std::sqrt(float(kIn));
  for (int64_t i = 0; i < Layout::sizes[2]; ++i)
    w[size_t(Layout::offsets[2] + i)] = nd(rng) / std::sqrt(float(kHidden));
  return w; // biases start at 0
}

/// Mean cross-entropy over `idx` (and its gradient into `grad` if non-null);
/// `correct` counts argmax hits.
float lossAndGrad(const std::vector<float> &w, const Data &d,
                  const std::vector<int> &idx, std::vector<float> *grad,
                  int *correct = nullptr) {
  const float *W1 = &w[size_t(Layout::offsets[0])];
  const float *b1 = &w[size_t(Layout::offsets[1])];
  const float *W2 = &w[size_t(Layout::offsets[2])];
  const float *b2 = &w[size_t(Layout::offsets[3])];
  float *gW1 = nullptr, *gb1 = nullptr, *gW2 = nullptr, *gb2 = nullptr;
  if (grad) {
    grad->assign(size_t(Layout::total), 0.0f);
    gW1 = &(*grad)[size_t(Layout::offsets[0])];
    gb1 = &(*grad)[size_t(Layout::offsets[1])];
    gW2 = &(*grad)[size_t(Layout::offsets[2])];
    gb2 = &(*grad)[size_t(Layout::offsets[3])];
  }
  const float invB = 1.0f / float(idx.size());
  double loss = 0;
  int hits = 0;
  float h[kHidden], logits[kClasses], dl[kClasses], dh[kHidden];
  for (int s : idx) {
    const float *x = &d.x[size_t(s) * kIn];
    for (int j = 0; j < kHidden; ++j) {
      float a = b1[j];
      const float *row = W1 + size_t(j) * kIn;
      for (int i = 0; i < kIn; ++i)
        a += row[i] * x[i];
      h[j] = std::tanh(a);
    }
    float mx = -INFINITY;
    int arg = 0;
    for (int c = 0; c < kClasses; ++c) {
      float a = b2[c];
      const float *row = W2 + size_t(c) * kHidden;
      for (int j = 0; j < kHidden; ++j)
        a += row[j] * h[j];
      logits[c] = a;
      if (a > mx) {
        mx = a;
        arg = c;
      }
    }
    hits += arg == d.y[size_t(s)];
    double z = 0;
    for (int c = 0; c < kClasses; ++c)
      z += std::exp(double(logits[c] - mx));
    double logZ = std::log(z) + mx;
    loss += logZ - logits[d.y[size_t(s)]];
    if (!grad)
      continue;
    for (int c = 0; c < kClasses; ++c)
      dl[c] = (float(std::exp(double(logits[c]) - logZ)) -
               (c == d.y[size_t(s)] ? 1.0f : 0.0f)) *
              invB;
    for (int j = 0; j < kHidden; ++j)
      dh[j] = 0;
    for (int c = 0; c < kClasses; ++c) {
      gb2[c] += dl[c];
      float *grow = gW2 + size_t(c) * kHidden;
      const float *row = W2 + size_t(c) * kHidden;
      for (int j = 0; j < kHidden; ++j) {
        grow[j] += dl[c] * h[j];
        dh[j] += row[j] * dl[c];
      }
    }
    for (int j = 0; j < kHidden; ++j) {
      float dp = dh[j] * (1.0f - h[j] * h[j]);
      gb1[j] += dp;
      float *grow = gW1 + size_t(j) * kIn;
      for (int i = 0; i < kIn; ++i)
        grow[i] += dp * x[i];
    }
  }
  if (correct)
    *correct = hits;
  return float(loss / double(idx.size()));
}

//===----------------------------------------------------------------------===//
// Storage in the bundle's dtypes.
//===----------------------------------------------------------------------===//

struct AlignedFree {
  void operator()(void *p) const { std::free(p); }
};
using Storage = std::unique_ptr<void, AlignedFree>;

Storage allocate(int64_t bytes) {
  void *p = nullptr;
  size_t n = size_t((bytes + 63) / 64 * 64);
  if (posix_memalign(&p, 64, n) != 0)
    return Storage();
  std::memset(p, 0, n);
  return Storage(p);
}

float loadAs(DType t, const void *p, int64_t i) {
  switch (t) {
  case DType::F32:
    return static_cast<const float *>(p)[i];
  case DType::BF16:
    return bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
  case DType::F16:
    return f16_to_f32(static_cast<const uint16_t *>(p)[i]);
  default:
    return NAN;
  }
}

void store(DType t, void *p, int64_t i, float v) {
  switch (t) {
  case DType::F32:
    static_cast<float *>(p)[i] = v;
    break;
  case DType::BF16:
    static_cast<uint16_t *>(p)[i] = f32_to_bf16(v);
    break;
  case DType::F16:
    static_cast<uint16_t *>(p)[i] = f32_to_f16(v);
    break;
  default:
    break;
  }
}

/// Textbook fp32 AdamW (decoupled weight decay, bias-corrected moments).
struct AdamW {
  float lr, beta1, beta2, eps;
  std::vector<float> m, v, decay; // decay: weight decay per element
  int64_t t = 0;

  void step(std::vector<float> &w, const std::vector<float> &g) {
    ++t;
    float bc1 = 1.0f - std::pow(beta1, float(t));
    float bc2 = 1.0f - std::pow(beta2, float(t));
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
      v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
      w[i] *= 1.0f - lr * decay[i];
      w[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
    }
  }
};

float hyperDefault(const Manifest &m, const char *name, float fallback) {
  int h = m.hyper_index(name);
  if (h < 0 || !m.hypers[size_t(h)].default_value)
    return fallback;
  return *m.hypers[size_t(h)].default_value;
}

} // namespace

int main(int argc, char **argv) {
  Options o;
  if (!parseArgs(argc, argv, o)) {
    usage(stderr);
    return 2;
  }
  if (o.bundle.empty()) {
    std::fprintf(stderr, "flashopt-train-mlp: error: no bundle given (--bundle "
                         "DIR, e.g. build/kernels/adamw_bf16_m24)\n");
    usage(stderr);
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();

  LoadOptions load;
  load.cpu = o.cpu;
  OptimizerOptions oo;
  oo.threads = o.threads;
  auto created = Optimizer::create(o.bundle, load, oo);
  if (!created) {
    std::fprintf(stderr,
                 "flashopt-train-mlp: error: cannot use flashopt bundle '%s':\n"
                 "  %s\n",
                 o.bundle.c_str(), created.error().c_str());
    return 1;
  }
  Optimizer &opt = **created;
  const Manifest &man = opt.manifest();
  const DType P = man.param, Gd = man.grad;

  // Hyper-parameters: --lr for both; the rest from the bundle's defaults
  // (falling back to AdamW's textbook defaults) so the two runs agree.
  AdamW ref;
  ref.lr = o.lr;
  ref.beta1 = hyperDefault(man, "beta1", 0.9f);
  ref.beta2 = hyperDefault(man, "beta2", 0.999f);
  ref.eps = hyperDefault(man, "eps", 1e-8f);
  float wd = hyperDefault(man, "weight_decay", 0.01f);
  bool hasLr = man.hyper_index("lr") >= 0;
  bool hasWd = man.hyper_index("weight_decay") >= 0;
  if (hasLr) {
    Status s = opt.set_hyper(0, "lr", o.lr);
    if (!s) {
      std::fprintf(stderr, "flashopt-train-mlp: error: %s\n", s.message().c_str());
      return 1;
    }
  }
  if (man.hyper_index("initial_lr") >= 0) // keep decouple_lr's ratio at 1
    (void)opt.set_hyper(0, "initial_lr", o.lr);
  // Param group 1: biases, without weight decay.
  int biasGroup = opt.add_param_group();
  if (hasLr)
    (void)opt.set_hyper(biasGroup, "lr", o.lr);
  if (man.hyper_index("initial_lr") >= 0)
    (void)opt.set_hyper(biasGroup, "initial_lr", o.lr);
  if (hasWd)
    (void)opt.set_hyper(biasGroup, "weight_decay", 0.0f);

  Data train, test;
  makeData(o.seed, train, test);
  std::vector<float> init = initParams(o.seed);

  // (a) flashopt: params and grads in the bundle's dtypes.
  std::vector<Storage> params, grads;
  for (int k = 0; k < 4; ++k) {
    int64_t n = Layout::sizes[k];
    params.push_back(allocate(n * dtype_size(P)));
    grads.push_back(allocate(n * dtype_size(Gd)));
    if (!params.back() || !grads.back()) {
      std::fprintf(stderr, "flashopt-train-mlp: error: out of memory\n");
      return 1;
    }
    for (int64_t i = 0; i < n; ++i)
      store(P, params.back().get(), i, init[size_t(Layout::offsets[k] + i)]);
    auto idx = opt.add_param(Layout::isBias[k] ? biasGroup : 0,
                             params.back().get(), n, grads.back().get());
    if (!idx) {
      std::fprintf(stderr, "flashopt-train-mlp: error: %s\n", idx.error().c_str());
      return 1;
    }
  }
  auto widen = [&](std::vector<float> &w) {
    w.resize(size_t(Layout::total));
    for (int k = 0; k < 4; ++k)
      for (int64_t i = 0; i < Layout::sizes[k]; ++i)
        w[size_t(Layout::offsets[k] + i)] = loadAs(P, params[size_t(k)].get(), i);
  };

  // (b) fp32 AdamW from the same init.
  std::vector<float> wRef = init;
  ref.m.assign(size_t(Layout::total), 0.0f);
  ref.v.assign(size_t(Layout::total), 0.0f);
  ref.decay.assign(size_t(Layout::total), wd);
  for (int k = 0; k < 4; ++k)
    if (Layout::isBias[k])
      std::fill(ref.decay.begin() + Layout::offsets[k],
                ref.decay.begin() + Layout::offsets[k] + Layout::sizes[k], 0.0f);

  std::printf("flashopt-train-mlp: bundle %s (rule %s, param %s%s%s, grad %s), "
              "cpu kernel %s, %d thread%s\n",
              man.name.c_str(), man.rule.c_str(), dtype_name(P),
              man.correction ? "+" : "",
              man.correction ? dtype_name(*man.correction) : "", dtype_name(Gd),
              opt.bundle().kernel().cpu.c_str(), opt.threads(),
              opt.threads() == 1 ? "" : "s");
  std::printf("model %d-%d-%d tanh, %lld params in 4 tensors; %d train / %d "
              "test samples from a random teacher (seed %u); batch %d, lr %g\n",
              kIn, kHidden, kClasses, (long long)Layout::total, kTrain, kTest,
              o.seed, o.batch, double(o.lr));
  if (man.rule != "adamw")
    std::printf("note: the bundle's rule is %s, the reference is AdamW: the "
                "curves are not expected to match\n",
                man.rule.c_str());
  std::printf("\n%6s  %16s  %16s\n", "step", "flashopt loss", "fp32 AdamW loss");

  std::mt19937 batchRng(o.seed * 7919u + 5u);
  std::uniform_int_distribution<int> pick(0, kTrain - 1);
  std::vector<int> batch(size_t(o.batch));
  std::vector<float> wFlash, gFlash, gRef;
  float lossF = 0, lossR = 0;
  for (int step = 1; step <= o.steps; ++step) {
    for (int &b : batch)
      b = pick(batchRng);
    // flashopt: widen, f32 forward/backward, narrow the grads, step.
    widen(wFlash);
    lossF = lossAndGrad(wFlash, train, batch, &gFlash);
    for (int k = 0; k < 4; ++k)
      for (int64_t i = 0; i < Layout::sizes[k]; ++i)
        store(Gd, grads[size_t(k)].get(), i, gFlash[size_t(Layout::offsets[k] + i)]);
    Status s = opt.step();
    if (!s) {
      std::fprintf(stderr, "flashopt-train-mlp: error: step %d: %s\n", step,
                   s.message().c_str());
      return 1;
    }
    // Reference.
    lossR = lossAndGrad(wRef, train, batch, &gRef);
    ref.step(wRef, gRef);
    if (step == 1 || step % o.printEvery == 0 || step == o.steps)
      std::printf("%6d  %16.4f  %16.4f\n", step, double(lossF), double(lossR));
  }

  std::vector<int> all(kTest), allTrain(kTrain);
  for (int i = 0; i < kTest; ++i)
    all[size_t(i)] = i;
  for (int i = 0; i < kTrain; ++i)
    allTrain[size_t(i)] = i;
  widen(wFlash);
  int hitF = 0, hitR = 0;
  float testF = lossAndGrad(wFlash, test, all, nullptr, &hitF);
  float testR = lossAndGrad(wRef, test, all, nullptr, &hitR);
  float trainF = lossAndGrad(wFlash, train, allTrain, nullptr);
  float trainR = lossAndGrad(wRef, train, allTrain, nullptr);
  bool finite = std::isfinite(testF) && std::isfinite(trainF);

  BytesReport r = opt.bytes();
  const BytesPerParam &pp = r.per_param;
  std::printf("\n%-28s  %16s  %16s\n", "", "flashopt", "fp32 AdamW");
  std::printf("%-28s  %16.4f  %16.4f\n", "final train loss (all)", double(trainF),
              double(trainR));
  std::printf("%-28s  %16.4f  %16.4f\n", "final test loss", double(testF),
              double(testR));
  std::printf("%-28s  %15.2f%%  %15.2f%%\n", "final test accuracy",
              100.0 * hitF / kTest, 100.0 * hitR / kTest);
  std::printf("%-28s  %16.4f  %16.4f\n", "optimizer bytes / param", pp.total,
              16.0);
  std::printf("%-28s  %16.4f  %16.4f\n", "  ... with gradient release",
              pp.total_with_grad_release, 12.0);
  std::printf("flashopt bytes/param: param %.4g + correction %.4g + grad %.4g + "
              "states %.4g (exact, %lld params; the manifest's large-tensor "
              "figure is %.4g)\n",
              pp.param, pp.correction, pp.grad, pp.states, (long long)r.numel,
              man.bytes_per_param.total);
  std::printf("fp32 AdamW bytes/param: param 4 + grad 4 + exp_avg 4 + "
              "exp_avg_sq 4\n");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                    .count();
  std::printf("%d steps in %.2f s\n", o.steps, secs);
  if (!finite) {
    std::fprintf(stderr, "flashopt-train-mlp: error: the flashopt run diverged "
                         "(non-finite loss)\n");
    return 1;
  }
  return 0;
}
