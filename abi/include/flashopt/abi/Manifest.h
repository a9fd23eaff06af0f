//===- Manifest.h - The bundle manifest model -------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The manifest of a kernel bundle (manifest.json) — the contract between
/// flashopt-gen and libflashopt — as one model with one writer
/// (`write_manifest`, used by the compiler's bundle driver) and one reader
/// (`parse_manifest` / `load_manifest`, used by the runtime), so the two
/// halves cannot drift apart; a write → read round trip is unit-tested.
///
/// The reader validates everything the runtime relies on and names the file
/// and the field in every error: the format and its version, dtypes, the
/// state encodings, the buffer list (which must be exactly the one the
/// param, grad and states imply, in ABI order), the table layout and the
/// stated bytes per parameter.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_ABI_MANIFEST_H
#define FLASHOPT_ABI_MANIFEST_H

#include "flashopt/abi/DType.h"
#include "flashopt/abi/KernelAbi.h"
#include "flashopt/abi/Status.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashopt::abi {

/// The manifest's "format" value.
inline constexpr const char *kManifestFormat = "flashopt-manifest";
/// The manifest format version this library writes and reads.
inline constexpr int kManifestFormatVersion = 1;

/// One hyper-parameter column of the hyper table.
struct HyperSpec {
  std::string name;
  /// The default, exactly as the manifest writes it (the runtime's hyper
  /// table rounds it to the f32 the kernels read); nullopt when the manifest
  /// says null, in which case every param group must set it before the
  /// first step.
  std::optional<double> default_value;
  /// An envelope (docs/NUMERICS.md §8.4): the running maximum ("max") or
  /// minimum ("min") of hyper-parameter `envelope_of` over the steps taken,
  /// kept by the runtime (it cannot be set and has no default). Both empty
  /// for a plain hyper-parameter.
  std::string envelope;
  std::string envelope_of;

  bool is_envelope() const { return !envelope_of.empty(); }
};

/// How a state is stored (the manifest's `encoding.kind`).
enum class StateKind { Quantized, Plain, Elided };

/// "quantized", "plain", "elided".
const char *state_kind_name(StateKind k);
std::optional<StateKind> parse_state_kind(std::string_view name);

/// The companders of quantized states: "none", "softsign", "sqrt" (linear
/// 8-bit codes), "e3m4", "e4m4" (8-bit minifloat codes) and "e2m1", "e3m0",
/// "e3m1", "e4m0" (4-bit minifloat codes, packed i4/ui4 storage;
/// abi/Minifloat.h).
const std::vector<std::string> &known_companders();

struct StateSpec {
  std::string name;
  StateKind kind = StateKind::Plain;
  DType storage = DType::F32; ///< codes (quantized) or values (plain)
  int64_t group = 0;          ///< quantized only
  std::string compand;        ///< quantized only: known_companders()
  DType scale = DType::F32;   ///< quantized only
  /// The hyper-parameter that must stay 0 because this state is elided
  /// ("" if none).
  std::string elidable_if_zero;
};

enum class Per { Element, Group };

/// Accum: the gradient accumulator ("accum" and, for bf16 + i8,
/// "accum_correction"), owned by the runtime like a state.
enum class BufferRole { Param, Correction, Grad, State, Accum };

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
  std::string file; ///< relative to the bundle directory (GPU: the PTX)
  std::string symbol;
  /// What the kernel does (written only when not the step).
  KernelKind kind = KernelKind::Step;
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
  /// The gradient accumulator (written only when there is one).
  double accumulator = 0;
};

/// A gradient accumulator's encoding (docs/NUMERICS.md §6): f32, bf16 with
/// an i8 correction term (the master-weight split of §1), or plain bf16.
struct AccumulatorSpec {
  DType dtype = DType::F32;
  std::optional<DType> correction; ///< I8 for bf16 + i8
};

struct Manifest {
  std::string path; ///< where it was read from ("" for a string); not written
  std::string format = kManifestFormat;
  int64_t format_version = kManifestFormatVersion;
  std::string generator;
  std::string name;
  std::string spec; ///< the spec file it came from (optional)
  std::string spec_hash;
  std::string rule;
  std::string description; ///< optional
  int64_t group_size = 0;
  DType param = DType::F32;
  std::optional<DType> correction; ///< nullopt for "none"
  DType grad = DType::F32;
  /// The gradient accumulator, when the spec asks for one: its buffers come
  /// after grad, and the bundle has the accumulation kernels.
  std::optional<AccumulatorSpec> accumulator;
  /// "exact" (IEEE division and square root; the default, not written) or
  /// "fast" (docs/NUMERICS.md §7).
  std::string arithmetic = "exact";
  /// The state numerics (docs/NUMERICS.md §8): "bounded" (dithered codes,
  /// Adam's moment bound) or "flashoptim" (FlashOptim's bits). Manifests
  /// written before the field existed were FlashOptim's.
  std::string numerics = "bounded";
  std::vector<HyperSpec> hypers;
  std::vector<StateSpec> states;
  std::vector<BufferSpec> buffers; ///< ABI order
  int64_t header_words = kTableHeaderWords, record_words = 0;
  BytesPerParam bytes_per_param;
  std::vector<KernelEntry> kernels; ///< every target, in manifest order

  /// Index in `hypers`, or -1.
  int hyper_index(std::string_view name) const;
  /// Index in `buffers`, or -1.
  int buffer_index(std::string_view name) const;
  /// The first kernel of `kind` for `target` (and CPU flavour `cpu` when
  /// not empty), or null.
  const KernelEntry *find_kernel(KernelKind kind, std::string_view target,
                                 std::string_view cpu = {}) const;
  /// Bytes per parameter recomputed from `buffers` and `group_size`.
  BytesPerParam computed_bytes_per_param() const;
};

/// One buffer a state encoding stores per tensor.
struct StateBuffer {
  /// Appended to the state's name: the buffer is "<state><suffix>" and its
  /// checkpoint tensor "<param>.<state><suffix>" ("" or ".codes").
  std::string suffix;
  DType dtype = DType::F32;
  Per per = Per::Element;
};

/// The buffers of state `s`, by encoding kind — the one place the kernel ABI
/// says what each encoding stores: quantized → ".codes" (per element) and
/// ".scales" (per group); plain → "" (per element); elided → none.
std::vector<StateBuffer> state_buffers(const StateSpec &s);

/// The buffers the kernel ABI implies for `m`'s param, correction, grad and
/// states, in ABI order (docs/KERNEL-ABI.md), with their roles.
std::vector<BufferSpec> implied_buffers(const Manifest &m);

/// Fills the derived fields of `m` from the rest: `buffers` (implied_buffers),
/// `header_words`, `record_words` and `bytes_per_param`.
void complete_manifest(Manifest &m);

/// Parses and validates a manifest. `origin` names the source in messages.
Expected<Manifest> parse_manifest(std::string_view json_text,
                                  const std::string &origin);
/// The largest manifest.json load_manifest reads (a real one is a few KiB).
inline constexpr uint64_t kMaxManifestBytes = uint64_t(16) << 20;
/// Reads and validates `path` (a manifest.json file): a regular file of at
/// most kMaxManifestBytes (a FIFO, a device or an endless file is refused).
Expected<Manifest> load_manifest(const std::string &path);

/// Renders `m` as pretty-printed JSON (with a trailing newline), in the
/// layout parse_manifest reads. The buffer list, table layout and bytes per
/// parameter are written as `m` holds them: call complete_manifest first.
std::string write_manifest(const Manifest &m);

/// The suffix of the data symbol that flashopt-gen puts next to every CPU
/// step kernel `S` of a bundle: `S__abi`, a NUL-terminated
/// kernel_abi_description of the manifest the kernel was compiled for.
inline constexpr const char *kKernelAbiSymbolSuffix = "__abi";

/// What a step kernel reads, as one line of text: the hyper-parameter names
/// in table order (the kernel reads hypers[slot * H + h]), the group size,
/// the buffers in record order (name, dtype, per element / group, access)
/// and the record length. The runtime compares the kernel's copy with the
/// one computed from the manifest it was given, so a manifest that
/// disagrees with its kernel is an error before anything runs.
std::string kernel_abi_description(const Manifest &m);

/// The same description as a PTX module-scope global, for the GPU kernels:
/// `.visible .global .align 1 .b8 S__abi[N] = {...};` (NUL-terminated), which
/// ptxas keeps in the cubin's initialized data, so a PTX file and a cubin
/// both carry the description of the manifest they were compiled for.
std::string ptx_kernel_abi_global(const std::string &kernelSymbol,
                                  const std::string &description);

/// The kernel ABI description a kernel file carries, or nullopt if it has
/// none: the NUL-terminated "flashopt-kernel-abi ..." string of a shared
/// object's or a cubin's data, or the bytes of a PTX file's `S__abi` global
/// (ptx_kernel_abi_global). `bytes` is the whole file.
std::optional<std::string> find_kernel_abi_description(std::string_view bytes);

/// The index of buffer `name` in `m.buffers`, or an error listing the
/// buffers the manifest has.
Expected<int> find_buffer(const Manifest &m, std::string_view name);

} // namespace flashopt::abi

#endif // FLASHOPT_ABI_MANIFEST_H
