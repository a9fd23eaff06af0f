//===- DecodeTables.cpp - flashopt-decode-tables ---------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Replaces a float that depends only on one 8-bit code (and constants) and
/// whose computation divides or takes a square root, or takes four or more
/// operations, by a read of a 256-entry table: the computation evaluated for every code by the operations' own
/// constant folders (IEEE binary32, round to nearest even), hence
/// bit-identical by construction.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTDECODETABLES
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

constexpr int64_t kEntries = 256;
/// The fewest operations of a code's own computation that a table replaces
/// when none of them divides or takes a root.
constexpr int64_t kMinTabledOps = 4;

/// A pure, single-result arith/math operation without regions.
bool isFoldableArithmetic(Operation *op) {
  return op->getNumRegions() == 0 && op->getNumResults() == 1 &&
         isPure(op) &&
         isa<arith::ArithDialect, math::MathDialect>(op->getDialect());
}

struct Tabulator {
  /// The 8-bit code each value is a function of (with constants only).
  llvm::DenseMap<Value, Value> source;
  /// Values computed from constants alone inside the body (the fast mode's
  /// reciprocals `1 / 127`): part of a code's computation, folded with it.
  llvm::DenseSet<Value> constant;

  bool isConstant(Value v) {
    return matchPattern(v, m_Constant()) || constant.contains(v);
  }

  void analyze(Block &block) {
    for (Operation &op : block) {
      if (auto load = dyn_cast<LoadElementOp>(op)) {
        if (load.getType().isInteger(8))
          source[load.getResult()] = load.getResult();
        continue;
      }
      if (!isFoldableArithmetic(&op))
        continue;
      if (op.getNumOperands() &&
          llvm::all_of(op.getOperands(), [&](Value v) { return isConstant(v); })) {
        constant.insert(op.getResult(0));
        continue;
      }
      Value src;
      bool ok = true;
      for (Value operand : op.getOperands()) {
        if (isConstant(operand))
          continue;
        auto it = source.find(operand);
        if (it == source.end() || (src && src != it->second)) {
          ok = false;
          break;
        }
        src = it->second;
      }
      if (ok && src)
        source[op.getResult(0)] = src;
    }
  }

  /// The operations computing `v` from its code, in block order.
  SmallVector<Operation *> cone(Value v) {
    llvm::SetVector<Operation *> ops;
    SmallVector<Value> work{v};
    while (!work.empty()) {
      Value x = work.pop_back_val();
      Operation *def = x.getDefiningOp();
      if (!def || isa<LoadElementOp>(def) ||
          !(source.count(x) || constant.contains(x)) || !ops.insert(def))
        continue;
      for (Value operand : def->getOperands())
        if (source.count(operand) || constant.contains(operand))
          work.push_back(operand);
    }
    SmallVector<Operation *> out(ops.begin(), ops.end());
    llvm::sort(out, [](Operation *a, Operation *b) {
      return a->isBeforeInBlock(b);
    });
    return out;
  }

  /// `v` for every code, by folding; none if some step does not fold to an
  /// f32 constant.
  std::optional<DenseElementsAttr> tabulate(Value v, Value code,
                                            ArrayRef<Operation *> ops) {
    MLIRContext *ctx = v.getContext();
    Type i8 = IntegerType::get(ctx, 8);
    SmallVector<APFloat> entries;
    entries.reserve(kEntries);
    for (int64_t k = 0; k < kEntries; ++k) {
      llvm::DenseMap<Value, Attribute> vals;
      vals[code] = IntegerAttr::get(i8, APInt(8, uint64_t(k)));
      for (Operation *op : ops) {
        SmallVector<Attribute> operands;
        for (Value operand : op->getOperands()) {
          Attribute a = vals.lookup(operand);
          if (!a)
            matchPattern(operand, m_Constant(&a));
          if (!a)
            return std::nullopt;
          operands.push_back(a);
        }
        SmallVector<OpFoldResult> results;
        if (failed(op->fold(operands, results)) || results.size() != 1)
          return std::nullopt;
        Attribute r = dyn_cast<Attribute>(results[0]);
        if (!r) {
          Value same = cast<Value>(results[0]);
          r = vals.lookup(same);
          if (!r)
            matchPattern(same, m_Constant(&r));
        }
        if (!r)
          return std::nullopt;
        vals[op->getResult(0)] = r;
      }
      auto f = dyn_cast_or_null<FloatAttr>(vals.lookup(v));
      if (!f || !f.getType().isF32())
        return std::nullopt;
      entries.push_back(f.getValue());
    }
    auto type = RankedTensorType::get({kEntries}, Float32Type::get(ctx));
    return DenseElementsAttr::get(type, entries);
  }
};

struct FlashOptDecodeTablesPass
    : mlir::flashopt::impl::FlashOptDecodeTablesBase<FlashOptDecodeTablesPass> {
  void runOnOperation() override {
    getOperation().walk([&](GroupBodyOp body) { run(body.getBody().front()); });
  }

  void run(Block &block) {
    Tabulator t;
    t.analyze(block);
    struct Replacement {
      Value value, code;
      DenseElementsAttr table;
      SmallVector<Operation *> ops;
    };
    SmallVector<Replacement> todo;
    for (Operation &op : block) {
      if (op.getNumResults() != 1 || isa<LoadElementOp>(op))
        continue;
      Value v = op.getResult(0);
      auto it = t.source.find(v);
      if (it == t.source.end() || !v.getType().isF32())
        continue;
      // Only where the value leaves the code's computation.
      bool escapes = llvm::any_of(v.getUsers(), [&](Operation *u) {
        return u->getNumResults() != 1 || !t.source.count(u->getResult(0));
      });
      if (!escapes)
        continue;
      SmallVector<Operation *> ops = t.cone(v);
      // Worth a table only where the code's own computation divides or
      // takes a root (not a reciprocal of constants), or takes at least
      // kMinTabledOps operations (a minifloat's exponent and sign,
      // docs/NUMERICS.md §2d): one load replaces them.
      int64_t own = llvm::count_if(ops, [&](Operation *o) {
        return t.source.count(o->getResult(0)) != 0;
      });
      if (own < kMinTabledOps && llvm::none_of(ops, [&](Operation *o) {
            return isa<arith::DivFOp, math::SqrtOp>(o) &&
                   t.source.count(o->getResult(0));
          }))
        continue;
      if (auto table = t.tabulate(v, it->second, ops))
        todo.push_back({v, it->second, *table, ops});
    }
    for (Replacement &r : todo) {
      OpBuilder b(r.value.getContext());
      b.setInsertionPointAfter(r.value.getDefiningOp());
      Value lookup = TableLookupOp::create(b, r.value.getLoc(),
                                           r.value.getType(), r.code, r.table);
      r.value.replaceAllUsesWith(lookup);
    }
    // The computations the tables replaced, where nothing else uses them
    // (each operation once, users before their operands).
    llvm::SetVector<Operation *> dead;
    for (Replacement &r : todo)
      dead.insert(r.ops.begin(), r.ops.end());
    SmallVector<Operation *> order(dead.begin(), dead.end());
    llvm::sort(order, [](Operation *a, Operation *b) {
      return a->isBeforeInBlock(b);
    });
    for (Operation *op : llvm::reverse(order))
      if (op->use_empty())
        op->erase();
  }
};

} // namespace
