//===- Manifest.h - Bundle manifests ----------------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The manifest of a kernel bundle (manifest.json): what the runtime needs to
/// know about a compiled optimizer without any MLIR — its buffers in ABI
/// order, hyper-parameters, state encodings, exact bytes per parameter and
/// the artifacts per target. Plain C++ (no MLIR), so tools and tests share it.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_TARGET_MANIFEST_H
#define FLASHOPT_TARGET_MANIFEST_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flashopt {

/// The version of flashopt's tools and manifest format.
inline constexpr const char *kFlashOptVersion = "0.1.0";
inline constexpr int kManifestFormatVersion = 1;

/// One hyper-parameter column of the hyper table.
struct ManifestHyper {
  std::string name;
  std::optional<double> defaultValue;
};

/// How one state is stored.
struct ManifestState {
  std::string name;
  std::string kind; ///< "quantized", "plain" or "elided"
  std::string storage; ///< i8/ui8 (quantized), f32/bf16/f16 (plain)
  int64_t group = 0;
  std::string compand; ///< none/softsign/sqrt (quantized)
  std::string scale; ///< f16/bf16/f32 (quantized)
  std::string elidableIfZero; ///< hyper that must be 0 when elided
};

/// One buffer of the per-tensor kernel ABI.
struct ManifestBuffer {
  std::string name;
  std::string dtype;
  bool perGroup = false;
  bool writable = false;
};

/// One compiled artifact.
struct ManifestKernel {
  std::string target; ///< "cpu", "sm_80", ...
  std::string cpu; ///< CPU flavour (cpu target)
  std::vector<std::string> features; ///< required CPU features
  std::string file; ///< path relative to the bundle directory
  std::string symbol;
  /// GPU only: threads per block, registers and spills reported by ptxas
  /// (-1 when unknown).
  int64_t threadsPerBlock = 0, registers = -1, spillStores = -1,
          spillLoads = -1;
  /// GPU only: elements per thread; a group spans group_size / this lanes.
  int64_t elementsPerThread = 0;
  std::string cubin; ///< GPU only: cubin path, "" if ptxas was not run
};

/// Everything a manifest says.
struct ManifestInfo {
  std::string name;
  std::string specPath;
  std::string specHash;
  std::string rule;
  std::string description;
  int64_t groupSize = 32;
  std::string paramDtype, correction, gradDtype;
  std::vector<ManifestHyper> hypers;
  std::vector<ManifestState> states;
  std::vector<ManifestBuffer> buffers;
  std::vector<ManifestKernel> kernels;
};

/// Bytes per parameter by category, for large tensors (scales amortized
/// over their group; no partial-group or alignment padding).
struct BytesPerParam {
  double param = 0, correction = 0, grad = 0, states = 0;
  double total() const { return param + correction + grad + states; }
  double totalWithGradRelease() const { return total() - grad; }
};

/// Size in bytes of a dtype name ("bf16" → 2); 0 for unknown names.
int dtypeBytes(const std::string &dtype);

/// Computes the bytes per parameter of `info`.
BytesPerParam computeBytesPerParam(const ManifestInfo &info);

/// Renders the manifest as pretty-printed JSON.
std::string renderManifest(const ManifestInfo &info);

} // namespace flashopt

#endif // FLASHOPT_TARGET_MANIFEST_H
