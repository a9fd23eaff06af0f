//===- Objects.h - The objects behind the C ABI's handles -------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A context (device, CPU threads, its optimizers) and an optimizer object
/// (one host::Optimizer, the train::Stepper that steps it, and what the C
/// ABI adds: parameter names and shapes, which are the names and shapes of
/// its checkpoints: checkpoint::TensorNames), with the small helpers every
/// entry point shares.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_OBJECTS_H
#define FLASHOPT_CAPI_OBJECTS_H

#include "Errors.h"
#include "checkpoint/Subject.h"
#include "dist/DataParallel.h"
#include "flashopt/flashopt.h"
#include "flashopt/host/CpuOptimizer.h"
#include "flashopt/host/CudaOptimizer.h"
#include "train/Stepper.h"

#include <cerrno>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace flashopt::capi {

using namespace flashopt::host;

inline std::string quote(const std::string &s) { return "'" + s + "'"; }

inline std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

inline std::string fmt(double v) {
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

// ---- dtypes (the table of abi/DTypes.def: FLASHOPT_<E> is DType::<E>) --

inline bool validDtype(int d) {
  switch (d) {
#define FLASHOPT_DTYPE(E, name, bits, st) case FLASHOPT_##E:
#include "flashopt/abi/DTypes.def"
    return true;
  }
  return false;
}

inline DType toHost(flashopt_dtype d) {
  switch (d) {
#define FLASHOPT_DTYPE(E, name, bits, st)                                      \
  case FLASHOPT_##E:                                                           \
    return DType::E;
#include "flashopt/abi/DTypes.def"
  }
  return DType::F32;
}

inline flashopt_dtype toC(DType d) {
  switch (d) {
#define FLASHOPT_DTYPE(E, name, bits, st)                                      \
  case DType::E:                                                               \
    return FLASHOPT_##E;
#include "flashopt/abi/DTypes.def"
  }
  return FLASHOPT_F32;
}

inline std::string dtypeText(int d) {
  if (validDtype(d))
    return dtype_name(toHost(flashopt_dtype(d)));
  return "dtype " + std::to_string(d) + " (not a flashopt_dtype)";
}

// ---- objects --------------------------------------------------------------

struct OptObj;

struct ContextObj {
  flashopt_device_type type = FLASHOPT_DEVICE_CPU;
  int device = 0;
  int threads = 0;
  std::shared_ptr<CudaContext> cuda;
  std::mutex mu; ///< guards threads and opts
  std::vector<std::weak_ptr<OptObj>> opts;
};

struct ParamRec {
  std::string name;
  int64_t numel = 0;
  int32_t group = 0;
  std::vector<int64_t> shape;
  uintptr_t param = 0;
  int64_t paramBytes = 0;
  /// Registered by flashopt_add_param_piece: its addresses need only the
  /// alignment the backend's kernels need.
  bool piece = false;
};

/// The names and shapes of its parameters are those of its checkpoints.
struct OptObj final : checkpoint::TensorNames {
  std::mutex mu; ///< held by every call on the optimizer
  std::shared_ptr<ContextObj> ctx;
  /// The one optimizer (CPU or CUDA backend under the same core).
  std::unique_ptr<host::Optimizer> opt;
  /// `opt` as a CPU optimizer (its threads), or null on a CUDA context.
  host::CpuOptimizer *cpu = nullptr;
  const Manifest *m = nullptr;
  std::deque<ParamRec> params; ///< a deque: name and shape pointers stay put
  std::map<std::string, int64_t> byName;
  /// Every checkpoint tensor name of every parameter -> its parameter.
  std::map<std::string, int64_t> tensorNames;
  /// The step, its counters and policy, data parallelism (over `opt`).
  std::unique_ptr<train::Stepper> stepper;

  /// The attached data parallelism, or null.
  dist::DataParallel *dp() const { return stepper->data_parallel(); }
  /// Fails with `s`'s status (its code) and message.
  void check(const Status &s) const {
    if (!s)
      fail(s);
  }

  std::string describe(int64_t i) const {
    return "parameter " + quote(params[size_t(i)].name) + " (index " +
           std::to_string(i) + ")";
  }

  /// What the checkpoint module (checkpoint/) saves and loads: `opt`,
  /// `stepper` and these names.
  checkpoint::Subject subject() { return {*stepper, *this}; }
  /// `e`'s value, or fails with its status.
  template <typename T> T take(Expected<T> e) const {
    if (!e)
      fail(e.status());
    return std::move(e.value());
  }

  /// The host bytes of buffer `name` of parameter `i`.
  /// Sharded data parallelism: a correction or state buffer is gathered
  /// from its owners, a collective every rank must call in the same order.
  std::vector<uint8_t> read(int64_t i, const std::string &name) {
    return take(subject().read(i, name));
  }
  /// Overwrites buffer `name` of parameter `i` with `bytes` host bytes.
  void write(int64_t i, const std::string &name, const void *data,
             int64_t bytes) {
    check(subject().write(i, name, data, bytes));
  }

  // ---- checkpoint::TensorNames ----
  int64_t size() const override { return int64_t(params.size()); }
  const std::string &name(int64_t i) const override {
    return params[size_t(i)].name;
  }
  const std::vector<int64_t> &shape(int64_t i) const override {
    return params[size_t(i)].shape;
  }
  int64_t find(const std::string &name) const override {
    auto it = byName.find(name);
    return it == byName.end() ? -1 : it->second;
  }
};

// ---- argument checks ------------------------------------------------------

template <typename T> void needOut(T *p, const char *what) {
  if (!p)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

inline void checkIndex(const OptObj &o, int64_t i) {
  if (i < 0 || i >= int64_t(o.params.size()))
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "parameter index " + std::to_string(i) + " is out of range (" +
             std::to_string(o.params.size()) + " registered)");
}

inline void checkGroup(const OptObj &o, int32_t g) {
  if (g < 0 || g >= o.opt->num_param_groups())
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "param group " + std::to_string(g) + " does not exist (there are " +
             std::to_string(o.opt->num_param_groups()) + ")");
}

inline bool fileExists(const std::string &path, int *err) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0)
    return true;
  *err = errno;
  return false;
}

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_OBJECTS_H
