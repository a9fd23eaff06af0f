//===- CApi.cpp - The libflashopt C ABI -----------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt.h's entry points over the internal C++ layer: each runs in
/// guard() (capi/Errors.h), looks up its handle (capi/Handles.h) and calls
/// the context's optimizer (one host::Optimizer, CPU or CUDA backend) or
/// the train::Stepper that steps it. This file: errors and versions,
/// contexts, optimizers, param groups and hyper-parameters, parameters and
/// gradients. Stepping is in capi/StepApi.cpp and capi/AccumulateApi.cpp,
/// the optimizer's state (master weights, numerics, checkpoints) in
/// capi/StateApi.cpp, communicators in capi/Comm.cpp; parameters
/// (capi/Params.cpp) and DLPack (capi/DLPack.cpp) have their own files,
/// checkpoints and master weights their own room (checkpoint/).
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "Bundles.h"
#include "DLPack.h"
#include "Errors.h"
#include "Handles.h"
#include "Objects.h"
#include "Params.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

using namespace flashopt::capi;

//===----------------------------------------------------------------------===//
// The C ABI
//===----------------------------------------------------------------------===//

extern "C" {

const char *flashopt_last_error(void) { return last_error().c_str(); }

void flashopt_internal_set_last_error(const char *message) {
  try {
    last_error() = message ? message : "";
  } catch (...) { // out of memory: the message is lost, nothing else
  }
}

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
  if (!validDtype(dtype) || dtype_is_packed(toHost(dtype)))
    return 0; // the packed 4-bit codes have no whole bytes per element
  return size_t(dtype_bits(toHost(dtype)) / 8);
}

size_t flashopt_dtype_bits(flashopt_dtype dtype) {
  if (!validDtype(dtype))
    return 0;
  return size_t(dtype_bits(toHost(dtype)));
}

// ---- contexts --------------------------------------------------------------

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
        fail(cc.status(),
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
           "threads must be in [0, " +
               std::to_string(flashopt::host::kMaxCpuThreads) +
               "] (0 = all hardware threads), got " + std::to_string(threads));
    std::lock_guard<std::mutex> lock(c->mu);
    c->threads = threads;
    for (const std::weak_ptr<OptObj> &w : c->opts)
      if (std::shared_ptr<OptObj> o = w.lock()) {
        std::lock_guard<std::mutex> olock(o->mu);
        o->check(o->cpu->set_threads(threads));
      }
  });
}

flashopt_status flashopt_context_destroy(flashopt_context ctx) {
  return guard("flashopt_context_destroy", [&] {
    // Released here, outside the registry lock.
    std::shared_ptr<ContextObj> c = getContext(ctx, /*take=*/true);
  });
}

// ---- optimizers ------------------------------------------------------------

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

namespace {
void copyField(char *dst, size_t cap, const std::string &s, const char *what,
               const std::string &where) {
  if (s.size() >= cap)
    fail(FLASHOPT_ERROR_FORMAT, where + ": " + what + " " + quote(s) +
                                    " is longer than " +
                                    std::to_string(cap - 1) + " bytes");
  std::memcpy(dst, s.c_str(), s.size() + 1);
}
} // namespace

flashopt_status flashopt_describe_bundle(const char *bundle_dir,
                                         flashopt_bundle_desc *out) {
  return guard("flashopt_describe_bundle", [&] {
    needOut(bundle_dir, "bundle_dir");
    needOut(out, "out");
    const std::string path = std::string(bundle_dir) + "/manifest.json";
    Expected<Manifest> m = flashopt::abi::load_manifest(path);
    if (!m)
      bundleFailure(bundle_dir, m.status());
    flashopt_bundle_desc d{};
    copyField(d.name, sizeof d.name, m->name, "name", path);
    copyField(d.rule, sizeof d.rule, m->rule, "rule", path);
    copyField(d.arithmetic, sizeof d.arithmetic, m->arithmetic, "arithmetic",
              path);
    copyField(d.numerics, sizeof d.numerics, m->numerics, "numerics", path);
    d.param_dtype = toC(m->param);
    d.has_correction = m->correction ? 1 : 0;
    d.correction_dtype = m->correction ? toC(*m->correction) : FLASHOPT_I8;
    for (const StateSpec &s : m->states) {
      d.quantized_states += s.kind == StateKind::Quantized;
      d.plain_states += s.kind == StateKind::Plain;
      if (s.kind == StateKind::Quantized)
        d.state_bits = std::max(d.state_bits, int32_t(dtype_bits(s.storage)));
    }
    *out = d;
  });
}

flashopt_status flashopt_num_buffers(flashopt_optimizer opt, int32_t *out) {
  return guard("flashopt_num_buffers", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = int32_t(ownedBuffers(*o->m).size());
  });
}

flashopt_status flashopt_get_buffer_desc(flashopt_optimizer opt, int32_t index,
                                         flashopt_buffer_desc *out) {
  return guard("flashopt_get_buffer_desc", [&] {
    needOut(out, "out");
    Locked o(opt);
    std::vector<const flashopt::abi::BufferSpec *> bs = ownedBuffers(*o->m);
    if (index < 0 || index >= int32_t(bs.size()))
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "buffer index " + std::to_string(index) + " is out of range (" +
               o->m->name + " has " + std::to_string(bs.size()) + ")");
    out->name = bs[size_t(index)]->name.c_str();
    out->per_group = bs[size_t(index)]->per == Per::Group ? 1 : 0;
    out->dtype = toC(bs[size_t(index)]->dtype);
  });
}

flashopt_status flashopt_state_name(flashopt_optimizer opt, int32_t index,
                                    const char **out) {
  return guard("flashopt_state_name", [&] {
    needOut(out, "out");
    Locked o(opt);
    int32_t k = 0;
    for (const StateSpec &s : o->m->states) {
      if (flashopt::abi::state_buffers(s).empty())
        continue;
      if (k++ == index) {
        *out = s.name.c_str();
        return;
      }
    }
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "state index " + std::to_string(index) + " is out of range (" +
             o->m->name + " stores " + std::to_string(k) + " states)");
  });
}

// ---- param groups and hyper-parameters -------------------------------------

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
        fail(s, "param group " + std::to_string(g) + ": " + s.message());
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
      fail(v.status());
    *out = double(*v);
  });
}

// ---- parameters and gradients ----------------------------------------------

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

flashopt_status flashopt_add_param_piece(
    flashopt_optimizer opt, int32_t group, const char *name, void *param,
    flashopt_dtype param_dtype, int64_t numel, const void *grad,
    flashopt_dtype grad_dtype, int64_t element_offset, int64_t *out_index) {
  return guard("flashopt_add_param_piece", [&] {
    Locked o(opt);
    if (element_offset < 0)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT, "the element offset is negative (" +
                                                std::to_string(element_offset) +
                                                ")");
    addParam(*o, group, name, param, param_dtype, numel, grad, grad_dtype, {},
             out_index, element_offset);
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
    i.step = o->stepper->tensor_step(index);
    *out = i;
  });
}

} // extern "C"
