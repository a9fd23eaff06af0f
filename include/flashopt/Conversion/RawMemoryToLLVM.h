//===- RawMemoryToLLVM.h - flashopt.raw_* to LLVM patterns ------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Conversion patterns shared by the CPU and GPU conversions to LLVM: the
/// address-based `flashopt.raw_load` / `flashopt.raw_store` become
/// `llvm.inttoptr` + `llvm.getelementptr` + (masked) loads and stores, and
/// `flashopt.table_lookup` becomes a constant global array and invariant
/// loads.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CONVERSION_RAWMEMORYTOLLVM_H
#define FLASHOPT_CONVERSION_RAWMEMORYTOLLVM_H

namespace mlir {
class LLVMTypeConverter;
class RewritePatternSet;
} // namespace mlir

namespace mlir::flashopt {

/// Adds the raw memory patterns; pointers live in `addressSpace` (0 on the
/// host, 1 = global on NVPTX). With `bf16AsInt`, bf16 data is loaded and
/// stored as i16 and bitcast (the host: LLVM legalizes bf16 vectors on
/// CPUs without native bf16 through __truncsfbf2 calls).
void populateRawMemoryToLLVMPatterns(const LLVMTypeConverter &converter,
                                     RewritePatternSet &patterns,
                                     unsigned addressSpace, bool bf16AsInt);

} // namespace mlir::flashopt

#endif // FLASHOPT_CONVERSION_RAWMEMORYTOLLVM_H
