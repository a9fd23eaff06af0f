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
#include "flashopt/abi/DType.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

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

// Dtype spellings are the kernel ABI's (abi/DTypes.def); the spec model
// keeps its own enums for the subsets each field allows.
namespace {
using AbiDType = ::flashopt::abi::DType;

constexpr std::pair<DType, AbiDType> kDTypes[] = {
    {DType::BF16, AbiDType::BF16}, {DType::F16, AbiDType::F16},
    {DType::F32, AbiDType::F32}};
constexpr std::pair<Correction, AbiDType> kCorrections[] = {
    {Correction::I8, AbiDType::I8}, {Correction::I16, AbiDType::I16}};
constexpr std::pair<Storage, AbiDType> kStorages[] = {
    {Storage::I8, AbiDType::I8},     {Storage::UI8, AbiDType::U8},
    {Storage::F32, AbiDType::F32},   {Storage::BF16, AbiDType::BF16},
    {Storage::F16, AbiDType::F16},   {Storage::I4, AbiDType::I4},
    {Storage::UI4, AbiDType::U4}};

template <typename E, size_t N>
const char *spellingIn(const std::pair<E, AbiDType> (&table)[N], E v) {
  for (const auto &[e, d] : table)
    if (e == v)
      return ::flashopt::abi::dtype_name(d);
  return "none"; // the one value of each enum that is not a dtype
}

template <typename E, size_t N>
std::optional<E> parseIn(const std::pair<E, AbiDType> (&table)[N],
                         std::string_view s) {
  std::optional<AbiDType> d = ::flashopt::abi::parse_dtype(s);
  if (d)
    for (const auto &[e, t] : table)
      if (t == *d)
        return e;
  return std::nullopt;
}
} // namespace

const char *spelling(DType v) noexcept { return spellingIn(kDTypes, v); }
const char *spelling(Correction v) noexcept {
  return spellingIn(kCorrections, v);
}
const char *spelling(Storage v) noexcept { return spellingIn(kStorages, v); }

const char *spelling(Compand v) noexcept {
  switch (v) {
  case Compand::None:
    return "none";
  case Compand::Softsign:
    return "softsign";
  case Compand::Sqrt:
    return "sqrt";
  case Compand::E3M4:
    return "e3m4";
  case Compand::E4M4:
    return "e4m4";
  case Compand::E2M1:
    return "e2m1";
  case Compand::E3M0:
    return "e3m0";
  case Compand::E3M1:
    return "e3m1";
  case Compand::E4M0:
    return "e4m0";
  }
  return "?";
}

std::optional<DType> parseDType(std::string_view s) noexcept {
  return parseIn(kDTypes, s);
}

const char *spelling(Arithmetic v) noexcept {
  return v == Arithmetic::Fast ? "fast" : "exact";
}

const char *spelling(NumericsMode v) noexcept {
  return v == NumericsMode::FlashOptim ? "flashoptim" : "bounded";
}

const char *spelling(Accumulator v) noexcept {
  switch (v) {
  case Accumulator::None:
    return "none";
  case Accumulator::F32:
    return "f32";
  case Accumulator::BF16I8:
    return "bf16+i8";
  case Accumulator::BF16:
    return "bf16";
  }
  return "?";
}

std::optional<Correction> parseCorrection(std::string_view s) noexcept {
  if (s == "none")
    return Correction::None;
  return parseIn(kCorrections, s);
}

std::optional<Storage> parseStorage(std::string_view s) noexcept {
  if (s == "none")
    return Storage::None;
  return parseIn(kStorages, s);
}

std::optional<Compand> parseCompand(std::string_view s) noexcept {
  if (s == "none")
    return Compand::None;
  if (s == "softsign")
    return Compand::Softsign;
  if (s == "sqrt")
    return Compand::Sqrt;
  if (s == "e3m4")
    return Compand::E3M4;
  if (s == "e4m4")
    return Compand::E4M4;
  if (s == "e2m1")
    return Compand::E2M1;
  if (s == "e3m0")
    return Compand::E3M0;
  if (s == "e3m1")
    return Compand::E3M1;
  if (s == "e4m0")
    return Compand::E4M0;
  return std::nullopt;
}

bool isQuantized(Storage s) noexcept { return codeBits(s) != 0; }

unsigned codeBits(Storage s) noexcept {
  switch (s) {
  case Storage::I8:
  case Storage::UI8:
    return 8;
  case Storage::I4:
  case Storage::UI4:
    return 4;
  default:
    return 0;
  }
}

bool isSignedCodes(Storage s) noexcept {
  return s == Storage::I8 || s == Storage::I4;
}

std::optional<Storage> storageFor(Compand c) noexcept {
  switch (c) {
  case Compand::Softsign:
  case Compand::E3M4:
    return Storage::I8;
  case Compand::Sqrt:
  case Compand::E4M4:
    return Storage::UI8;
  case Compand::E2M1:
  case Compand::E3M0:
    return Storage::I4;
  case Compand::E3M1:
  case Compand::E4M0:
    return Storage::UI4;
  case Compand::None:
    return std::nullopt;
  }
  return std::nullopt;
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
  if (s == Storage::I4)
    return Compand::E2M1;
  if (s == Storage::UI4)
    return Compand::E3M1;
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
