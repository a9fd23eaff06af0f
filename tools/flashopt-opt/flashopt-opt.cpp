//===- flashopt-opt.cpp - flashopt's mlir-opt -------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `flashopt-opt` behaves like `mlir-opt`, with the flashopt dialect, its
/// passes and the named pipelines that `flashopt-gen` runs. Its input is
/// checked first: a regular file (or stdin) of bounded size, nested no
/// deeper than flashopt::spec::kMaxDialectNesting brackets (the upstream
/// parser would overflow its stack), with a located error otherwise.
///
//===----------------------------------------------------------------------===//

#include "flashopt/InitAll.h"
#include "flashopt/Spec/InputLimits.h"
#include "flashopt/abi/Files.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/Support/FileUtilities.h"

#include <memory>
#include <string>

namespace {

/// The largest input flashopt-opt reads.
constexpr uint64_t kMaxInputBytes = uint64_t(256) << 20;

/// Prints a located error for deep nesting in `buffer`; true when found.
bool reportDeepNesting(const llvm::MemoryBuffer &buffer) {
  std::optional<flashopt::spec::NestingViolation> deep =
      flashopt::spec::findExcessiveNesting(buffer.getBuffer());
  if (!deep)
    return false;
  llvm::SourceMgr sm;
  sm.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBuffer(buffer.getBuffer(),
                                                          buffer.getBufferIdentifier(),
                                                          false),
                        llvm::SMLoc());
  sm.PrintMessage(llvm::errs(),
                  llvm::SMLoc::getFromPointer(buffer.getBufferStart() +
                                              deep->offset),
                  llvm::SourceMgr::DK_Error, deep->message);
  return true;
}

} // namespace

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  flashopt::registerAllDialects(registry);
  flashopt::registerAllPasses();
  auto [inputFilename, outputFilename] = mlir::registerAndParseCLIOptions(
      argc, argv, "flashopt optimizer driver\n", registry);

  if (inputFilename != "-") {
    // Check the file before the upstream driver opens it: a FIFO would
    // block, /dev/zero never ends, and deep nesting crashes the parser.
    std::string text, reason;
    if (flashopt::abi::read_regular_file(inputFilename, kMaxInputBytes, text,
                                         reason) != flashopt::abi::FileError::None) {
      llvm::errs() << inputFilename << ": error: cannot read input: " << reason
                   << "\n";
      return 1;
    }
    auto buffer = llvm::MemoryBuffer::getMemBuffer(text, inputFilename, false);
    if (reportDeepNesting(*buffer))
      return 1;
    return mlir::asMainReturnCode(mlir::MlirOptMain(
        argc, argv, inputFilename, outputFilename, registry));
  }

  // stdin: read it here (bounded), check it, and run the core driver on it.
  mlir::MlirOptMainConfig config = mlir::MlirOptMainConfig::createFromCLOptions();
  if (config.shouldShowDialects() || config.shouldListPasses())
    return mlir::asMainReturnCode(mlir::MlirOptMain(
        argc, argv, inputFilename, outputFilename, registry));
  std::string errorMessage;
  std::unique_ptr<llvm::MemoryBuffer> file =
      mlir::openInputFile(inputFilename, &errorMessage);
  if (!file) {
    llvm::errs() << errorMessage << "\n";
    return 1;
  }
  if (file->getBufferSize() > kMaxInputBytes) {
    llvm::errs() << "<stdin>: error: the input is larger than "
                 << (kMaxInputBytes >> 20) << " MiB\n";
    return 1;
  }
  if (reportDeepNesting(*file))
    return 1;
  std::unique_ptr<llvm::ToolOutputFile> output =
      mlir::openOutputFile(outputFilename, &errorMessage);
  if (!output) {
    llvm::errs() << errorMessage << "\n";
    return 1;
  }
  if (mlir::failed(mlir::MlirOptMain(output->os(), std::move(file), registry,
                                     config)))
    return 1;
  output->keep();
  return 0;
}
