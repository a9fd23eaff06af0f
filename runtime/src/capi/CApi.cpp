//===- CApi.cpp - The libflashopt C ABI ------------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt.h's entry points over the internal C++ layer: each runs in
/// guard() (capi/Errors.h), looks up its handle (capi/Handles.h) and calls
/// the context's optimizer (one host::Optimizer, CPU or CUDA backend).
/// Parameters (capi/Params.cpp), DLPack (capi/DLPack.cpp), checkpoints
/// (capi/Checkpoint.cpp) and master weights (capi/MasterWeights.cpp) have
/// their own files.
///
/// Per-parameter step counters (gradient release): flashopt_step runs one
/// kernel call per distinct counter value (one call when all are equal),
/// flashopt_step_param one call over the parameter's records.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "Bundles.h"
#include "Checkpoint.h"
#include "DLPack.h"
#include "Errors.h"
#include "Handles.h"
#include "MasterWeights.h"
#include "Objects.h"
#include "Params.h"
#include "Stepping.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

using namespace flashopt::capi;

namespace {
/// FNV-1a over the bytes of `v` (the ranks compare hyper tables by it).
uint64_t hashFloats(const std::vector<float> &v) {
  uint64_t h = 0xcbf29ce484222325ULL;
  const unsigned char *p = reinterpret_cast<const unsigned char *>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

/// numerics.md §4.3: the exponent bits of a parameter dtype.
int exponentBits(DType t) { return t == DType::F16 ? 5 : 8; }
} // namespace

//===----------------------------------------------------------------------===//
// The C ABI
//===----------------------------------------------------------------------===//

extern "C" {

const char *flashopt_last_error(void) { return last_error().c_str(); }

const char *flashopt_status_name(flashopt_status status) {
  switch (status) {
  case FLASHOPT_OK:
    return "FLASHOPT_OK";
  case FLASHOPT_ERROR_INVALID_ARGUMENT:
    return "FLASHOPT_ERROR_INVALID_ARGUMENT";
  case FLASHOPT_ERROR_INVALID_HANDLE:
    return "FLASHOPT_ERROR_INVALID_HANDLE";
  case FLASHOPT_ERROR_DTYPE:
    return "FLASHOPT_ERROR_DTYPE";
  case FLASHOPT_ERROR_DEVICE:
    return "FLASHOPT_ERROR_DEVICE";
  case FLASHOPT_ERROR_SIZE:
    return "FLASHOPT_ERROR_SIZE";
  case FLASHOPT_ERROR_NOT_FOUND:
    return "FLASHOPT_ERROR_NOT_FOUND";
  case FLASHOPT_ERROR_ALREADY_EXISTS:
    return "FLASHOPT_ERROR_ALREADY_EXISTS";
  case FLASHOPT_ERROR_STATE:
    return "FLASHOPT_ERROR_STATE";
  case FLASHOPT_ERROR_FORMAT:
    return "FLASHOPT_ERROR_FORMAT";
  case FLASHOPT_ERROR_MISMATCH:
    return "FLASHOPT_ERROR_MISMATCH";
  case FLASHOPT_ERROR_IO:
    return "FLASHOPT_ERROR_IO";
  case FLASHOPT_ERROR_OUT_OF_MEMORY:
    return "FLASHOPT_ERROR_OUT_OF_MEMORY";
  case FLASHOPT_ERROR_UNSUPPORTED:
    return "FLASHOPT_ERROR_UNSUPPORTED";
  case FLASHOPT_ERROR_NUMERICS:
    return "FLASHOPT_ERROR_NUMERICS";
  case FLASHOPT_ERROR_CUDA:
    return "FLASHOPT_ERROR_CUDA";
  case FLASHOPT_ERROR_INTERNAL:
    return "FLASHOPT_ERROR_INTERNAL";
  case FLASHOPT_ERROR_COMM:
    return "FLASHOPT_ERROR_COMM";
  }
  return "unknown";
}

const char *flashopt_version(void) { return flashopt::abi::kFlashOptVersion; }
int flashopt_abi_version(void) { return FLASHOPT_ABI_VERSION; }

const char *flashopt_dtype_name(flashopt_dtype dtype) {
  if (!validDtype(dtype))
    return nullptr;
  return dtype_name(toHost(dtype));
}

size_t flashopt_dtype_size(flashopt_dtype dtype) {
  if (!validDtype(dtype))
    return 0;
  return size_t(dtype_size(toHost(dtype)));
}

// ---- contexts
// ----------------------------------------------------------------

flashopt_status flashopt_context_create(flashopt_device_type type,
                                        int device_id, flashopt_context *out) {
  return guard("flashopt_context_create", [&] {
    needOut(out, "out");
    auto c = std::make_shared<ContextObj>();
    c->type = type;
    c->device = device_id;
    if (type == FLASHOPT_DEVICE_CPU) {
      if (device_id != 0)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
             "CPU context: device_id must be 0, got " +
                 std::to_string(device_id));
    } else if (type == FLASHOPT_DEVICE_CUDA) {
      if (device_id < 0)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT, "CUDA context: device_id " +
                                                  std::to_string(device_id) +
                                                  " is negative");
      Expected<std::shared_ptr<CudaContext>> cc =
          CudaContext::create(device_id);
      if (!cc)
        fail(FLASHOPT_ERROR_DEVICE,
             "CUDA device " + std::to_string(device_id) + ": " + cc.error());
      c->cuda = std::move(cc.value());
    } else {
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "unknown device type " + std::to_string(int(type)) +
               " (FLASHOPT_DEVICE_CPU or FLASHOPT_DEVICE_CUDA)");
    }
    *out = registerContext(std::move(c));
  });
}

flashopt_status flashopt_context_set_threads(flashopt_context ctx,
                                             int threads) {
  return guard("flashopt_context_set_threads", [&] {
    std::shared_ptr<ContextObj> c = getContext(ctx);
    if (c->type != FLASHOPT_DEVICE_CPU)
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           "a CUDA context has no CPU threads to set");
    if (threads < 0 || threads > flashopt::host::kMaxCpuThreads)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "threads must be in [0, " + std::to_string(flashopt::host::kMaxCpuThreads) +
               "] (0 = all hardware threads), got " + std::to_string(threads));
    std::lock_guard<std::mutex> lock(c->mu);
    c->threads = threads;
    for (const std::weak_ptr<OptObj> &w : c->opts)
      if (std::shared_ptr<OptObj> o = w.lock()) {
        std::lock_guard<std::mutex> olock(o->mu);
        Status s = o->cpu->set_threads(threads);
        if (!s)
          fail(FLASHOPT_ERROR_INTERNAL, s.message());
      }
  });
}

flashopt_status flashopt_context_destroy(flashopt_context ctx) {
  return guard("flashopt_context_destroy", [&] {
    // Released here, outside the registry lock.
    std::shared_ptr<ContextObj> c = getContext(ctx, /*take=*/true);
  });
}

// ---- optimizers
// ----------------------------------------------------------------

flashopt_status flashopt_optimizer_create(flashopt_context ctx,
                                          const char *bundle_dir,
                                          flashopt_optimizer *out) {
  return guard("flashopt_optimizer_create", [&] {
    needOut(out, "out");
    needOut(bundle_dir, "bundle_dir");
    std::shared_ptr<ContextObj> c = getContext(ctx);
    std::shared_ptr<OptObj> o = createOptimizer(c, bundle_dir);
    *out = registerOptimizer(c, std::move(o));
  });
}

flashopt_status
flashopt_optimizer_create_embedded(flashopt_context ctx,
                                   const flashopt_embedded_bundle *bundle,
                                   flashopt_optimizer *out) {
  return guard("flashopt_optimizer_create_embedded", [&] {
    needOut(out, "out");
    needOut(bundle, "bundle");
    std::shared_ptr<ContextObj> c = getContext(ctx);
    std::shared_ptr<OptObj> o = createEmbeddedOptimizer(c, bundle);
    *out = registerOptimizer(c, std::move(o));
  });
}

flashopt_status flashopt_optimizer_destroy(flashopt_optimizer opt) {
  return guard("flashopt_optimizer_destroy", [&] {
    // Destroyed here, outside the registry lock.
    std::shared_ptr<OptObj> o = getOptimizer(opt, /*take=*/true);
    // Wait for a call in flight (misuse, but do not free under it).
    std::lock_guard<std::mutex> lock(o->mu);
  });
}

flashopt_status flashopt_optimizer_get_info(flashopt_optimizer opt,
                                            flashopt_optimizer_info *out) {
  return guard("flashopt_optimizer_get_info", [&] {
    needOut(out, "out");
    Locked o(opt);
    const Manifest &m = *o->m;
    flashopt_optimizer_info i{};
    i.name = m.name.c_str();
    i.rule = m.rule.c_str();
    i.spec_hash = m.spec_hash.c_str();
    i.param_dtype = toC(m.param);
    i.grad_dtype = toC(m.grad);
    i.has_correction = m.correction ? 1 : 0;
    i.correction_dtype = m.correction ? toC(*m.correction) : FLASHOPT_I8;
    i.group_size = m.group_size;
    i.num_hypers = int32_t(m.hypers.size());
    int32_t states = 0;
    for (const StateSpec &s : m.states)
      if (!flashopt::abi::state_buffers(s).empty())
        ++states;
    i.num_states = states;
    i.device_type = o->ctx->type;
    i.device_id = o->ctx->device;
    *out = i;
  });
}

flashopt_status flashopt_hyper_name(flashopt_optimizer opt, int32_t index,
                                    const char **out) {
  return guard("flashopt_hyper_name", [&] {
    needOut(out, "out");
    Locked o(opt);
    if (index < 0 || index >= int32_t(o->m->hypers.size()))
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "hyper-parameter index " + std::to_string(index) +
               " is out of range (" + o->m->name + " has " +
               std::to_string(o->m->hypers.size()) + ")");
    *out = o->m->hypers[size_t(index)].name.c_str();
  });
}

// ---- param groups and hyper-parameters
// ------------------------------------------

flashopt_status flashopt_add_param_group(flashopt_optimizer opt,
                                         int32_t *out_group) {
  return guard("flashopt_add_param_group", [&] {
    needOut(out_group, "out_group");
    Locked o(opt);
    int g = o->opt->add_param_group();
    if (g < 0)
      fail(FLASHOPT_ERROR_OUT_OF_MEMORY, "adding a param group");
    *out_group = g;
  });
}

flashopt_status flashopt_num_param_groups(flashopt_optimizer opt,
                                          int32_t *out) {
  return guard("flashopt_num_param_groups", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->opt->num_param_groups();
  });
}

namespace {
void checkHyperName(const OptObj &o, const char *name) {
  needOut(name, "name");
  if (o.m->hyper_index(name) < 0) {
    std::string names;
    for (const HyperSpec &h : o.m->hypers)
      names += (names.empty() ? "" : ", ") + h.name;
    fail(FLASHOPT_ERROR_NOT_FOUND, "unknown hyper-parameter " + quote(name) +
                                       " (" + o.m->name + " has: " + names +
                                       ")");
  }
}
} // namespace

flashopt_status flashopt_set_hyper(flashopt_optimizer opt, int32_t group,
                                   const char *name, double value) {
  return guard("flashopt_set_hyper", [&] {
    Locked o(opt);
    checkHyperName(*o, name);
    if (group != -1)
      checkGroup(*o, group);
    float v = float(value);
    if (!std::isfinite(value) || !std::isfinite(v))
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT, "hyper-parameter " + quote(name) +
                                                ": value " + fmt(value) +
                                                " is not finite (as a float)");
    if (value != 0.0 && v == 0.0f)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "hyper-parameter " + quote(name) + ": value " + fmt(value) +
               " is not 0 but underflows to 0 as a float (hyper-parameters "
               "are f32; the smallest positive one is 1.4e-45)");
    // Validate every group first, so that nothing changes on failure.
    int first = group == -1 ? 0 : group;
    int last = group == -1 ? o->opt->num_param_groups() - 1 : group;
    if (v != 0.0f)
      for (const StateSpec &s : o->m->states)
        if (s.kind == StateKind::Elided && s.elidable_if_zero == name)
          fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
               "hyper-parameter " + quote(name) + " must stay 0 in " +
                   o->m->name + ": its state " + quote(s.name) +
                   " is elided (compile a spec that keeps it)");
    for (int g = first; g <= last; ++g) {
      Status s = o->opt->set_hyper(g, name, v);
      if (!s)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
             "param group " + std::to_string(g) + ": " + s.message());
    }
  });
}

flashopt_status flashopt_get_hyper(flashopt_optimizer opt, int32_t group,
                                   const char *name, double *out) {
  return guard("flashopt_get_hyper", [&] {
    needOut(out, "out");
    Locked o(opt);
    checkHyperName(*o, name);
    checkGroup(*o, group);
    Expected<float> v = o->opt->hyper(group, name);
    if (!v)
      fail(FLASHOPT_ERROR_INTERNAL, v.error());
    *out = double(*v);
  });
}

// ---- parameters and gradients
// ---------------------------------------------------

flashopt_status flashopt_add_param(flashopt_optimizer opt, int32_t group,
                                   const char *name, void *param,
                                   flashopt_dtype param_dtype, int64_t numel,
                                   const void *grad, flashopt_dtype grad_dtype,
                                   int64_t *out_index) {
  return guard("flashopt_add_param", [&] {
    Locked o(opt);
    addParam(*o, group, name, param, param_dtype, numel, grad, grad_dtype, {},
             out_index);
  });
}

flashopt_status flashopt_add_param_dlpack(flashopt_optimizer opt, int32_t group,
                                          const char *name, const void *param,
                                          const void *grad,
                                          int64_t *out_index) {
  return guard("flashopt_add_param_dlpack", [&] {
    Locked o(opt);
    needOut(param, "param");
    std::string who =
        "parameter " +
        quote(name ? name : "p" + std::to_string(o->params.size()));
    DLInfo p = parseDL(param, *o->ctx, who + " (param)");
    DLInfo g;
    if (grad) {
      g = parseDL(grad, *o->ctx, who + " (grad)");
      if (g.numel != p.numel)
        fail(FLASHOPT_ERROR_SIZE,
             who + ": grad has " + std::to_string(g.numel) +
                 " elements, param " + std::to_string(p.numel));
      if (!g.data)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT, who + ": grad data is NULL");
    }
    addParam(*o, group, name, p.data, p.dtype, p.numel, grad ? g.data : nullptr,
             grad ? g.dtype : toC(o->m->grad), p.shape, out_index);
  });
}

flashopt_status flashopt_set_grad(flashopt_optimizer opt, int64_t index,
                                  const void *grad, flashopt_dtype grad_dtype,
                                  int64_t numel) {
  return guard("flashopt_set_grad", [&] {
    Locked o(opt);
    setGrad(*o, index, grad, grad_dtype, numel);
  });
}

flashopt_status flashopt_set_grad_dlpack(flashopt_optimizer opt, int64_t index,
                                         const void *grad) {
  return guard("flashopt_set_grad_dlpack", [&] {
    Locked o(opt);
    needOut(grad, "grad");
    checkIndex(*o, index);
    DLInfo g = parseDL(grad, *o->ctx, o->describe(index) + " (grad)");
    setGrad(*o, index, g.data, g.dtype, g.numel);
  });
}

flashopt_status flashopt_set_grads(flashopt_optimizer opt, int64_t count,
                                   const int64_t *indices,
                                   const void *const *grads,
                                   flashopt_dtype grad_dtype) {
  return guard("flashopt_set_grads", [&] {
    Locked o(opt);
    if (count < 0)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "count is negative (" + std::to_string(count) + ")");
    if (count == 0)
      return;
    needOut(indices, "indices");
    needOut(grads, "grads");
    for (int64_t k = 0; k < count; ++k) {
      int64_t i = indices[k];
      checkIndex(*o, i);
      checkGrad(*o, i, grads[k], grad_dtype, o->params[size_t(i)].numel);
    }
    for (int64_t k = 0; k < count; ++k)
      applyGrad(*o, indices[k], grads[k]);
  });
}

flashopt_status flashopt_num_params(flashopt_optimizer opt, int64_t *out) {
  return guard("flashopt_num_params", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = int64_t(o->params.size());
  });
}

flashopt_status flashopt_find_param(flashopt_optimizer opt, const char *name,
                                    int64_t *out_index) {
  return guard("flashopt_find_param", [&] {
    needOut(out_index, "out_index");
    needOut(name, "name");
    Locked o(opt);
    auto it = o->byName.find(name);
    if (it == o->byName.end())
      fail(FLASHOPT_ERROR_NOT_FOUND,
           "no parameter named " + quote(name) + " is registered");
    *out_index = it->second;
  });
}

flashopt_status flashopt_get_param_info(flashopt_optimizer opt, int64_t index,
                                        flashopt_param_info *out) {
  return guard("flashopt_get_param_info", [&] {
    needOut(out, "out");
    Locked o(opt);
    checkIndex(*o, index);
    const ParamRec &p = o->params[size_t(index)];
    flashopt_param_info i{};
    i.name = p.name.c_str();
    i.numel = p.numel;
    i.group = p.group;
    i.ndim = int32_t(p.shape.size());
    i.shape = p.shape.data();
    i.step = p.step;
    *out = i;
  });
}

// ---- stepping
// ------------------------------------------------------------------------

flashopt_status flashopt_step(flashopt_optimizer opt) {
  return guard("flashopt_step", [&] {
    Locked o(opt);
    std::vector<int64_t> all(o->params.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = int64_t(i);
    checkStepReady(*o, all);
    if (o->dp) {
      // Data parallel: the ranks agree on the step (policy, clipping,
      // hyper-parameters, counter) and on skipping it; then the gradients
      // are averaged.
      flashopt::dist::DataParallel::StepView view;
      view.skip_policy = o->policy == FLASHOPT_NONFINITE_SKIP;
      view.finite = !view.skip_policy || gradsFinite(*o, all);
      view.max_grad_norm = o->maxGradNorm;
      view.hyper_hash = hashFloats(o->opt->hyper_table());
      view.step = o->globalStep;
      Expected<bool> skip = o->dp->agree(view);
      if (!skip) {
        o->dp->step_done();
        fail(skip.error().find("disagree") != std::string::npos
                 ? FLASHOPT_ERROR_MISMATCH
                 : FLASHOPT_ERROR_COMM,
             skip.error());
      }
      if (*skip) {
        o->dp->step_done();
        ++o->skipped;
        return;
      }
      Status r = o->dp->reduce_remaining(*o->opt);
      o->dp->step_done();
      if (!r)
        fail(FLASHOPT_ERROR_COMM, r.message());
    } else if (o->policy == FLASHOPT_NONFINITE_SKIP && !gradsFinite(*o, all)) {
      ++o->skipped;
      return;
    }
    // Clipping folds its factor into grad_scale for this step only.
    std::vector<float> saved = applyClipping(*o);
    // One kernel call per distinct step counter (one when all are equal).
    std::map<int64_t, std::vector<int64_t>> byStep;
    for (size_t i = 0; i < o->params.size(); ++i)
      byStep[o->params[i].step].push_back(int64_t(i));
    for (const auto &kv : byStep) {
      Status s = o->opt->step_tensors(kv.second, kv.first + 1);
      if (!s) {
        restoreGradScales(*o, saved);
        stepFailure(*o, s);
      }
    }
    restoreGradScales(*o, saved);
    for (ParamRec &p : o->params)
      ++p.step;
    ++o->globalStep;
    o->opt->set_step_count(o->globalStep);
  });
}

flashopt_status flashopt_step_param(flashopt_optimizer opt, int64_t index) {
  return guard("flashopt_step_param", [&] {
    Locked o(opt);
    checkIndex(*o, index);
    if (o->maxGradNorm > 0.0)
      fail(FLASHOPT_ERROR_STATE,
           o->describe(index) + ": gradient release is not possible with "
                                "gradient-norm clipping (it needs every "
                                "gradient first)");
    if (o->dp)
      fail(FLASHOPT_ERROR_STATE,
           o->describe(index) + ": gradient release is not possible with "
                                "replicated data parallelism (the gradients "
                                "are averaged over the ranks in flashopt_step)");
    std::vector<int64_t> one{index};
    checkStepReady(*o, one);
    if (o->policy == FLASHOPT_NONFINITE_SKIP && !gradsFinite(*o, one)) {
      ++o->skipped;
      return;
    }
    ParamRec &p = o->params[size_t(index)];
    Status s = o->opt->step_tensors(one, p.step + 1);
    if (!s)
      stepFailure(*o, s);
    ++p.step;
  });
}

flashopt_status flashopt_set_max_grad_norm(flashopt_optimizer opt,
                                           double max_norm) {
  return guard("flashopt_set_max_grad_norm", [&] {
    Locked o(opt);
    if (!std::isfinite(max_norm) || max_norm < 0.0)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "max_norm must be finite and >= 0 (0 turns clipping off), got " +
               fmt(max_norm));
    if (max_norm > 0.0 && o->isGpu())
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           "gradient-norm clipping is not supported on CUDA contexts yet (it "
           "needs a device-side reduction)");
    if (max_norm > 0.0 &&
        o->m->hyper_index(flashopt::abi::kGradScaleHyper) < 0)
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           o->m->name + " has no \"grad_scale\" hyper-parameter (a bundle "
                        "from an older flashopt-gen): regenerate it");
    o->maxGradNorm = max_norm;
    if (max_norm == 0.0)
      o->lastGradNorm = -1.0;
  });
}

flashopt_status flashopt_get_grad_norm(flashopt_optimizer opt, double *out) {
  return guard("flashopt_get_grad_norm", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->lastGradNorm;
  });
}

flashopt_status flashopt_get_step(flashopt_optimizer opt, int64_t index,
                                  int64_t *out) {
  return guard("flashopt_get_step", [&] {
    needOut(out, "out");
    Locked o(opt);
    if (index == -1) {
      *out = o->globalStep;
      return;
    }
    checkIndex(*o, index);
    *out = o->params[size_t(index)].step;
  });
}

flashopt_status
flashopt_set_nonfinite_policy(flashopt_optimizer opt,
                              flashopt_nonfinite_policy policy) {
  return guard("flashopt_set_nonfinite_policy", [&] {
    Locked o(opt);
    if (policy != FLASHOPT_NONFINITE_PROPAGATE &&
        policy != FLASHOPT_NONFINITE_SKIP)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "unknown policy " + std::to_string(int(policy)));
    if (policy == FLASHOPT_NONFINITE_SKIP && o->isGpu())
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           "FLASHOPT_NONFINITE_SKIP is not supported on CUDA contexts yet "
           "(it needs a device-side gradient scan)");
    o->policy = policy;
  });
}

flashopt_status flashopt_get_skipped_steps(flashopt_optimizer opt,
                                           int64_t *out) {
  return guard("flashopt_get_skipped_steps", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->skipped;
  });
}

flashopt_status flashopt_synchronize(flashopt_optimizer opt) {
  return guard("flashopt_synchronize", [&] {
    Locked o(opt);
    Status s = o->opt->synchronize();
    if (!s)
      fail(o->deviceError(), s.message());
  });
}

// ---- memory report
// ------------------------------------------------------------------

flashopt_status flashopt_memory_report_get(flashopt_optimizer opt,
                                           flashopt_memory_report *out) {
  return guard("flashopt_memory_report_get", [&] {
    needOut(out, "out");
    Locked o(opt);
    BytesReport b = o->opt->bytes();
    flashopt_memory_report r{};
    r.numel = b.numel;
    r.param_bytes = b.param;
    r.correction_bytes = b.correction;
    r.grad_bytes = b.grad;
    r.state_bytes = b.states;
    r.total_bytes = b.total;
    r.total_bytes_with_grad_release = b.total_with_grad_release;
    r.allocated_bytes = b.runtime_allocated;
    r.bytes_per_param = b.numel ? double(b.total) / double(b.numel) : 0.0;
    r.bytes_per_param_with_grad_release =
        b.numel ? double(b.total_with_grad_release) / double(b.numel) : 0.0;
    *out = r;
  });
}

// ---- master weights and numerics
// ---------------------------------------------------

namespace {
/// Fails unless `index` is a parameter of `numel` elements.
void checkNumel(const OptObj &o, int64_t index, int64_t numel) {
  checkIndex(o, index);
  if (numel != o.params[size_t(index)].numel)
    fail(FLASHOPT_ERROR_SIZE, o.describe(index) + ": numel " +
                                  std::to_string(numel) + ", but it has " +
                                  std::to_string(o.params[size_t(index)].numel));
}
} // namespace

flashopt_status flashopt_export_master_f32(flashopt_optimizer opt,
                                           int64_t index, float *out,
                                           int64_t numel) {
  return guard("flashopt_export_master_f32", [&] {
    needOut(out, "out");
    Locked o(opt);
    checkNumel(*o, index, numel);
    std::vector<float> v = exportMaster(*o, index);
    std::memcpy(out, v.data(), v.size() * sizeof(float));
  });
}

flashopt_status flashopt_import_master_f32(flashopt_optimizer opt,
                                           int64_t index, const float *in,
                                           int64_t numel) {
  return guard("flashopt_import_master_f32", [&] {
    needOut(in, "in");
    Locked o(opt);
    checkNumel(*o, index, numel);
    checkMasterFits(*o, index, in, FLASHOPT_ERROR_INVALID_ARGUMENT,
                    "flashopt_import_master_f32");
    importMaster(*o, index, in);
  });
}

flashopt_status flashopt_check_numerics(flashopt_optimizer opt,
                                        flashopt_numerics_report *out) {
  return guard("flashopt_check_numerics", [&] {
    Locked o(opt);
    const Manifest &m = *o->m;
    flashopt_numerics_report r{};
    r.first_param = -1;
    r.first_group = -1;
    // numerics.md §4.3: bits of the master weight, mantissa bits M that
    // survive, the step needed to move max|w|, and the step lr * k gives.
    int bits = 8 * (dtype_size(m.param) +
                    (m.correction ? dtype_size(*m.correction) : 0));
    double M = double(bits - 1 - exponentBits(m.param)) + std::log2(0.49);
    double k = (m.rule == "adam" || m.rule == "adamw") ? 0.1 : 1.0;
    int lrIndex = m.hyper_index("lr");
    std::string firstNonfinite, firstSmall;
    for (size_t i = 0; i < o->params.size(); ++i) {
      ++r.params_checked;
      std::vector<float> w = exportMaster(*o, int64_t(i));
      double maxabs = 0;
      bool finite = true;
      for (float x : w) {
        if (!std::isfinite(x)) {
          finite = false;
          break;
        }
        maxabs = std::max(maxabs, double(std::fabs(x)));
      }
      if (!finite) {
        if (r.nonfinite_params++ == 0)
          firstNonfinite = o->describe(int64_t(i)) + " holds NaN or Inf";
        continue;
      }
      if (lrIndex < 0 || maxabs <= 0)
        continue;
      const ParamRec &p = o->params[i];
      double lr = double(
          o->opt->hyper_table()[size_t(p.group) * m.hypers.size() + size_t(lrIndex)]);
      if (lr <= 0)
        continue;
      double need = std::floor(std::log2(maxabs)) - M;
      double have = std::log2(lr * k);
      if (need > have) {
        if (r.params_too_small++ == 0) {
          r.first_param = int64_t(i);
          r.first_group = p.group;
          r.max_abs = maxabs;
          r.lr = lr;
          r.min_lr = std::exp2(need) / k;
          firstSmall =
              o->describe(int64_t(i)) + " in param group " +
              std::to_string(p.group) + ": lr " + fmt(lr) +
              " cannot move its largest weight (max |w| = " + fmt(maxabs) +
              ") with " + std::to_string(bits) +
              "-bit master weights; the smallest lr that does is " +
              fmt(r.min_lr);
        }
      }
    }
    if (out)
      *out = r;
    if (r.params_too_small || r.nonfinite_params) {
      std::string msg = !firstSmall.empty() ? firstSmall : firstNonfinite;
      if (r.params_too_small > 1)
        msg += " (and " + std::to_string(r.params_too_small - 1) +
               " more parameters)";
      if (!firstSmall.empty() && r.nonfinite_params)
        msg += "; " + firstNonfinite;
      fail(FLASHOPT_ERROR_NUMERICS, msg);
    }
  });
}

// ---- checkpoints
// ----------------------------------------------------------------------

flashopt_status flashopt_save_checkpoint(flashopt_optimizer opt,
                                         const char *path,
                                         flashopt_checkpoint_format format) {
  return guard("flashopt_save_checkpoint", [&] {
    needOut(path, "path");
    if (format != FLASHOPT_CHECKPOINT_COMPRESSED &&
        format != FLASHOPT_CHECKPOINT_F32)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "unknown checkpoint format " + std::to_string(int(format)));
    Locked o(opt);
    saveCheckpoint(*o, path, format);
  });
}

flashopt_status flashopt_load_checkpoint(flashopt_optimizer opt,
                                         const char *path) {
  return guard("flashopt_load_checkpoint", [&] {
    needOut(path, "path");
    Locked o(opt);
    loadCheckpoint(*o, path);
  });
}

} // extern "C"
