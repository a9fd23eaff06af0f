//===- PtxEmulator.h - A functional PTX interpreter (test infrastructure) -===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A functional interpreter for the subset of PTX that flashopt-gen emits:
/// a module is parsed and pre-decoded once (every opcode, modifier,
/// directive and operand it does not implement is an error naming it and
/// its line), and a launch runs a grid of blocks of warps of 32 lanes in
/// lockstep under an active mask, with an SIMT stack that reconverges
/// divergent branches at their immediate post-dominator.
///
/// What it models: registers and predicates, the .param and .global state
/// spaces (.global through a caller-provided check of every access, with
/// natural alignment of scalar and vector accesses enforced), special
/// registers, shfl.sync with its member mask checked against the active
/// lanes, and every arithmetic and conversion instruction it accepts with
/// the semantics of the PTX ISA (IEEE rounding modes, .ftz, .sat, NaN
/// rules of min/max, canonical NaN results). rcp.approx.f32 and
/// sqrt.approx.f32, whose result the ISA bounds but does not specify, give
/// the correctly rounded value, or with FLASHOPT_PTX_APPROX=away the other
/// faithful rounding (the worst the bounds allow, for testing code whose
/// correctness rests on them). What it does not model:
/// timing, caches, the memory consistency model (warps run one after the
/// other, so inter-warp races are invisible), shared memory, barriers,
/// atomics (all refused as unimplemented). See docs/ARCHITECTURE.md.
///
/// Plain C++17, no dependencies; used by the tests' CUDA stand-in driver.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_PTX_EMULATOR_H
#define FLASHOPT_PTX_EMULATOR_H

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flashopt::ptxemu {

struct KernelImpl;

/// One `.entry` of a parsed module.
class Kernel {
public:
  ~Kernel();
  const std::string &name() const;
  /// Bytes of the parameter buffer (params laid out at their alignment).
  size_t param_bytes() const;
  /// Offset and size of each declared parameter.
  const std::vector<std::pair<size_t, size_t>> &params() const;
  /// Decoded instructions.
  size_t instruction_count() const;
  KernelImpl &impl() const { return *impl_; }

private:
  friend class Module;
  explicit Kernel(std::unique_ptr<KernelImpl> impl);
  std::unique_ptr<KernelImpl> impl_;
};

/// A parsed PTX module.
class Module {
public:
  /// Parses `text`. On failure returns nullptr and sets *error to a message
  /// naming the line and what is not understood or not implemented.
  static std::unique_ptr<Module> parse(const std::string &text,
                                       std::string *error);
  ~Module();
  const Kernel *kernel(const std::string &name) const;
  const std::vector<std::unique_ptr<Kernel>> &kernels() const {
    return kernels_;
  }
  /// The distinct full opcodes (e.g. "setp.lt.s32") the module uses.
  const std::vector<std::string> &opcodes() const { return opcodes_; }
  std::string target() const { return target_; }

private:
  Module() = default;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<std::string> opcodes_;
  std::string target_;
};

/// Whether the interpreter implements `opcode` (a full opcode with its
/// modifiers, as written in PTX, e.g. "max.NaN.f32"); if not and `why` is
/// given, says why.
bool implemented(const std::string &opcode, std::string *why = nullptr);

/// Every access to .global memory is checked by this: true when
/// [address, address + bytes) may be accessed (`write` for stores).
using MemoryCheck =
    std::function<bool(uint64_t address, uint64_t bytes, bool write)>;

struct LaunchDims {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
};

/// Counters of one launch.
struct LaunchStats {
  uint64_t warp_instructions = 0; ///< instructions issued by warps
  uint64_t lane_instructions = 0; ///< summed over active, guarded-on lanes
  uint64_t divergent_branches = 0;
  uint64_t shuffles = 0;
};

/// Runs `kernel` over `dims`; `params` is the parameter buffer
/// (param_bytes() long; the CUDA driver's kernelParams copied to each
/// parameter's offset). Global memory is the host's address space, every
/// access checked by `check` (nullptr: no check). Returns false with
/// *error set (the instruction, its line, the block/thread) on any fault.
bool launch(const Kernel &kernel, const LaunchDims &dims,
            const std::vector<uint8_t> &params, const MemoryCheck &check,
            std::string *error, LaunchStats *stats = nullptr);

} // namespace flashopt::ptxemu

#endif // FLASHOPT_PTX_EMULATOR_H
