//===- GroupBodyLowering.h - Shared lowering of group bodies ----*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The part of the lowering that the CPU and GPU back ends share: the
/// kernel prologue (hyper-parameters, step count, powi) and the mapping of a
/// `flashopt.group_body` onto W vector lanes with predicated tails. The CPU
/// maps a whole group onto one vector (W = G); the GPU maps it onto G/W
/// threads of W elements each and combines `flashopt.group_max` across them
/// with a butterfly of shuffles. Because both use this code, CPU tests
/// exercise the same index, predication and decode/encode code the GPU runs.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CONVERSION_GROUPBODYLOWERING_H
#define FLASHOPT_CONVERSION_GROUPBODYLOWERING_H

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/abi/KernelAbi.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

#include <functional>

namespace mlir::flashopt {

/// i64 words of a tensor-table record before the buffer addresses: numel,
/// first global group, hyper slot, element offset (docs/KERNEL-ABI.md; the
/// one definition is the ABI library's).
constexpr int64_t kTableHeaderWords = ::flashopt::abi::kTableHeaderWords;

/// How a worker's accesses are predicated.
enum class Predication {
  /// Every element of the worker is valid: plain vector accesses.
  None,
  /// Masked accesses (the partial last group of a tensor on the CPU).
  Masked,
  /// Per access: a plain vector access when all of the worker's elements are
  /// valid, a masked one otherwise. Control flow stays around accesses only,
  /// so every lane reaches every cross-lane operation (the GPU).
  PerAccess,
};

/// Everything the group-body lowering needs to know about one worker.
struct GroupBodyEnv {
  /// Elements per worker (the width of every memory access).
  int64_t width = 0;
  /// Index of the worker's first element in the tensor (index type).
  Value elementIndex;
  /// The record's element offset in its tensor (i64, the record word
  /// kRecordElementOffset), or null for 0: flashopt.dither's index is
  /// this plus `elementIndex` plus the lane.
  Value elementOffset;
  /// Or, instead of elementOffset, the record-uniform part of the dither's
  /// hash for each step operand the dithers use (one per dither stream,
  /// docs/NUMERICS.md §2e): {step, element offset * A + H(step) << 18} in
  /// 32-bit arithmetic (i32, A DitherOp's multiplier), computed once per
  /// record.
  SmallVector<std::pair<Value, Value>, 2> ditherBases;
  /// Tensor-local group index (index type).
  Value groupIndex;
  /// Number of elements of the tensor (index type).
  Value numElements;
  /// Emits (or returns) the byte address (i64) of the tensor's buffer
  /// `buffer` at the builder's insertion point. The GPU reloads addresses
  /// from the (cached) tensor table at each access rather than keeping
  /// 64-bit values live across the body; the CPU computes them once.
  std::function<Value(OpBuilder &, Location, int64_t)> baseAddress;
  /// Whether the worker has work at all (i1), or null for always.
  Value active;
  /// Whether this worker stores per-group values (i1), or null for always.
  Value isGroupLeader;
  /// How accesses are predicated.
  Predication predication = Predication::None;
  /// Largest alignment (bytes) that accesses may assume; the actual
  /// alignment is min(this, width * element size).
  int64_t maxAlignment = 0;
  /// Packed 4-bit codes as words (the GPU): a worker's W/2 bytes are
  /// loaded as 32-bit (or, W = 4, 16-bit) integers and each nibble is
  /// shifted out of its word, and stored the same way, instead of byte
  /// vectors interleaved and deinterleaved (NVPTX scalarizes shuffles of
  /// i8 vectors into byte permutes). The bits are the same.
  bool packedAsWords = false;
  /// With Predication::None: one `baseAddress` per buffer for the whole body
  /// (a load and a store of one buffer share it) instead of one per access.
  /// Fewer loads, one more live pointer per read-write buffer.
  bool shareBases = false;
  /// Combines a worker's partial maximum with the other workers of its
  /// group (GPU butterfly); null when a worker holds the whole group. The
  /// value is an f32 (float maximum) or, for absolute values, the i32 bits
  /// of one (unsigned maximum).
  std::function<Value(OpBuilder &, Location, Value)> combineAcrossWorkers;
};

/// Emits the kernel prologue (every op before the group body) at `b`:
/// `flashopt.hyper` loads from the f32 table at byte address `hyperBase`,
/// `flashopt.step_count` is `step`, `flashopt.powi` becomes a loop. Results
/// are recorded in `mapping`.
void emitPrologue(OpBuilder &b, KernelOp kernel, Value hyperBase, Value step,
                  IRMapping &mapping);

/// Emits the group body of `kernel` for one worker described by `env`;
/// `mapping` holds the prologue values.
LogicalResult emitGroupBody(OpBuilder &b, KernelOp kernel,
                            const GroupBodyEnv &env, const IRMapping &mapping);

/// The bodies of several groups (one environment each) at one insertion
/// point, interleaved operation by operation: independent dependency chains
/// side by side for an out-of-order core.
///
/// With `reduceLanes` = L > 0, the group maxima of absolute values (or
/// bits) of unpredicated groups that each hold a whole group are reduced
/// together: one transposed reduction of the N groups' vectors (pairs of
/// vectors merged half by half until one vector holds N segments, folded
/// down to L lanes, then a butterfly within each segment) instead of one
/// reduction per group — the same unsigned maxima of the same bits, in
/// about half the shuffles, and the N maxima side by side in one vector.
LogicalResult emitGroupBodies(OpBuilder &b, KernelOp kernel,
                              ArrayRef<GroupBodyEnv> envs,
                              const IRMapping &mapping,
                              int64_t reduceLanes = 0);

/// Whether the group body of `kernel` reads the record's element offset
/// (it has a `flashopt.dither`): then GroupBodyEnv::elementOffset is needed.
bool usesElementOffset(KernelOp kernel);

/// Emits `flashopt.raw_load` of an i64 at `base[index]` (index type).
Value loadI64(OpBuilder &b, Location loc, Value base, Value index);

} // namespace mlir::flashopt

#endif // FLASHOPT_CONVERSION_GROUPBODYLOWERING_H
