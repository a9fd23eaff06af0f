//===- KernelAbi.h - Constants of the kernel ABI ----------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The constants of the kernel ABI (docs/KERNEL-ABI.md), once, for the
/// compiler (which emits kernels that read this layout) and the runtime
/// (which builds the tables): the tensor-table record layout, the state
/// alignment, the GPU launch shape, and the CPU feature and flavour lists
/// (CpuFeatures.def). No MLIR, no LLVM.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_ABI_KERNELABI_H
#define FLASHOPT_ABI_KERNELABI_H

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flashopt::abi {

/// The version of flashopt's tools, library and manifest format.
inline constexpr const char *kFlashOptVersion = "0.1.0";

/// Header words of one tensor-table record; buffer b's address is word
/// kTableHeaderWords + b.
inline constexpr int64_t kTableHeaderWords = 4;
/// Record word 0: numel (> 0).
inline constexpr int64_t kRecordNumel = 0;
/// Record word 1: the global index of the record's first group.
inline constexpr int64_t kRecordFirstGroup = 1;
/// Record word 2: the hyper-parameter slot (param group).
inline constexpr int64_t kRecordHyperSlot = 2;
/// Record word 3: the element offset, the index of the record's first
/// element in its tensor (a tensor split into several records, or a shard
/// of a larger tensor); the bounded numerics' dither reads it
/// (docs/NUMERICS.md §8).
inline constexpr int64_t kRecordElementOffset = 3;

/// Words of one record for a kernel with `num_buffers` buffers.
constexpr int64_t record_words(int64_t num_buffers) {
  return kTableHeaderWords + num_buffers;
}

/// Runtime-owned buffer slices (and record splits) start at a multiple of
/// this many entries, so quantization groups never straddle two tensors and
/// every slice is 16-byte (GPU) and 64-byte (arena) aligned.
inline constexpr int64_t kSliceAlignEntries = 64;

/// Threads per block every GPU kernel is built for and launched with.
inline constexpr int kGpuThreadsPerBlock = 256;

/// The hyper-parameter every step kernel has after the rule's own (the last
/// column of the hyper table, default 1): the gradient is multiplied by it
/// before the rule runs. The runtime folds per-step gradient scales into it
/// (gradient clipping; 1/(N*W) of accumulated micro-batches), so no pass
/// over the gradient memory is needed for them.
inline constexpr const char *kGradScaleHyper = "grad_scale";

/// The C signature of every step kernel, as the manifest states it.
/// What a kernel of a bundle does (docs/KERNEL-ABI.md "Gradient
/// accumulation"). Every kernel of a bundle has the signature below and
/// reads the same tensor table and hyper table; only an optimizer with an
/// accumulator has the last three.
enum class KernelKind {
  Step,            ///< the step, reading `grad`
  Accumulate,      ///< accum = encode(decode(accum) + grad); nothing else
  StepAccumulated, ///< the step reading decode(accum) as its gradient
  StepFused,       ///< the step reading decode(encode(decode(accum) + grad))
};
inline constexpr KernelKind kKernelKinds[] = {
    KernelKind::Step, KernelKind::Accumulate, KernelKind::StepAccumulated,
    KernelKind::StepFused};
/// "step", "accumulate", "step_accumulated", "step_fused" (the manifest's
/// kernels[].kind).
const char *kernel_kind_name(KernelKind k);
/// The kind called `name`, or false.
bool parse_kernel_kind(std::string_view name, KernelKind &out);
/// Appended to the optimizer's name to make the kernel's symbol: "" for the
/// step, "__accumulate", "__step_accumulated", "__step_fused".
std::string kernel_kind_suffix(KernelKind k);

inline constexpr const char *kKernelSignature =
    "void symbol(const int64_t *table, int64_t ntensors, const float "
    "*hypers, int64_t step, int64_t group_begin, int64_t group_end)";

/// The CPU features a manifest may name (CpuFeatures.def), in table order.
const std::vector<std::string> &known_cpu_features();
/// Whether `feature` is in known_cpu_features().
bool is_known_cpu_feature(std::string_view feature);

/// A CPU flavour flashopt-gen builds by default on x86-64.
struct CpuFlavour {
  std::string cpu;                   ///< LLVM CPU name ("x86-64-v3")
  std::vector<std::string> features; ///< what the runtime must see
};
/// The default x86-64 flavours, most capable first (CpuFeatures.def).
const std::vector<CpuFlavour> &default_x86_cpu_flavours();

} // namespace flashopt::abi

#endif // FLASHOPT_ABI_KERNELABI_H
