//===- train_mlp.cpp - Train a small MLP with a flashopt bundle -------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A CPU demo trainer over libflashopt's public API only (<flashopt/flashopt.hpp>,
/// the C++ wrapper of the C ABI <flashopt/flashopt.h>): a 2-layer MLP
/// (64 -> 128 -> 10, tanh, softmax cross-entropy) learns synthetic labels
/// from a random teacher network. Two copies start from the same
/// initialization:
///
///  (a) flashopt: params stored in the bundle's param dtype (bf16, f16 or
///      f32), forward/backward in f32 from the widened params, gradients
///      narrowed to the bundle's grad dtype, the step run by the bundle's CPU
///      kernel through libflashopt (flashopt::Optimizer on a CPU context);
///  (b) a textbook fp32 AdamW written below.
///
/// Both see the same mini-batches and the same learning rate (constant, or
/// a cosine schedule applied to flashopt through set_hyper at every step).
/// The program prints both loss curves, the final test accuracies and the
/// optimizer memory per parameter (flashopt's from its memory report). With
/// --checkpoint it saves a checkpoint half-way, and at the end reloads it,
/// replays the second half and checks the parameters come out bit for bit
/// the same.
///
///   flashopt-train-mlp --bundle build/kernels/adamw_bf16_m24 [--steps 300]
///       [--lr 0.01] [--schedule constant|cosine] [--checkpoint FILE]
///       [--threads N] [--seed 1] [--batch 128] [--print-every 25]
///
//===----------------------------------------------------------------------===//

#include <flashopt/flashopt.hpp>

#include "mlp_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace flashopt_examples;

constexpr double kPi = 3.14159265358979323846;

struct Options {
  std::string bundle;
  std::string checkpoint;
  bool cosine = false;
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
               "[--schedule constant|cosine]\n"
               "                          [--checkpoint FILE] [--threads N] "
               "[--seed N] [--batch N] [--print-every N]\n"
               "  --bundle DIR      a flashopt bundle (DIR/manifest.json), e.g. "
               "build/kernels/adamw_bf16_m24\n"
               "  --steps N         optimizer steps (default 300)\n"
               "  --lr X            learning rate of both optimizers (default 0.01)\n"
               "  --schedule S      constant (default) or cosine: decay to 0.1*lr "
               "(flashopt: set_hyper each step)\n"
               "  --checkpoint FILE save a checkpoint half-way, then check that "
               "resuming from it is exact\n"
               "  --threads N       step threads (default: all cores)\n"
               "  --seed N          data, teacher and init seed (default 1)\n"
               "  --batch N         mini-batch size (default 128)\n"
               "  --print-every N   loss print interval (default 25)\n");
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
    } else if (a == "--checkpoint") {
      if (!value())
        return false;
      o.checkpoint = v;
    } else if (a == "--schedule") {
      if (!value())
        return false;
      if (v != "constant" && v != "cosine") {
        std::fprintf(stderr, "flashopt-train-mlp: --schedule: expected constant "
                             "or cosine, found '%s'\n", v.c_str());
        return false;
      }
      o.cosine = v == "cosine";
    } else if (a == "--cpu") {
      std::fprintf(stderr,
                   "flashopt-train-mlp: --cpu is gone: the public API picks the "
                   "best CPU kernel of the bundle; to force a flavour, build a "
                   "bundle with only it (flashopt-gen SPEC --cpu=x86-64 -o DIR)\n");
      return false;
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

/// Whether the optimizer's rule has hyper-parameter `name`.
bool hasHyper(const flashopt::Optimizer &opt, const std::string &name) {
  std::vector<std::string> names = opt.hyper_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

/// A hyper-parameter's value in param group 0 (the bundle's default until
/// set), or `fallback` when the rule has none.
float hyperOr(const flashopt::Optimizer &opt, const std::string &name,
              float fallback) {
  return hasHyper(opt, name) ? float(opt.get_hyper(0, name)) : fallback;
}

/// The learning rate of step `step` (1-based): constant, or a cosine decay
/// from lr to 0.1 lr over the run.
float lrAt(const Options &o, int step) {
  if (!o.cosine || o.steps < 2)
    return o.lr;
  double progress = double(step - 1) / double(o.steps - 1);
  return float(double(o.lr) * (0.1 + 0.45 * (1.0 + std::cos(kPi * progress))));
}

int run(const Options &o) {
  auto t0 = std::chrono::steady_clock::now();

  flashopt::Context ctx = flashopt::Context::cpu(o.threads);
  flashopt::Optimizer opt;
  try {
    opt = flashopt::Optimizer(ctx, o.bundle);
  } catch (const flashopt::Error &e) {
    std::fprintf(stderr,
                 "flashopt-train-mlp: error: cannot use flashopt bundle '%s':\n"
                 "  %s\n",
                 o.bundle.c_str(), e.what());
    return 1;
  }
  const flashopt_optimizer_info info = opt.info();
  const flashopt_dtype P = info.param_dtype, Gd = info.grad_dtype;
  const std::string rule = info.rule;
  if (P != FLASHOPT_F32 && P != FLASHOPT_BF16 && P != FLASHOPT_F16) {
    std::fprintf(stderr, "flashopt-train-mlp: error: unsupported param dtype %s\n",
                 flashopt_dtype_name(P));
    return 1;
  }

  // Hyper-parameters: --lr for both; the rest from the bundle's defaults
  // (falling back to AdamW's textbook defaults) so the two runs agree.
  AdamW ref;
  ref.lr = o.lr;
  ref.beta1 = hyperOr(opt, "beta1", 0.9f);
  ref.beta2 = hyperOr(opt, "beta2", 0.999f);
  ref.eps = hyperOr(opt, "eps", 1e-8f);
  const float wd = hyperOr(opt, "weight_decay", 0.01f);
  const bool hasLr = hasHyper(opt, "lr");
  const bool hasInitialLr = hasHyper(opt, "initial_lr");
  if (hasLr)
    opt.set_hyper(0, "lr", o.lr);
  if (hasInitialLr) // keep decouple_lr's ratio at 1
    opt.set_hyper(0, "initial_lr", o.lr);
  // Param group 1: biases, without weight decay.
  const int32_t biasGroup = opt.add_param_group();
  if (hasLr)
    opt.set_hyper(biasGroup, "lr", o.lr);
  if (hasInitialLr)
    opt.set_hyper(biasGroup, "initial_lr", o.lr);
  if (hasHyper(opt, "weight_decay"))
    opt.set_hyper(biasGroup, "weight_decay", 0.0);

  Data train, test;
  makeData(o.seed, train, test);
  std::vector<float> init = initParams(o.seed);

  // (a) flashopt: params and grads in the bundle's dtypes.
  static const char *const names[4] = {"fc1.weight", "fc1.bias", "fc2.weight",
                                       "fc2.bias"};
  std::vector<Storage> params, grads;
  for (int k = 0; k < 4; ++k) {
    int64_t n = Layout::sizes[k];
    params.push_back(allocate(n * int64_t(flashopt_dtype_size(P))));
    grads.push_back(allocate(n * int64_t(flashopt_dtype_size(Gd))));
    if (!params.back() || !grads.back()) {
      std::fprintf(stderr, "flashopt-train-mlp: error: out of memory\n");
      return 1;
    }
    for (int64_t i = 0; i < n; ++i)
      store(P, params.back().get(), i, init[size_t(Layout::offsets[k] + i)]);
    opt.add_param(names[k], params.back().get(), P, n, grads.back().get(), Gd,
                  Layout::isBias[k] ? biasGroup : 0);
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

  const int threads =
      o.threads ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("flashopt-train-mlp: bundle %s (rule %s, param %s%s%s, grad %s), "
              "libflashopt %s, %d thread%s\n",
              info.name, info.rule, flashopt_dtype_name(P),
              info.has_correction ? "+" : "",
              info.has_correction ? flashopt_dtype_name(info.correction_dtype) : "",
              flashopt_dtype_name(Gd), flashopt::version(), threads,
              threads == 1 ? "" : "s");
  std::printf("model %d-%d-%d tanh, %lld params in 4 tensors; %d train / %d "
              "test samples from a random teacher (seed %u); batch %d, lr %g%s\n",
              kIn, kHidden, kClasses, (long long)Layout::total, kTrain, kTest,
              o.seed, o.batch, double(o.lr),
              o.cosine ? " (cosine to 0.1x)" : "");
  if (rule != "adamw")
    std::printf("note: the bundle's rule is %s, the reference is AdamW: the "
                "curves are not expected to match\n",
                rule.c_str());
  std::printf("\n%6s  %16s  %16s\n", "step", "flashopt loss", "fp32 AdamW loss");

  std::mt19937 batchRng(o.seed * 7919u + 5u);
  std::uniform_int_distribution<int> pick(0, kTrain - 1);
  std::vector<int> batch(size_t(o.batch));
  std::vector<float> wFlash, gFlash, gRef;
  float lossF = 0, lossR = 0;
  // One flashopt step on the next mini-batch of `rng`; returns the loss.
  auto flashStep = [&](int step, std::mt19937 &rng) {
    for (int &b : batch)
      b = pick(rng);
    widen(wFlash);
    float loss = lossAndGrad(wFlash, train, batch, &gFlash);
    for (int k = 0; k < 4; ++k)
      for (int64_t i = 0; i < Layout::sizes[k]; ++i)
        store(Gd, grads[size_t(k)].get(), i, gFlash[size_t(Layout::offsets[k] + i)]);
    if (o.cosine && hasLr)
      opt.set_hyper("lr", lrAt(o, step)); // every param group
    opt.step();
    return loss;
  };

  const int half = o.steps / 2;
  std::mt19937 rngAtCheckpoint;
  for (int step = 1; step <= o.steps; ++step) {
    lossF = flashStep(step, batchRng);
    // Reference, on the same batch.
    lossR = lossAndGrad(wRef, train, batch, &gRef);
    ref.lr = lrAt(o, step);
    ref.step(wRef, gRef);
    if (step == 1 || step % o.printEvery == 0 || step == o.steps)
      std::printf("%6d  %16.4f  %16.4f\n", step, double(lossF), double(lossR));
    if (!o.checkpoint.empty() && step == half) {
      opt.save_checkpoint(o.checkpoint, FLASHOPT_CHECKPOINT_COMPRESSED);
      rngAtCheckpoint = batchRng;
    }
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

  const flashopt_memory_report r = opt.memory_report();
  const double n = double(r.numel);
  std::printf("\n%-28s  %16s  %16s\n", "", "flashopt", "fp32 AdamW");
  std::printf("%-28s  %16.4f  %16.4f\n", "final train loss (all)", double(trainF),
              double(trainR));
  std::printf("%-28s  %16.4f  %16.4f\n", "final test loss", double(testF),
              double(testR));
  std::printf("%-28s  %15.2f%%  %15.2f%%\n", "final test accuracy",
              100.0 * hitF / kTest, 100.0 * hitR / kTest);
  std::printf("%-28s  %16.4f  %16.4f\n", "optimizer bytes / param",
              r.bytes_per_param, 16.0);
  std::printf("%-28s  %16.4f  %16.4f\n", "  ... with gradient release",
              r.bytes_per_param_with_grad_release, 12.0);
  std::printf("flashopt bytes/param: param %.4g + correction %.4g + grad %.4g + "
              "states %.4g (exact, from the memory report, %lld params)\n",
              double(r.param_bytes) / n, double(r.correction_bytes) / n,
              double(r.grad_bytes) / n, double(r.state_bytes) / n,
              (long long)r.numel);
  std::printf("fp32 AdamW bytes/param: param 4 + grad 4 + exp_avg 4 + "
              "exp_avg_sq 4\n");

  bool resumeOk = true;
  if (!o.checkpoint.empty() && half >= 1) {
    // Reload the half-way checkpoint, replay the second half on the same
    // batches: the parameters must come out bit for bit the same.
    std::vector<std::vector<uint8_t>> finalBytes;
    for (int k = 0; k < 4; ++k) {
      const uint8_t *p = static_cast<const uint8_t *>(params[size_t(k)].get());
      finalBytes.emplace_back(p, p + Layout::sizes[k] * int64_t(flashopt_dtype_size(P)));
    }
    opt.load_checkpoint(o.checkpoint);
    std::mt19937 rng = rngAtCheckpoint;
    for (int step = half + 1; step <= o.steps; ++step)
      flashStep(step, rng);
    for (int k = 0; k < 4; ++k)
      resumeOk = resumeOk && std::memcmp(finalBytes[size_t(k)].data(),
                                         params[size_t(k)].get(),
                                         finalBytes[size_t(k)].size()) == 0;
    std::ifstream f(o.checkpoint, std::ios::binary | std::ios::ate);
    long long bytes = f ? (long long)f.tellg() : -1;
    std::printf("checkpoint at step %d: %s, %lld bytes (%.3f B/param with "
                "header); reloaded and resumed to step %d: %s\n",
                half, o.checkpoint.c_str(), bytes, double(bytes) / n, o.steps,
                resumeOk ? "bit-identical parameters" : "MISMATCH");
  }

  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                    .count();
  std::printf("%d steps in %.2f s\n", o.steps, secs);
  if (!finite) {
    std::fprintf(stderr, "flashopt-train-mlp: error: the flashopt run diverged "
                         "(non-finite loss)\n");
    return 1;
  }
  if (!resumeOk) {
    std::fprintf(stderr, "flashopt-train-mlp: error: resuming from the "
                         "checkpoint did not reproduce the run\n");
    return 1;
  }
  return 0;
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
  try {
    return run(o);
  } catch (const flashopt::Error &e) {
    std::fprintf(stderr, "flashopt-train-mlp: error: %s\n", e.what());
    return 1;
  }
}
