//===- Spec.cpp - Optimizer spec files: the model --------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The Spec model of docs/SPEC.md: diagnostics, the spec hash, the spellings
/// of its enumerations and their parsers, and the lookups on Spec. The file
/// parser is SpecParser.cpp.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Spec/Spec.h"

#include <fmt/format.h>

#include <algorithm>

namespace flashopt::spec {

//===----------------------------------------------------------------------===//
// Diagnostics, hashing, enumerations
//===----------------------------------------------------------------------===//

std::string Diagnostic::str() const {
  std::string out = loc.file.empty() ? std::string("<spec>") : loc.file;
  if (loc.hasPosition())
    out += fmt::format(":{}:{}", loc.line, loc.col);
  out += ": error: ";
  if (!loc.path.empty())
    out += loc.path + ": ";
  out += message;
  return out;
}

Diagnostic makeDiag(const SourceLoc &loc, std::string msg) {
  Diagnostic d;
  d.loc = loc;
  d.message = std::move(msg);
  return d;
}

uint64_t fnv1a64(std::string_view data) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

const char *spelling(DType v) noexcept {
  switch (v) {
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::F32:
    return "f32";
  }
  return "?";
}

const char *spelling(Correction v) noexcept {
  switch (v) {
  case Correction::None:
    return "none";
  case Correction::I8:
    return "i8";
  case Correction::I16:
    return "i16";
  }
  return "?";
}

const char *spelling(Storage v) noexcept {
  switch (v) {
  case Storage::I8:
    return "i8";
  case Storage::UI8:
    return "ui8";
  case Storage::F32:
    return "f32";
  case Storage::BF16:
    return "bf16";
  case Storage::F16:
    return "f16";
  case Storage::None:
    return "none";
  }
  return "?";
}

const char *spelling(Compand v) noexcept {
  switch (v) {
  case Compand::None:
    return "none";
  case Compand::Softsign:
    return "softsign";
  case Compand::Sqrt:
    return "sqrt";
  }
  return "?";
}

std::optional<DType> parseDType(std::string_view s) noexcept {
  if (s == "bf16")
    return DType::BF16;
  if (s == "f16")
    return DType::F16;
  if (s == "f32")
    return DType::F32;
  return std::nullopt;
}

std::optional<Correction> parseCorrection(std::string_view s) noexcept {
  if (s == "none")
    return Correction::None;
  if (s == "i8")
    return Correction::I8;
  if (s == "i16")
    return Correction::I16;
  return std::nullopt;
}

std::optional<Storage> parseStorage(std::string_view s) noexcept {
  if (s == "i8")
    return Storage::I8;
  if (s == "ui8")
    return Storage::UI8;
  if (s == "f32")
    return Storage::F32;
  if (s == "bf16")
    return Storage::BF16;
  if (s == "f16")
    return Storage::F16;
  if (s == "none")
    return Storage::None;
  return std::nullopt;
}

std::optional<Compand> parseCompand(std::string_view s) noexcept {
  if (s == "none")
    return Compand::None;
  if (s == "softsign")
    return Compand::Softsign;
  if (s == "sqrt")
    return Compand::Sqrt;
  return std::nullopt;
}

bool isQuantized(Storage s) noexcept {
  return s == Storage::I8 || s == Storage::UI8;
}

bool isPlain(Storage s) noexcept {
  return s == Storage::F32 || s == Storage::BF16 || s == Storage::F16;
}

std::optional<DType> plainDType(Storage s) noexcept {
  switch (s) {
  case Storage::F32:
    return DType::F32;
  case Storage::BF16:
    return DType::BF16;
  case Storage::F16:
    return DType::F16;
  default:
    return std::nullopt;
  }
}

Compand defaultCompand(Storage s) noexcept {
  if (s == Storage::I8)
    return Compand::Softsign;
  if (s == Storage::UI8)
    return Compand::Sqrt;
  return Compand::None;
}

const std::vector<std::string> &builtinRuleNames() {
  static const std::vector<std::string> names = {"sgd", "sgdw", "adam", "adamw",
                                                 "lion"};
  return names;
}

const std::vector<std::string> &knownTargets() {
  static const std::vector<std::string> names = {"cpu", "sm_80", "sm_90",
                                                 "sm_100"};
  return names;
}

const StateSpec *Spec::findState(std::string_view stateName) const {
  for (const StateSpec &s : states)
    if (s.name == stateName)
      return &s;
  return nullptr;
}

const HyperSpec *Spec::findHyper(std::string_view hyperName) const {
  for (const HyperSpec &h : hypers)
    if (h.name == hyperName)
      return &h;
  return nullptr;
}

bool Spec::hasTarget(std::string_view target) const {
  return std::find(targets.value.begin(), targets.value.end(), target) !=
         targets.value.end();
}

} // namespace flashopt::spec
