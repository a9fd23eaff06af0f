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
/// a crash (or a sanitizer report).
///
//===----------------------------------------------------------------------===//

#include "flashopt/InitAll.h"
#include "flashopt/Spec/InputLimits.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view text(reinterpret_cast<const char *>(data), size);
  if (flashopt::spec::findExcessiveNesting(text))
    return 0;
  static mlir::DialectRegistry *registry = [] {
    auto *r = new mlir::DialectRegistry();
    flashopt::registerAllDialects(*r);
    return r;
  }();
  mlir::MLIRContext ctx(*registry, mlir::MLIRContext::Threading::DISABLED);
  ctx.loadAllAvailableDialects();
  mlir::ScopedDiagnosticHandler quiet(&ctx, [](mlir::Diagnostic &) {
    return mlir::success();
  });
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(text, &ctx);
  if (module)
    (void)mlir::verify(*module);
  return 0;
}
