//===- SpecParserImpl.h - The spec parser's internals -----------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// What the spec parser's files share (lib/Spec only): the schema's key and
/// value lists, the wording helpers of its messages (SpecText.cpp), and the
/// SpecParser class, whose top-level members are checked in SpecParser.cpp
/// and the states, hyper-parameters and targets in SpecParserStates.cpp.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_LIB_SPEC_SPECPARSERIMPL_H
#define FLASHOPT_LIB_SPEC_SPECPARSERIMPL_H

#include "flashopt/Spec/JsonPositions.h"
#include "flashopt/Spec/Spec.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashopt::spec::detail {

using json = nlohmann::json;

/// At most this many errors are reported for one spec (plus a last line
/// saying how many there were).
constexpr std::size_t kMaxErrors = 50;
/// Spec files larger than this are refused.
constexpr std::size_t kMaxSpecBytes = 16u << 20;
/// Rule files larger than this are refused.
constexpr std::size_t kMaxRuleBytes = 64u << 20;

inline const std::vector<std::string> kTopKeys = {"name",   "rule",  "description",
                                           "param",  "grad",  "group_size",
                                           "states", "hyper", "targets",
                                           "accumulator", "arithmetic",
                                           "numerics"};
inline const std::vector<std::string> kArithmetics = {"exact", "fast"};
inline const std::vector<std::string> kNumerics = {"bounded", "flashoptim"};
inline const std::vector<std::string> kAccumulators = {"none", "f32", "bf16+i8",
                                                "bf16"};
inline const std::vector<std::string> kParamKeys = {"dtype", "correction"};
inline const std::vector<std::string> kRuleKeys = {"file"};
inline const std::vector<std::string> kEncodingKeys = {"storage", "group", "compand",
                                                "scale"};
inline const std::vector<std::string> kDTypes = {"bf16", "f16", "f32"};
inline const std::vector<std::string> kCorrections = {"none", "i8", "i16"};
inline const std::vector<std::string> kStorages = {
    "i8", "ui8", "i4", "ui4", "f32", "bf16", "f16", "none"};
inline const std::vector<std::string> kCompanders = {
    "none", "softsign", "sqrt", "e3m4", "e4m4", "e2m1", "e3m0", "e3m1", "e4m0"};
inline const std::vector<std::string> kScales = {"f16", "bf16", "f32"};

/// Reads a whole regular file (a FIFO, device or endless file is refused
/// before anything is read, abi/Files.h); on failure returns nullopt and sets
/// `error`.
std::optional<std::string> readFile(const std::filesystem::path &path,
                                    std::size_t maxBytes, std::string &error);
/// Quotes `s` as a JSON string, shortened to about 60 bytes.
std::string quote(std::string_view s);
/// "\"a\", \"b\", \"c\"".
std::string quoteList(const std::vector<std::string> &items);
/// Describes a found value for "expected ..., found <describe>".
std::string describe(const nlohmann::json &v);
/// The closest allowed name to a misspelt `key`, if it is close enough
/// (optimal-string-alignment distance: one edit or one transposition).
std::optional<std::string> suggest(std::string_view key,
                                   const std::vector<std::string> &allowed);
bool isIdentifier(std::string_view s);
/// Strips nlohmann's "[json.exception.parse_error.101] parse error at line 1,
/// column 2: " prefix from an exception message.
std::string stripNlohmannPrefix(std::string msg);

/// Checks one spec text and builds its model.
class SpecParser {
public:
  SpecParser(std::string_view text, std::string file)
      : text(text), file(std::move(file)), lines(text) {}

  std::optional<Spec> run(std::vector<Diagnostic> &out);

private:
  std::string_view text;
  std::string file;
  LineTable lines;
  JsonPositions positions;
  std::vector<Diagnostic> diags;
  Spec spec;

  //===--- locations ------------------------------------------------------===//

  SourceLoc at(const TextPos &p, std::string path) const {
    SourceLoc loc;
    loc.file = file;
    loc.line = p.line;
    loc.col = p.col;
    loc.path = std::move(path);
    return loc;
  }

  /// Where the value at `ptr` is written (the document start if unknown).
  SourceLoc valueLoc(const std::string &ptr) const {
    if (const JsonPosEntry *e = positions.lookup(ptr))
      return at(e->value, ptr);
    if (const JsonPosEntry *root = positions.lookup(""))
      return at(root->value, ptr);
    return at(TextPos{}, ptr);
  }

  /// Where the key of member `ptr` is written (its value if it has none).
  SourceLoc keyLoc(const std::string &ptr) const {
    if (const JsonPosEntry *e = positions.lookup(ptr))
      return at(e->hasKey ? e->key : e->value, ptr);
    return valueLoc(ptr);
  }

  /// The location of a member `key` that object `objPtr` lacks: the object,
  /// with the member's pointer as path.
  SourceLoc missingLoc(const std::string &objPtr,
                       const std::string &key) const {
    SourceLoc loc = valueLoc(objPtr);
    loc.path = child(objPtr, key);
    return loc;
  }

  static std::string child(const std::string &ptr, const std::string &key) {
    return ptr + "/" + JsonPositions::escapeToken(key);
  }

  /// The byte offset of member `ptr`'s key (for text order).
  std::size_t keyOffset(const std::string &ptr) const {
    if (const JsonPosEntry *e = positions.lookup(ptr))
      return e->hasKey ? e->key.offset : e->value.offset;
    return 0;
  }

  /// The members of object `obj` (at `ptr`) in text order.
  std::vector<std::pair<std::string, const json *>>
  membersInTextOrder(const json &obj, const std::string &ptr) const {
    std::vector<std::pair<std::string, const json *>> members;
    for (auto it = obj.begin(); it != obj.end(); ++it)
      members.emplace_back(it.key(), &it.value());
    std::stable_sort(members.begin(), members.end(),
                     [&](const auto &a, const auto &b) {
                       return keyOffset(child(ptr, a.first)) <
                              keyOffset(child(ptr, b.first));
                     });
    return members;
  }

  //===--- errors ---------------------------------------------------------===//

  void error(const SourceLoc &loc, std::string msg) {
    diags.push_back(makeDiag(loc, std::move(msg)));
  }

  void expected(const std::string &ptr, const std::string &what,
                const json &found) {
    error(valueLoc(ptr),
          fmt::format("expected {}, found {}", what, describe(found)));
  }

  void missing(const std::string &objPtr, const std::string &key) {
    error(missingLoc(objPtr, key),
          fmt::format("missing required key {}", quote(key)));
  }

  /// Reports every member of `obj` not in `allowed`, at its key.
  void checkKeys(const json &obj, const std::string &ptr,
                 const std::vector<std::string> &allowed) {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const std::string &key = it.key();
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end())
        continue;
      std::string msg = fmt::format("unknown key {}; expected one of {}",
                                    quote(key), quoteList(allowed));
      if (auto s = suggest(key, allowed))
        msg += fmt::format(" (did you mean {}?)", quote(*s));
      error(keyLoc(child(ptr, key)), msg);
    }
  }

  /// Checks that `v` is one of `allowed` strings.
  std::optional<std::string> oneOf(const json &v, const std::string &ptr,
                                   const std::vector<std::string> &allowed) {
    if (v.is_string()) {
      const std::string &s = v.get_ref<const std::string &>();
      if (std::find(allowed.begin(), allowed.end(), s) != allowed.end())
        return s;
    }
    expected(ptr, "one of " + quoteList(allowed), v);
    return std::nullopt;
  }

  /// Checks that `v` is an integer power of two in [16, 128].
  std::optional<unsigned> groupValue(const json &v, const std::string &ptr) {
    std::string what =
        fmt::format("a power of two in [{}, {}]", kMinGroupSize, kMaxGroupSize);
    double d = 0;
    if (v.is_number_integer() || v.is_number_unsigned()) {
      if (v.is_number_unsigned())
        d = static_cast<double>(v.get<uint64_t>());
      else
        d = static_cast<double>(v.get<int64_t>());
    } else if (v.is_number_float() &&
               std::trunc(v.get<double>()) == v.get<double>()) {
      d = v.get<double>();
    } else {
      expected(ptr, "an integer, " + what, v);
      return std::nullopt;
    }
    if (d >= kMinGroupSize && d <= kMaxGroupSize) {
      auto n = static_cast<unsigned>(d);
      if ((n & (n - 1)) == 0)
        return n;
    }
    expected(ptr, what, v);
    return std::nullopt;
  }

  //===--- members --------------------------------------------------------===//

  /// Fills in `target` with "located, not given" defaults at object `objPtr`.
  template <typename T>
  void setDefault(Located<T> &target, T value, const std::string &objPtr,
                  const std::string &key) {
    target.value = std::move(value);
    target.given = false;
    target.loc = missingLoc(objPtr, key);
  }

  void checkName(const json &doc);
  void checkRule(const json &doc);
  void checkRuleFile(const json &fileValue, const std::string &ptr);
  void checkDescription(const json &doc);
  void checkParam(const json &doc);
  void checkGrad(const json &doc);
  void checkAccumulator(const json &doc);
  void checkArithmetic(const json &doc);
  void checkNumerics(const json &doc);
  void checkGroupSize(const json &doc);
  void checkStates(const json &doc);
  void checkEncoding(const json &enc, const std::string &ptr, StateSpec &state);
  void checkGroupConsistency();
  void checkHyper(const json &doc);
  void checkTargets(const json &doc);
};

} // namespace flashopt::spec::detail

#endif // FLASHOPT_LIB_SPEC_SPECPARSERIMPL_H
