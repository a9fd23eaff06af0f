//===- InitAll.h - Register flashopt dialects and passes --------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// One place that registers everything flashopt's tools use, so that
/// flashopt-opt and flashopt-gen always agree.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_INITALL_H
#define FLASHOPT_INITALL_H

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace flashopt {

/// Inserts the flashopt dialect and every dialect the pipelines go through,
/// with the interfaces needed for LLVM/NVVM conversion and translation.
void registerAllDialects(mlir::DialectRegistry &registry);

/// Registers flashopt's passes, the upstream passes its pipelines use, and
/// the named pipelines flashopt-cpu-pipeline and flashopt-gpu-pipeline.
void registerAllPasses();

} // namespace flashopt

#endif // FLASHOPT_INITALL_H
