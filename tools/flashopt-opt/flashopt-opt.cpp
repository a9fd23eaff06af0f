//===- flashopt-opt.cpp - flashopt's mlir-opt -------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `flashopt-opt` behaves like `mlir-opt`, with the flashopt dialect, its
/// passes and the named pipelines that `flashopt-gen` runs.
///
//===----------------------------------------------------------------------===//

#include "flashopt/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  flashopt::registerAllDialects(registry);
  flashopt::registerAllPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "flashopt optimizer driver\n", registry));
}
