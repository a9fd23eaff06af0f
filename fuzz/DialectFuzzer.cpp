//===- DialectFuzzer.cpp - Fuzz target: the dialect parser -----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// What flashopt-opt and flashopt-gen do with dialect text (a rule file is
/// user input): the nesting pre-scan, then the MLIR parser with the flashopt
/// dialect and its verifiers. Diagnostics are swallowed; the only failure is
/// a crash (or a sanitizer report). The registry holds the dialects a rule
/// body can use (flashopt, arith, math, scf, func: what FlashOptIR builds on),
/// so the libFuzzer build needs only the dialect library compiled with Clang,
/// not the whole compiler.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.h"
#include "flashopt/Spec/InputLimits.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"

#include <cstdint>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view text(reinterpret_cast<const char *>(data), size);
  if (flashopt::spec::findExcessiveNesting(text))
    return 0;
  static mlir::DialectRegistry *registry = [] {
    auto *r = new mlir::DialectRegistry();
    r->insert<mlir::flashopt::FlashOptDialect, mlir::arith::ArithDialect,
              mlir::math::MathDialect, mlir::scf::SCFDialect,
              mlir::func::FuncDialect>();
    return r;
  }();
  mlir::MLIRContext ctx(*registry, mlir::MLIRContext::Threading::DISABLED);
  ctx.loadAllAvailableDialects();
  mlir::ScopedDiagnosticHandler quiet(&ctx, [](mlir::Diagnostic &) {
    return mlir::success();
  });
  // The MLIR lexer reads up to the buffer's terminating NUL, as every file
  // buffer of the tools has (MemoryBuffer::getFile, getMemBufferCopy); the
  // fuzzer's bytes have none, so parse a NUL-terminated copy, as the tools
  // do. (Parsing libFuzzer's buffer directly reads one byte past its end.)
  std::string copy(text);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(copy, &ctx);
  if (module)
    (void)mlir::verify(*module);
  return 0;
}
