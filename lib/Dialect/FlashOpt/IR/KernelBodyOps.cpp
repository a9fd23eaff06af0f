//===- KernelBodyOps.cpp - flashopt kernel-body operations -----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Verifiers of the operations inside a `flashopt.group_body`: buffer
/// accesses, raw memory accesses, the dither and table lookups (the others
/// are in FlashOptOps.cpp).
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/TypeUtilities.h"

using namespace mlir;
using namespace mlir::flashopt;

//===----------------------------------------------------------------------===//
// Buffer accesses
//===----------------------------------------------------------------------===//

/// Common checks of a buffer access: index in range, rate, type, access.
static LogicalResult verifyBufferAccess(Operation *op, int64_t index, Type type,
                                        BufferRate rate, bool isStore) {
  auto kernel = op->getParentOfType<KernelOp>();
  if (!kernel)
    return op->emitOpError() << "must be inside a flashopt.kernel";
  int64_t numBuffers = kernel.getBuffers().size();
  if (index < 0 || index >= numBuffers)
    return op->emitOpError() << "buffer index " << index
                             << " out of range (kernel has " << numBuffers
                             << " buffers)";
  BufferAttr buffer = kernel.getBuffer(index);
  if (buffer.getRate() != rate)
    return op->emitOpError()
           << "buffer \"" << buffer.getName() << "\" holds one value per "
           << stringifyBufferRate(buffer.getRate()) << ", not per "
           << stringifyBufferRate(rate);
  // arith works on signless integers of at least 8 bits: ui8 buffers are
  // accessed as i8, the packed 4-bit codes (i4, ui4) as i8 too.
  Type expected = accessType(buffer.getElementType());
  if (expected != type)
    return op->emitOpError() << "type " << type << " does not match buffer \""
                             << buffer.getName() << "\" (accessed as "
                             << expected << ")";
  if (isStore && buffer.getAccess() != BufferAccess::readwrite)
    return op->emitOpError() << "buffer \"" << buffer.getName()
                             << "\" is read-only";
  return success();
}

LogicalResult LoadElementOp::verify() {
  return verifyBufferAccess(*this, getBuffer(), getType(), BufferRate::element,
                            false);
}

LogicalResult StoreElementOp::verify() {
  return verifyBufferAccess(*this, getBuffer(), getValue().getType(),
                            BufferRate::element, true);
}

LogicalResult LoadGroupOp::verify() {
  return verifyBufferAccess(*this, getBuffer(), getType(), BufferRate::group,
                            false);
}

/// Whether `v`, used inside `body`, is uniform across a group: defined
/// outside the body, or computed only from group loads, group maxima and
/// other uniform values.
static bool isGroupUniform(Value v, GroupBodyOp body,
                           llvm::DenseMap<Value, bool> &cache) {
  auto it = cache.find(v);
  if (it != cache.end())
    return it->second;
  bool uniform = true;
  Operation *def = v.getDefiningOp();
  if (!def || !body->isProperAncestor(def)) {
    uniform = true; // Defined outside the group body.
  } else if (isa<GroupMaxOp, LoadGroupOp>(def)) {
    uniform = true;
  } else if (isa<LoadElementOp>(def) || def->getNumRegions() != 0) {
    uniform = false;
  } else {
    cache[v] = false; // Guard against cycles.
    for (Value operand : def->getOperands())
      if (!isGroupUniform(operand, body, cache)) {
        uniform = false;
        break;
      }
  }
  cache[v] = uniform;
  return uniform;
}

LogicalResult StoreGroupOp::verify() {
  if (failed(verifyBufferAccess(*this, getBuffer(), getValue().getType(),
                                BufferRate::group, true)))
    return failure();
  llvm::DenseMap<Value, bool> cache;
  auto body = (*this)->getParentOfType<GroupBodyOp>();
  if (!isGroupUniform(getValue(), body, cache))
    return emitOpError() << "stored value must be uniform across the group "
                            "(computed from flashopt.group_max, "
                            "flashopt.load_group or values defined outside "
                            "the group body)";
  return success();
}

//===----------------------------------------------------------------------===//
// RawLoadOp / RawStoreOp
//===----------------------------------------------------------------------===//

/// Checks the mask and alignment of a raw memory access of `type`.
static LogicalResult verifyRawAccess(Operation *op, Type type, Value mask,
                                     int64_t alignment) {
  if (alignment <= 0 || !llvm::isPowerOf2_64(alignment))
    return op->emitOpError() << "alignment must be a positive power of two, got "
                             << alignment;
  auto vecType = dyn_cast<VectorType>(type);
  if (vecType && (vecType.getRank() != 1 || vecType.isScalable()))
    return op->emitOpError() << "vector accesses must be 1-D and fixed-size";
  Type elem = vecType ? vecType.getElementType() : type;
  if (!elem.isIntOrFloat())
    return op->emitOpError() << "accessed type must be an integer or float "
                                "scalar or vector, got "
                             << type;
  if (!mask)
    return success();
  if (!vecType)
    return op->emitOpError() << "a mask requires a vector access";
  auto maskType = cast<VectorType>(mask.getType());
  if (maskType.getNumElements() != vecType.getNumElements())
    return op->emitOpError() << "mask length " << maskType.getNumElements()
                             << " does not match vector length "
                             << vecType.getNumElements();
  return success();
}

LogicalResult RawLoadOp::verify() {
  return verifyRawAccess(*this, getType(), getMask(), getAlignment());
}

LogicalResult RawStoreOp::verify() {
  return verifyRawAccess(*this, getValue().getType(), getMask(),
                         getAlignment());
}

//===----------------------------------------------------------------------===//
// DitherOp
//===----------------------------------------------------------------------===//

Value DitherOp::emitStepWord(OpBuilder &b, Location loc, Value t) {
  auto c = [&](uint32_t v) {
    return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(int32_t(v)))
        .getResult();
  };
  auto xorShift = [&](Value x, uint32_t s) {
    return arith::XOrIOp::create(b, loc, x,
                                 arith::ShRUIOp::create(b, loc, x, c(s)))
        .getResult();
  };
  Value x = xorShift(t, 16);
  x = arith::MulIOp::create(b, loc, x, c(0x21F0AAADu));
  x = xorShift(x, 15);
  x = arith::MulIOp::create(b, loc, x, c(0x735A2D97u));
  x = xorShift(x, 15);
  return arith::AndIOp::create(b, loc, x, c(0xFFFC0000u));
}

LogicalResult DitherOp::verify() {
  float offset = getOffset().convertToFloat();
  if (getPhase() < 0 || getPhase() >= (1 << 14))
    return emitOpError() << "phase must lie in [0, 2^14), got " << getPhase();
  if (getType().isInteger(32)) {
    if (offset != 0.0f)
      return emitOpError() << "an i32 dither (the word h << 18) takes offset "
                              "0.0, got "
                           << offset;
    return success();
  }
  if (offset != 1.0f && offset != 1.5f && offset != 0.0f)
    return emitOpError() << "offset must be 1.0 (a dither in [0, 1)), 1.5 "
                            "(one in [-0.5, 0.5)) or 0.0 (one in [1, 2)), got "
                         << offset;
  return success();
}

LogicalResult TableLookupOp::verify() {
  Type index = getElementTypeOrSelf(getIndex().getType());
  unsigned bits = index.getIntOrFloatBitWidth();
  auto table = dyn_cast<ShapedType>(getTable().getShapedType());
  if (!table || table.getRank() != 1 ||
      table.getDimSize(0) != (int64_t(1) << bits))
    return emitOpError() << "needs a table of 2^" << bits << " = "
                         << (int64_t(1) << bits)
                         << " entries for a " << bits << "-bit index, got "
                         << getTable().getShapedType();
  if (table.getElementType() != getElementTypeOrSelf(getResult().getType()))
    return emitOpError() << "table elements " << table.getElementType()
                         << " differ from the result type "
                         << getResult().getType();
  return success();
}
