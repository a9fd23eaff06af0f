//===- PTX.h - GPU kernels → PTX and cubins ---------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Serialization of the NVVM-lowered `gpu.module` of a kernel to PTX text
/// (in process, through MLIR's NVVM target), and assembly to a cubin with
/// the CUDA toolkit's ptxas when it is installed, collecting the registers
/// and spills that `ptxas -v` reports.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_TARGET_PTX_H
#define FLASHOPT_TARGET_PTX_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <string>

namespace flashopt::target {

/// The NVIDIA chips flashopt builds for.
bool isSupportedChip(llvm::StringRef chip);

/// Serializes the single gpu.module in `module` (after the GPU pipeline) to
/// PTX. `tritonCompat` selects div.full.f32 for f32 division.
llvm::Expected<std::string> serializeToPTX(mlir::ModuleOp module,
                                           bool tritonCompat = false);

/// What ptxas reported for one kernel.
struct PtxasResult {
  std::string cubin;
  int registers = -1;
  int spillStores = -1, spillLoads = -1;
  std::string log;
};

/// The ptxas binary of the CUDA toolkit (CUDA_HOME, CUDA_PATH,
/// /usr/local/cuda, then PATH), if any.
std::optional<std::string> findPtxas();

/// Assembles `ptx` for `chip` with `ptxas -v -O3`.
llvm::Expected<PtxasResult> runPtxas(const std::string &ptxas,
                                     const std::string &ptx,
                                     llvm::StringRef chip);

} // namespace flashopt::target

#endif // FLASHOPT_TARGET_PTX_H
