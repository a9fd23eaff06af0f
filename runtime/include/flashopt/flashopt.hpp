//===- flashopt.hpp - C++ RAII wrapper over the libflashopt C ABI -*- C++
//-*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A thin, header-only C++17 layer over flashopt.h (and only flashopt.h):
/// owning handles that destroy themselves, and exceptions instead of status
/// codes. Every method maps to one C function; a failed call throws
/// flashopt::Error carrying the status and flashopt_last_error().
///
///   flashopt::Context ctx = flashopt::Context::cpu();
///   flashopt::Optimizer opt(ctx, "build/kernels/adamw_bf16_m24");
///   opt.set_hyper("lr", 1e-3);                 // every param group
///   int64_t w = opt.add_param("fc1.weight", w_ptr, FLASHOPT_BF16, n,
///                             g_ptr, FLASHOPT_BF16);
///   for (...) { backward(); opt.step(); }
///   opt.save_checkpoint("ckpt.safetensors");
///
/// Typed pointers: add_param / set_grad also take `T *` for T = float,
/// int8_t, uint8_t, int16_t, flashopt::bf16 and flashopt::f16 (16-bit
/// storage wrappers), deducing the dtype; specialize flashopt::dtype_of for
/// your own 16-bit types.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HPP
#define FLASHOPT_HPP

#include "flashopt/flashopt.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace flashopt {

/// A failed call: the status and flashopt_last_error()'s message.
class Error : public std::runtime_error {
public:
  Error(flashopt_status status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  flashopt_status status() const noexcept { return status_; }
  /// "FLASHOPT_ERROR_DTYPE", ...
  const char *status_name() const noexcept {
    return flashopt_status_name(status_);
  }

private:
  flashopt_status status_;
};

namespace detail {
/// Throws Error when `s` is not FLASHOPT_OK.
inline void check(flashopt_status s) {
  if (s == FLASHOPT_OK)
    return;
  const char *msg = flashopt_last_error();
  std::string text = flashopt_status_name(s);
  if (msg && *msg)
    text += std::string(": ") + msg;
  throw Error(s, text);
}

/// Enabled for DLPack's DLTensor (detected by its members, so that this
/// header needs no <dlpack/dlpack.h>).
template <typename T>
using enable_if_dltensor =
    decltype((void)std::declval<const T &>().data,
             (void)std::declval<const T &>().device.device_type,
             (void)std::declval<const T &>().dtype.lanes,
             (void)std::declval<const T &>().ndim,
             (void)std::declval<const T &>().byte_offset);
/// T in a non-deduced context (so that nullptr binds to `const T *`).
template <typename T> struct same { using type = T; };
template <typename T> using same_t = typename same<T>::type;
} // namespace detail

/// 16-bit storage types (the raw bits; no arithmetic).
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

/// The flashopt dtype of element type T (specialize for your own types).
template <typename T> struct dtype_of;
template <> struct dtype_of<float> {
  static constexpr flashopt_dtype value = FLASHOPT_F32;
};
template <> struct dtype_of<int8_t> {
  static constexpr flashopt_dtype value = FLASHOPT_I8;
};
template <> struct dtype_of<uint8_t> {
  static constexpr flashopt_dtype value = FLASHOPT_U8;
};
template <> struct dtype_of<int16_t> {
  static constexpr flashopt_dtype value = FLASHOPT_I16;
};
template <> struct dtype_of<bf16> {
  static constexpr flashopt_dtype value = FLASHOPT_BF16;
};
template <> struct dtype_of<f16> {
  static constexpr flashopt_dtype value = FLASHOPT_F16;
};
template <typename T> struct dtype_of<const T> : dtype_of<T> {};

inline const char *version() { return flashopt_version(); }
inline int abi_version() { return flashopt_abi_version(); }

//===----------------------------------------------------------------------===//
// Context
//===----------------------------------------------------------------------===//

/// A device: the CPU (a thread pool) or CUDA device n. Movable, not
/// copyable; destroying it releases the handle (optimizers created on it
/// keep the device alive).
class Context {
public:
  /// An empty context (no handle).
  Context() = default;
  /// A CPU context using `threads` threads (0 = every hardware thread).
  static Context cpu(int threads = 0) {
    Context c(FLASHOPT_DEVICE_CPU, 0);
    if (threads != 0)
      c.set_threads(threads);
    return c;
  }
  /// CUDA device `device` (throws FLASHOPT_ERROR_DEVICE without a driver).
  static Context cuda(int device = 0) {
    return Context(FLASHOPT_DEVICE_CUDA, device);
  }
  Context(flashopt_device_type type, int device_id) {
    detail::check(flashopt_context_create(type, device_id, &h_));
  }
  ~Context() { reset(); }
  Context(const Context &) = delete;
  Context &operator=(const Context &) = delete;
  Context(Context &&o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  Context &operator=(Context &&o) noexcept {
    if (this != &o) {
      reset();
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }

  /// CPU only: the threads a step uses (0 = all hardware threads).
  void set_threads(int threads) {
    detail::check(flashopt_context_set_threads(h_, threads));
  }
  flashopt_context get() const noexcept { return h_; }
  explicit operator bool() const noexcept { return h_ != nullptr; }
  /// Gives up ownership of the handle.
  flashopt_context release() noexcept {
    flashopt_context h = h_;
    h_ = nullptr;
    return h;
  }
  /// Destroys the handle now (no-op when empty).
  void reset() noexcept {
    if (h_)
      flashopt_context_destroy(h_);
    h_ = nullptr;
  }

private:
  flashopt_context h_ = nullptr;
};

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

/// One bundle on one context. Movable, not copyable.
class Optimizer {
public:
  /// An empty optimizer (no handle).
  Optimizer() = default;
  /// From the bundle directory `bundle_dir` (holding manifest.json).
  Optimizer(const Context &ctx, const std::string &bundle_dir) {
    detail::check(
        flashopt_optimizer_create(ctx.get(), bundle_dir.c_str(), &h_));
  }
  /// From a bundle embedded in the program.
  Optimizer(const Context &ctx, const flashopt_embedded_bundle &bundle) {
    detail::check(flashopt_optimizer_create_embedded(ctx.get(), &bundle, &h_));
  }
  ~Optimizer() { reset(); }
  Optimizer(const Optimizer &) = delete;
  Optimizer &operator=(const Optimizer &) = delete;
  Optimizer(Optimizer &&o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  Optimizer &operator=(Optimizer &&o) noexcept {
    if (this != &o) {
      reset();
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }

  flashopt_optimizer get() const noexcept { return h_; }
  explicit operator bool() const noexcept { return h_ != nullptr; }
  flashopt_optimizer release() noexcept {
    flashopt_optimizer h = h_;
    h_ = nullptr;
    return h;
  }
  void reset() noexcept {
    if (h_)
      flashopt_optimizer_destroy(h_);
    h_ = nullptr;
  }

  // ---- description -------------------------------------------------------
  /// Spec name, rule, dtypes, group size, ... (strings live as long as the
  /// optimizer).
  flashopt_optimizer_info info() const {
    flashopt_optimizer_info i{};
    detail::check(flashopt_optimizer_get_info(h_, &i));
    return i;
  }
  /// The hyper-parameter names, in the manifest's order.
  std::vector<std::string> hyper_names() const {
    std::vector<std::string> out;
    flashopt_optimizer_info i = info();
    for (int32_t k = 0; k < i.num_hypers; ++k) {
      const char *n = nullptr;
      detail::check(flashopt_hyper_name(h_, k, &n));
      out.emplace_back(n);
    }
    return out;
  }
  /// The stored states' names (elided ones left out), in the manifest's
  /// order.
  std::vector<std::string> state_names() const {
    std::vector<std::string> out;
    flashopt_optimizer_info i = info();
    for (int32_t k = 0; k < i.num_states; ++k) {
      const char *n = nullptr;
      detail::check(flashopt_state_name(h_, k, &n));
      out.emplace_back(n);
    }
    return out;
  }

  // ---- param groups and hyper-parameters ---------------------------------
  /// Adds a param group with the manifest's defaults; returns its index.
  int32_t add_param_group() {
    int32_t g = -1;
    detail::check(flashopt_add_param_group(h_, &g));
    return g;
  }
  int32_t num_param_groups() const {
    int32_t n = 0;
    detail::check(flashopt_num_param_groups(h_, &n));
    return n;
  }
  /// Sets `name` of param group `group` (-1: every group).
  void set_hyper(int32_t group, const std::string &name, double value) {
    detail::check(flashopt_set_hyper(h_, group, name.c_str(), value));
  }
  /// Sets `name` in every param group.
  void set_hyper(const std::string &name, double value) {
    set_hyper(-1, name, value);
  }
  double get_hyper(int32_t group, const std::string &name) const {
    double v = 0;
    detail::check(flashopt_get_hyper(h_, group, name.c_str(), &v));
    return v;
  }
  double get_hyper(const std::string &name) const { return get_hyper(0, name); }

  // ---- parameters and gradients ------------------------------------------
  /// Registers `numel` elements at `param` (and its gradient `grad`, which
  /// may be null until the first step) in param group `group`; returns the
  /// parameter's index. An empty `name` means "p<index>".
  int64_t add_param(const std::string &name, void *param,
                    flashopt_dtype param_dtype, int64_t numel, const void *grad,
                    flashopt_dtype grad_dtype, int32_t group = 0) {
    int64_t idx = -1;
    detail::check(
        flashopt_add_param(h_, group, name.empty() ? nullptr : name.c_str(),
                           param, param_dtype, numel, grad, grad_dtype, &idx));
    return idx;
  }
  /// Same, the dtypes deduced from the pointer types.
  template <typename P, typename G>
  int64_t add_param(const std::string &name, P *param, int64_t numel,
                    const G *grad, int32_t group = 0) {
    return add_param(name, static_cast<void *>(param), dtype_of<P>::value,
                     numel, static_cast<const void *>(grad), dtype_of<G>::value,
                     group);
  }
  /// Same, the gradient set later (set_grad).
  template <typename P>
  int64_t add_param(const std::string &name, P *param, int64_t numel,
                    std::nullptr_t, int32_t group = 0) {
    return add_param(name, static_cast<void *>(param), dtype_of<P>::value,
                     numel, nullptr, info().grad_dtype, group);
  }
  /// Same, from DLPack tensors (`grad` may be null); the shape is kept for
  /// checkpoints. DLT is DLPack's DLTensor (this header does not include
  /// <dlpack/dlpack.h>; the overload exists for any type shaped like it).
  template <typename DLT, typename = detail::enable_if_dltensor<DLT>>
  int64_t add_param(const std::string &name, const DLT &param,
                    const detail::same_t<DLT> *grad, int32_t group = 0) {
    int64_t idx = -1;
    detail::check(flashopt_add_param_dlpack(
        h_, group, name.empty() ? nullptr : name.c_str(), &param, grad, &idx));
    return idx;
  }

  /// Re-points the gradient of parameter `index`.
  void set_grad(int64_t index, const void *grad, flashopt_dtype grad_dtype,
                int64_t numel) {
    detail::check(flashopt_set_grad(h_, index, grad, grad_dtype, numel));
  }
  template <typename G>
  void set_grad(int64_t index, const G *grad, int64_t numel) {
    set_grad(index, static_cast<const void *>(grad), dtype_of<G>::value, numel);
  }
  template <typename DLT, typename = detail::enable_if_dltensor<DLT>>
  void set_grad(int64_t index, const DLT &grad) {
    detail::check(flashopt_set_grad_dlpack(h_, index, &grad));
  }

  int64_t num_params() const {
    int64_t n = 0;
    detail::check(flashopt_num_params(h_, &n));
    return n;
  }
  /// The index of the parameter named `name` (throws NOT_FOUND).
  int64_t find_param(const std::string &name) const {
    int64_t idx = -1;
    detail::check(flashopt_find_param(h_, name.c_str(), &idx));
    return idx;
  }
  /// Name, numel, group, shape and step counter of parameter `index`.
  flashopt_param_info param_info(int64_t index) const {
    flashopt_param_info p{};
    detail::check(flashopt_get_param_info(h_, index, &p));
    return p;
  }

  // ---- stepping ----------------------------------------------------------
  /// Steps every parameter.
  void step() { detail::check(flashopt_step(h_)); }
  /// Steps parameter `index` only (gradient release).
  void step_param(int64_t index) {
    detail::check(flashopt_step_param(h_, index));
  }
  /// Parameter `index`'s step counter, or (-1) the number of completed
  /// flashopt_step calls.
  int64_t step_count(int64_t index = -1) const {
    int64_t t = 0;
    detail::check(flashopt_get_step(h_, index, &t));
    return t;
  }
  void set_nonfinite_policy(flashopt_nonfinite_policy policy) {
    detail::check(flashopt_set_nonfinite_policy(h_, policy));
  }
  int64_t skipped_steps() const {
    int64_t n = 0;
    detail::check(flashopt_get_skipped_steps(h_, &n));
    return n;
  }
  void synchronize() { detail::check(flashopt_synchronize(h_)); }

  // ---- memory, master weights, numerics ----------------------------------
  flashopt_memory_report memory_report() const {
    flashopt_memory_report r{};
    detail::check(flashopt_memory_report_get(h_, &r));
    return r;
  }
  /// The fp32 master weights of parameter `index`.
  std::vector<float> export_master_f32(int64_t index) const {
    std::vector<float> out(size_t(param_info(index).numel));
    detail::check(
        flashopt_export_master_f32(h_, index, out.data(), int64_t(out.size())));
    return out;
  }
  void export_master_f32(int64_t index, float *out, int64_t numel) const {
    detail::check(flashopt_export_master_f32(h_, index, out, numel));
  }
  void import_master_f32(int64_t index, const std::vector<float> &in) {
    detail::check(
        flashopt_import_master_f32(h_, index, in.data(), int64_t(in.size())));
  }
  void import_master_f32(int64_t index, const float *in, int64_t numel) {
    detail::check(flashopt_import_master_f32(h_, index, in, numel));
  }
  /// State `state` of parameter `index`, decoded to fp32.
  std::vector<float> export_state_f32(int64_t index,
                                      const std::string &state) const {
    std::vector<float> out(size_t(param_info(index).numel));
    detail::check(flashopt_export_state_f32(h_, index, state.c_str(),
                                            out.data(), int64_t(out.size())));
    return out;
  }
  /// Sets state `state` of parameter `index` from fp32 values (encoded).
  void import_state_f32(int64_t index, const std::string &state,
                        const std::vector<float> &in) {
    detail::check(flashopt_import_state_f32(h_, index, state.c_str(), in.data(),
                                            int64_t(in.size())));
  }
  /// Runs check_numerics. A numerics problem does not throw: it is in the
  /// report (params_too_small, nonfinite_params) and, when `message` is
  /// given, described there ("" when all is well). Other failures throw.
  flashopt_numerics_report
  check_numerics(std::string *message = nullptr) const {
    flashopt_numerics_report r{};
    flashopt_status s = flashopt_check_numerics(h_, &r);
    if (message)
      message->clear();
    if (s == FLASHOPT_ERROR_NUMERICS) {
      if (message)
        *message = flashopt_last_error();
      return r;
    }
    detail::check(s);
    return r;
  }

  // ---- checkpoints -------------------------------------------------------
  void save_checkpoint(const std::string &path,
                       flashopt_checkpoint_format format =
                           FLASHOPT_CHECKPOINT_COMPRESSED) const {
    detail::check(flashopt_save_checkpoint(h_, path.c_str(), format));
  }
  void load_checkpoint(const std::string &path) {
    detail::check(flashopt_load_checkpoint(h_, path.c_str()));
  }

private:
  flashopt_optimizer h_ = nullptr;
};

} // namespace flashopt

#endif // FLASHOPT_HPP
