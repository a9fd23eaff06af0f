//===- Harness.h - Host harness for flashopt CPU kernels --------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The host harness: the seed of libflashopt's CPU runtime. Plain C++17, no
/// MLIR or LLVM.
///
///  - `Manifest` / `load_manifest`: a bundle's manifest.json, parsed and
///    validated (every error names the file and the field).
///  - `Bundle::load`: picks the first CPU kernel of the manifest whose
///    features this host supports (or the one named by `LoadOptions::cpu` /
///    the FLASHOPT_CPU environment variable), dlopens it and resolves its
///    step symbol (docs/KERNEL-ABI.md).
///  - `Optimizer`: param groups (hyper-parameter slots), caller-owned params
///    and grads, runtime-owned correction and state buffers (one 64-byte
///    aligned arena per buffer, each tensor's slice starting at a 64-element
///    boundary, zero-initialized), the tensor and hyper tables, and `step()`
///    over a persistent thread pool in group-aligned chunks.
///
/// The manifest model, the hyper table (`HyperTable`), the tensor table
/// records (`append_table_records`, `split_records`) and the bytes report
/// are shared with the GPU runtime (Cuda.h).
///
/// No exception escapes the API: fallible calls return `Status` or
/// `Expected<T>`.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_HARNESS_H
#define FLASHOPT_HOST_HARNESS_H

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashopt::host {

//===----------------------------------------------------------------------===//
// Status and Expected
//===----------------------------------------------------------------------===//

/// Success, or an error message.
class [[nodiscard]] Status {
public:
  Status() = default;
  static Status success() { return Status(); }
  static Status error(std::string message) {
    Status s;
    s.failed_ = true;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  /// The error message ("" on success).
  const std::string &message() const { return message_; }

private:
  bool failed_ = false;
  std::string message_;
};

/// A value, or an error message.
template <typename T> class [[nodiscard]] Expected {
public:
  Expected(T value) : value_(std::move(value)) {}
  Expected(Status error) : error_(std::move(error)) {
    if (error_.ok()) // an Expected built from a success has no value: a bug
      error_ = Status::error("internal error: Expected built from success");
  }
  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  /// The value; only valid when ok().
  T &value() & { return *value_; }
  const T &value() const & { return *value_; }
  T &&value() && { return std::move(*value_); }
  T &operator*() & { return *value_; }
  const T &operator*() const & { return *value_; }
  T *operator->() { return &*value_; }
  const T *operator->() const { return &*value_; }
  /// The error (a success Status when ok()).
  const Status &status() const { return error_; }
  const std::string &error() const { return error_.message(); }

private:
  std::optional<T> value_;
  Status error_;
};

//===----------------------------------------------------------------------===//
// Dtypes
//===----------------------------------------------------------------------===//

enum class DType { BF16, F16, F32, I8, U8, I16 };

/// "bf16", "f16", "f32", "i8", "ui8", "i16".
const char *dtype_name(DType t);
/// Parses a manifest dtype name.
std::optional<DType> parse_dtype(std::string_view name);
/// Bytes per element.
int dtype_size(DType t);

//===----------------------------------------------------------------------===//
// Manifest
//===----------------------------------------------------------------------===//

struct HyperSpec {
  std::string name;
  /// The manifest's default; nullopt when the manifest says null, in which
  /// case every param group must set it before the first step.
  std::optional<float> default_value;
};

enum class StateKind { Quantized, Plain, Elided };

struct StateSpec {
  std::string name;
  StateKind kind = StateKind::Plain;
  DType storage = DType::F32; ///< codes (quantized) or values (plain)
  int64_t group = 0;          ///< quantized only
  std::string compand;        ///< quantized only: none / softsign / sqrt
  DType scale = DType::F32;   ///< quantized only
  /// The hyper-parameter that must stay 0 because this state is elided
  /// ("" if none).
  std::string elidable_if_zero;
};

enum class Per { Element, Group };

enum class BufferRole { Param, Correction, Grad, State };

struct BufferSpec {
  std::string name;
  DType dtype = DType::F32;
  Per per = Per::Element;
  bool writable = false;
  BufferRole role = BufferRole::State; ///< derived from the name and position
};

struct KernelEntry {
  std::string target; ///< "cpu", "sm_90", ...
  std::string cpu;    ///< CPU flavour ("x86-64-v3"); cpu targets only
  std::vector<std::string> features; ///< __builtin_cpu_supports spellings
  std::string file;   ///< relative to the bundle directory (GPU: the PTX)
  std::string symbol;
  // GPU targets only; each is optional in the manifest (0 / -1 / "" when
  // absent).
  std::string cubin;           ///< the chip's cubin, relative to the bundle
  int threads_per_block = 0;   ///< the block size the kernel was built for
  int elements_per_thread = 0; ///< elements one thread moves per group
  int registers = -1, spill_stores = -1, spill_loads = -1; ///< ptxas -v
};

/// Bytes per parameter by category, as the manifest states them (large
/// tensors: scales amortized over their group, no padding).
struct BytesPerParam {
  double param = 0, correction = 0, grad = 0, states = 0, total = 0,
         total_with_grad_release = 0;
};

struct Manifest {
  std::string path; ///< where it was read from ("" for a string)
  std::string format;
  int64_t format_version = 0;
  std::string generator, name, spec_hash, rule;
  int64_t group_size = 0;
  DType param = DType::F32;
  std::optional<DType> correction; ///< nullopt for "none"
  DType grad = DType::F32;
  std::vector<HyperSpec> hypers;
  std::vector<StateSpec> states;
  std::vector<BufferSpec> buffers; ///< ABI order
  int64_t header_words = 4, record_words = 0;
  BytesPerParam bytes_per_param;
  std::vector<KernelEntry> kernels; ///< every target, in manifest order

  /// Index in `hypers`, or -1.
  int hyper_index(std::string_view name) const;
  /// Index in `buffers`, or -1.
  int buffer_index(std::string_view name) const;
  /// Bytes per parameter recomputed from `buffers` and `group_size`.
  BytesPerParam computed_bytes_per_param() const;
};

/// Parses and validates a manifest. `origin` names the source in messages.
Expected<Manifest> parse_manifest(std::string_view json_text,
                                  const std::string &origin);
/// Reads and validates `path` (a manifest.json file).
Expected<Manifest> load_manifest(const std::string &path);

/// The index of buffer `name` in `m.buffers`, or an error listing the
/// buffers the manifest has.
Expected<int> find_buffer(const Manifest &m, std::string_view name);

//===----------------------------------------------------------------------===//
// Bundle
//===----------------------------------------------------------------------===//

using KernelFn = void (*)(const int64_t *table, int64_t ntensors,
                          const float *hypers, int64_t step,
                          int64_t group_begin, int64_t group_end);

/// Whether this host supports a CPU feature named as in the manifest
/// ("avx2", "fma", "f16c", "bmi2", "avx512f", ...). Unknown names: false.
bool host_supports_feature(std::string_view feature);

struct LoadOptions {
  /// Force this CPU flavour ("x86-64"); "" picks the best supported one.
  std::string cpu;
  /// When `cpu` is empty, honour the FLASHOPT_CPU environment variable.
  bool use_env = true;
};

/// A loaded bundle: its manifest and one dlopen'ed CPU kernel. Shared by the
/// optimizers created from it; the library is closed with the last one.
class Bundle {
public:
  /// Loads the bundle directory `dir` (holding manifest.json).
  static Expected<std::shared_ptr<Bundle>> load(const std::string &dir,
                                                const LoadOptions &opts = {});
  ~Bundle();
  Bundle(const Bundle &) = delete;
  Bundle &operator=(const Bundle &) = delete;

  const std::string &dir() const { return dir_; }
  const Manifest &manifest() const { return manifest_; }
  /// The kernel entry chosen.
  const KernelEntry &kernel() const { return manifest_.kernels[kernel_index_]; }
  /// Full path of the loaded shared object.
  const std::string &kernel_path() const { return kernel_path_; }
  KernelFn fn() const { return fn_; }
  /// Looks up another symbol of the loaded object (tests); nullptr if absent.
  void *symbol(const std::string &name) const;

private:
  Bundle() = default;
  std::string dir_;
  Manifest manifest_;
  size_t kernel_index_ = 0;
  std::string kernel_path_;
  void *handle_ = nullptr;
  KernelFn fn_ = nullptr;
};

/// The subdirectories of `dir` that hold a manifest.json (bundle names),
/// sorted; empty when `dir` cannot be read.
std::vector<std::string> list_bundles(const std::string &dir);

//===----------------------------------------------------------------------===//
// Optimizer options, tensors and reports
//===----------------------------------------------------------------------===//

struct OptimizerOptions {
  /// Threads taking part in a step (the calling thread included); 0 means
  /// std::thread::hardware_concurrency().
  int threads = 0;
  /// A step uses at most total_groups / min_groups_per_chunk threads (at
  /// least one); 0 means about 32768 elements' worth of groups.
  int64_t min_groups_per_chunk = 0;
};

/// One registered tensor.
struct TensorInfo {
  int64_t numel = 0;
  int64_t first_group = 0; ///< table word 1
  int64_t num_groups = 0;  ///< ceil(numel / G)
  int param_group = 0;     ///< hyper slot, table word 2
  void *param = nullptr;
  void *grad = nullptr;
};

/// A view of one buffer of one tensor.
struct BufferView {
  /// A host pointer (Optimizer) or a device address (CudaOptimizer).
  void *data = nullptr;
  DType dtype = DType::F32;
  Per per = Per::Element;
  int64_t count = 0; ///< elements (per-element) or groups (per-group)
  int64_t bytes = 0; ///< count * dtype_size
  bool runtime_owned = false;
};

/// A group range one kernel call covers.
struct Chunk {
  int64_t begin = 0, end = 0;
};

/// Exact memory, in bytes, by category, computed from the registered tensors
/// (per-group buffers count ceil(numel / G) entries). `per_param` divides by
/// `numel`; for large tensors it equals the manifest's bytes_per_param.
struct BytesReport {
  int64_t numel = 0;
  int64_t param = 0, correction = 0, grad = 0;
  int64_t states = 0; ///< every state buffer, scales included
  int64_t total = 0;  ///< param + correction + grad + states
  int64_t total_with_grad_release = 0; ///< total - grad
  /// Bytes the runtime actually allocated (correction and state arenas,
  /// 64-element alignment padding and spare capacity included).
  int64_t runtime_allocated = 0;
  BytesPerParam per_param;
};

//===----------------------------------------------------------------------===//
// Tables and reports shared by the CPU and GPU optimizers
//===----------------------------------------------------------------------===//

/// The hyper-parameter table of one optimizer: param groups (slots) of H
/// floats in the manifest's `hypers` order, slot-major (docs/KERNEL-ABI.md),
/// with the validation every back end applies.
class HyperTable {
public:
  /// Checks that every elided state's hyper-parameter defaults to 0 (or has
  /// no default).
  static Status check_manifest(const Manifest &m);
  /// An empty table (no slots) for `m`, which must outlive it.
  explicit HyperTable(const Manifest &m) : m_(&m) {}

  /// Adds a slot holding the manifest's defaults; returns it (-1 if memory
  /// ran out).
  int add_slot();
  int num_slots() const { return slots_; }
  /// Sets one value. Unknown names, bad slots, non-finite values and nonzero
  /// values of a hyper an elided state needs at 0 are rejected.
  Status set(int slot, std::string_view name, float value);
  /// Sets one value in every slot.
  Status set_all(std::string_view name, float value);
  Expected<float> get(int slot, std::string_view name) const;
  /// An error naming the first hyper-parameter that has no default and was
  /// never set (prefixed "step: "), else success.
  Status check_complete() const;
  /// The table the kernel reads: num_slots() * H floats.
  const std::vector<float> &values() const { return values_; }
  /// Incremented by every change of values(): a device copy is stale when
  /// its generation differs.
  uint64_t generation() const { return generation_; }

private:
  Status check(int slot, std::string_view name, int *index) const;
  const Manifest *m_;
  std::vector<float> values_;
  std::vector<uint8_t> given_; ///< slots * H: default or set
  int slots_ = 0;
  uint64_t generation_ = 0;
};

/// One table record's part of a tensor: elements [offset, offset + numel).
struct RecordSlice {
  int64_t offset = 0;
  int64_t numel = 0;
};

/// Splits a tensor of `numel` elements into table records of at most
/// `max_record_elements` elements. Every boundary is a multiple of 64 groups
/// (64 * group_size elements), so each record starts at a group boundary and
/// at a 64-entry (hence 16-byte aligned) offset of every per-element and
/// per-group buffer. `max_record_elements` below 64 * group_size is raised
/// to it. A tensor that fits is one record.
std::vector<RecordSlice> split_records(int64_t numel, int64_t group_size,
                                       int64_t max_record_elements);

/// The largest record the GPU kernels take (they index elements with 32-bit
/// math): 2^31 - 1 rounded down to a multiple of 64 * group_size.
int64_t gpu_max_record_elements(int64_t group_size);

/// Appends the records of tensor `t` to `table` (docs/KERNEL-ABI.md):
/// split with split_records when it exceeds `max_record_elements`, each
/// record's word 1 being its own first global group and its buffer words
/// `addresses[b]` (element 0 / group 0 of buffer b of the tensor) advanced to
/// the record's first element or group. Returns the number of records.
int64_t append_table_records(const Manifest &m, const TensorInfo &t,
                             const std::vector<int64_t> &addresses,
                             int64_t max_record_elements,
                             std::vector<int64_t> &table);

/// Checks that every tensor has a gradient (the first one without is named).
Status check_all_grads(const std::vector<TensorInfo> &tensors);

/// Checks the tensor subset of a step_tensors call: valid, ascending,
/// distinct indices whose tensors all have a gradient.
Status check_step_indices(const std::vector<TensorInfo> &tensors,
                          const std::vector<int64_t> &indices);

/// The bytes report of `tensors` under `m`; `runtime_allocated` is passed
/// through.
BytesReport compute_bytes_report(const Manifest &m,
                                 const std::vector<TensorInfo> &tensors,
                                 int64_t runtime_allocated);

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

class Optimizer {
public:
  /// An optimizer over a loaded bundle. It starts with one param group
  /// (slot 0) holding the manifest's defaults.
  static Expected<std::unique_ptr<Optimizer>>
  create(std::shared_ptr<Bundle> bundle, const OptimizerOptions &opts = {});
  /// Loads `bundle_dir` and creates an optimizer over it.
  static Expected<std::unique_ptr<Optimizer>>
  create(const std::string &bundle_dir, const LoadOptions &load = {},
         const OptimizerOptions &opts = {});
  ~Optimizer();
  Optimizer(const Optimizer &) = delete;
  Optimizer &operator=(const Optimizer &) = delete;

  const Manifest &manifest() const;
  const Bundle &bundle() const;

  // ---- param groups (hyper slots) ----------------------------------------
  /// Adds a param group with the manifest's defaults; returns its slot
  /// (-1 if memory ran out).
  int add_param_group();
  int num_param_groups() const;
  /// Sets one hyper-parameter of one param group. Unknown names, bad slots,
  /// non-finite values and nonzero values of a hyper an elided state needs
  /// at 0 are rejected.
  Status set_hyper(int param_group, std::string_view name, float value);
  /// Sets one hyper-parameter in every param group.
  Status set_hyper_all(std::string_view name, float value);
  Expected<float> hyper(int param_group, std::string_view name) const;
  /// The hyper table the kernel reads: slot-major, H floats per slot.
  const std::vector<float> &hyper_table() const;

  // ---- tensors -------------------------------------------------------------
  /// Registers a tensor: `param` (numel elements of the manifest's param
  /// dtype) and `grad` (of its grad dtype; may be null until the first step)
  /// stay caller-owned and must outlive their use. Allocates its zeroed
  /// correction and state slices. Returns the tensor index (table record).
  /// Pointers from buffer() may move when a later tensor grows an arena.
  Expected<int64_t> add_param(int param_group, void *param, int64_t numel,
                              void *grad);
  /// Re-points a tensor's gradient (takes effect at the next step).
  Status set_grad(int64_t tensor, void *grad);
  /// Re-points a tensor's parameter storage.
  Status set_param(int64_t tensor, void *param);
  int64_t num_tensors() const;
  int64_t total_groups() const;
  int64_t total_numel() const;
  const TensorInfo &tensor(int64_t index) const;
  /// Buffer `name` (a manifest buffer name: "param", "grad", "correction",
  /// "exp_avg.codes", ...) of tensor `tensor`.
  Expected<BufferView> buffer(int64_t tensor, std::string_view name) const;
  /// The tensor table exactly as the kernel sees it (ntensors records of
  /// manifest.record_words int64 words).
  const std::vector<int64_t> &table() const;

  // ---- stepping ------------------------------------------------------------
  /// t += 1, then runs the kernel over [0, total_groups) in group-aligned
  /// chunks on the thread pool. Fails (t unchanged) if a grad is missing or
  /// a hyper without default was never set.
  Status step();
  /// Runs the kernel with step number `t` over the tensors `indices` only
  /// (ascending, distinct), multithreaded over group-aligned chunks of their
  /// groups; step_count() is unchanged (the caller keeps per-tensor
  /// counters: gradient release). A contiguous run [a, b) is one slice of
  /// the table (records a..b-1, global groups [first_group(a), end of b-1));
  /// any other subset runs on a compacted copy of its records. Stepping
  /// every tensor this way equals step() bit for bit. Fails (nothing run)
  /// on a bad index, a missing gradient or an incomplete hyper table.
  Status step_tensors(const std::vector<int64_t> &indices, int64_t t);
  /// Whether every gradient element of tensors `indices` is finite (no NaN
  /// or +-Inf), scanned on the thread pool. A missing gradient is finite.
  bool grads_finite(const std::vector<int64_t> &indices) const;
  /// The number of the last step taken (0 before the first).
  int64_t step_count() const;
  /// Sets the step counter (checkpoint restore): the next step runs t + 1.
  void set_step_count(int64_t t);
  int threads() const;
  /// Resizes the thread pool (0 = hardware concurrency). On failure to
  /// start threads, steps run on the calling thread and an error is returned.
  Status set_threads(int threads);
  /// The chunks the next step will use.
  std::vector<Chunk> plan_chunks() const;

  // ---- memory ----------------------------------------------------------------
  BytesReport bytes() const;

private:
  Optimizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Splits [0, total_groups) into at most `max_chunks` chunks for tensors
/// whose first groups are `first_groups` (sorted, first_groups[0] == 0):
/// near-equal sizes, at least `min_groups` groups each, and every interior
/// boundary rounded down so that it starts a tensor-local group index that
/// is a multiple of `align_groups` (a 64-element boundary), unless that
/// would empty a chunk. Exposed for tests.
std::vector<Chunk> split_groups(int64_t total_groups,
                                const std::vector<int64_t> &first_groups,
                                int max_chunks, int64_t min_groups,
                                int64_t align_groups);

} // namespace flashopt::host

#endif // FLASHOPT_HOST_HARNESS_H
