//===- InputLimits.h - Bounds on text handed to the MLIR parser -*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The upstream MLIR parser recurses once per nested bracket, without a
/// bound: about 20,000 nested '(' overflow an 8 MiB stack (SIGSEGV). Rule
/// files and flashopt-opt's input are user input, so flashopt scans them
/// first and refuses text nested deeper than kMaxDialectNesting, naming the
/// line and column where the limit is crossed. Plain C++ (no MLIR).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_SPEC_INPUTLIMITS_H
#define FLASHOPT_SPEC_INPUTLIMITS_H

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace flashopt::spec {

/// The deepest bracket nesting ('(' '[' '{' '<') flashopt hands to the MLIR
/// parser. Real rule files nest fewer than 20 levels; the parser's stack
/// use stays far below a thread's 8 MiB at this depth.
inline constexpr int kMaxDialectNesting = 256;

/// Where dialect text first nests deeper than allowed.
struct NestingViolation {
  size_t line = 1, column = 1; ///< 1-based, of the bracket that crosses it
  size_t offset = 0;           ///< byte offset of that bracket
  /// "nesting deeper than 256 levels of brackets ..." (no location).
  std::string message;
};

/// Scans MLIR text (string literals and // comments skipped, "->" not a
/// bracket) for bracket nesting deeper than `max_depth`.
std::optional<NestingViolation>
findExcessiveNesting(std::string_view text, int max_depth = kMaxDialectNesting);

} // namespace flashopt::spec

#endif // FLASHOPT_SPEC_INPUTLIMITS_H
