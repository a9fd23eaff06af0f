//===- Objects.h - The objects behind the C ABI's handles ------------------*-
//C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A context (device, CPU threads, its optimizers) and an optimizer object
/// (one host::Optimizer plus what the C ABI adds: parameter names, shapes
/// and per-parameter step counters, the non-finite policy), with the small
/// helpers every entry point shares.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_OBJECTS_H
#define FLASHOPT_CAPI_OBJECTS_H

#include "Errors.h"
#include "dist/DataParallel.h"
#include "flashopt/flashopt.h"
#include "flashopt/host/CpuOptimizer.h"
#include "flashopt/host/CudaOptimizer.h"

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

// ---- dtypes ---------------------------------------------------------------

inline bool validDtype(int d) {
  return d >= FLASHOPT_BF16 && d <= FLASHOPT_I16;
}

inline DType toHost(flashopt_dtype d) {
  switch (d) {
  case FLASHOPT_BF16:
    return DType::BF16;
  case FLASHOPT_F16:
    return DType::F16;
  case FLASHOPT_F32:
    return DType::F32;
  case FLASHOPT_I8:
    return DType::I8;
  case FLASHOPT_U8:
    return DType::U8;
  case FLASHOPT_I16:
    return DType::I16;
  }
  return DType::F32;
}

inline flashopt_dtype toC(DType d) {
  switch (d) {
  case DType::BF16:
    return FLASHOPT_BF16;
  case DType::F16:
    return FLASHOPT_F16;
  case DType::F32:
    return FLASHOPT_F32;
  case DType::I8:
    return FLASHOPT_I8;
  case DType::U8:
    return FLASHOPT_U8;
  case DType::I16:
    return FLASHOPT_I16;
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
  int64_t step = 0;
  /// Micro-batches added to the accumulator since the last step.
  int64_t accumulated = 0;
  uintptr_t param = 0;
  int64_t paramBytes = 0;
  /// Registered by flashopt_add_param_piece: its addresses need only the
  /// alignment the backend's kernels need.
  bool piece = false;
};

struct OptObj {
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
  int64_t globalStep = 0, skipped = 0;
  flashopt_nonfinite_policy policy = FLASHOPT_NONFINITE_PROPAGATE;
  /// Gradient-norm clipping (0: off) and the last norm computed (-1: none).
  double maxGradNorm = 0.0, lastGradNorm = -1.0;
  /// Gradient accumulation: what the accumulated gradient is divided by
  /// (0: the number of micro-batches).
  double accumNormalizer = 0.0;
  /// Replicated data parallelism, once a communicator is attached.
  std::unique_ptr<dist::DataParallel> dp;

  bool isGpu() const { return cpu == nullptr; }
  /// The status for a failure of the device (CUDA) or the library (CPU).
  flashopt_status deviceError() const {
    return isGpu() ? FLASHOPT_ERROR_CUDA : FLASHOPT_ERROR_INTERNAL;
  }

  std::string describe(int64_t i) const {
    return "parameter " + quote(params[size_t(i)].name) + " (index " +
           std::to_string(i) + ")";
  }

  /// The host bytes of buffer `name` of parameter `i`.
  /// Sharded data parallelism: a correction or state buffer is gathered
  /// from its owners, a collective every rank must call in the same order.
  std::vector<uint8_t> read(int64_t i, const std::string &name) {
    Expected<std::vector<uint8_t>> d =
        dp && dp->sharded() ? dp->gather_buffer(*opt, i, name)
                            : opt->read_buffer(i, name);
    if (!d)
      fail(deviceError(), describe(i) + ": " + d.error());
    return std::move(d.value());
  }
  /// Overwrites buffer `name` of parameter `i` with `bytes` host bytes.
  void write(int64_t i, const std::string &name, const void *data,
             int64_t bytes) {
    Status s = dp && dp->sharded() ? dp->scatter_buffer(*opt, i, name, data, bytes)
                                   : opt->write_buffer(i, name, data, bytes);
    if (!s)
      fail(deviceError(), describe(i) + ": " + s.message());
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
