//===- SpecParser.cpp - Optimizer spec files: the parser ------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Parses spec files (docs/SPEC.md) in three steps:
///   1. nlohmann/json's SAX parser checks the syntax; a syntax error is
///      reported at the line:col of nlohmann's byte offset;
///   2. JsonPositions indexes where every value and key is written, and finds
///      duplicate keys and excessive nesting;
///   3. the DOM is checked against the schema, member by member, collecting
///      every error with its location, and the Spec model is filled in.
/// Exceptions (nlohmann throws; so can allocation) are caught here: none
/// leaves this file.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Spec/Spec.h"
#include "flashopt/abi/Files.h"
#include "flashopt/Spec/JsonPositions.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

namespace flashopt::spec {

namespace fs = std::filesystem;
using json = nlohmann::json;

//===----------------------------------------------------------------------===//
// The parser
//===----------------------------------------------------------------------===//

namespace {

/// At most this many errors are reported for one spec (plus a last line
/// saying how many there were).
constexpr std::size_t kMaxErrors = 50;
/// Spec files larger than this are refused.
constexpr std::size_t kMaxSpecBytes = 16u << 20;
/// Rule files larger than this are refused.
constexpr std::size_t kMaxRuleBytes = 64u << 20;

const std::vector<std::string> kTopKeys = {"name",   "rule",  "description",
                                           "param",  "grad",  "group_size",
                                           "states", "hyper", "targets",
                                           "accumulator", "arithmetic"};
const std::vector<std::string> kArithmetics = {"exact", "fast"};
const std::vector<std::string> kAccumulators = {"none", "f32", "bf16+i8",
                                                "bf16"};
const std::vector<std::string> kParamKeys = {"dtype", "correction"};
const std::vector<std::string> kRuleKeys = {"file"};
const std::vector<std::string> kEncodingKeys = {"storage", "group", "compand",
                                                "scale"};
const std::vector<std::string> kDTypes = {"bf16", "f16", "f32"};
const std::vector<std::string> kCorrections = {"none", "i8", "i16"};
const std::vector<std::string> kStorages = {"i8",   "ui8", "f32",
                                            "bf16", "f16", "none"};
const std::vector<std::string> kCompanders = {"none", "softsign", "sqrt"};
const std::vector<std::string> kScales = {"f16", "bf16", "f32"};

/// Reads a whole regular file (a FIFO, device or endless file is refused
/// before anything is read, abi/Files.h); on failure returns nullopt and sets
/// `error`.
std::optional<std::string> readFile(const fs::path &path, std::size_t maxBytes,
                                    std::string &error) {
  std::string data;
  abi::FileError e = abi::read_regular_file(path.string(), maxBytes, data, error);
  if (e == abi::FileError::None)
    return data;
  if (e == abi::FileError::TooLarge)
    error = fmt::format("larger than {} MiB", maxBytes >> 20);
  return std::nullopt;
}

/// Quotes `s` as a JSON string, shortened to about 60 bytes.
std::string quote(std::string_view s) {
  constexpr std::size_t kMax = 60;
  bool cut = s.size() > kMax;
  if (cut) {
    std::size_t n = kMax - 3;
    // Do not cut a UTF-8 sequence in half.
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80)
      --n;
    s = s.substr(0, n);
  }
  std::string q =
      json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
  if (cut)
    q.insert(q.size() - 1, "...");
  return q;
}

/// "\"a\", \"b\", \"c\"".
std::string quoteList(const std::vector<std::string> &items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i)
      out += ", ";
    out += quote(items[i]);
  }
  return out;
}

/// Describes a found value for "expected ..., found <describe>".
std::string describe(const json &v) {
  switch (v.type()) {
  case json::value_t::string:
    return quote(v.get_ref<const std::string &>());
  case json::value_t::number_integer:
  case json::value_t::number_unsigned:
  case json::value_t::number_float:
    return "number " + v.dump();
  case json::value_t::boolean:
    return v.get<bool>() ? "boolean true" : "boolean false";
  case json::value_t::null:
    return "null";
  case json::value_t::object:
    return v.empty() ? "an empty object" : "an object";
  case json::value_t::array:
    return v.empty() ? "an empty array" : "an array";
  default:
    return "a value of another kind";
  }
}

/// Optimal-string-alignment distance (typos: one edit or one transposition).
std::size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(
      a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      char ca =
          static_cast<char>(std::tolower(static_cast<unsigned char>(a[i - 1])));
      char cb =
          static_cast<char>(std::tolower(static_cast<unsigned char>(b[j - 1])));
      std::size_t cost = ca == cb ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

/// The closest allowed name to a misspelt `key`, if it is close enough.
std::optional<std::string> suggest(std::string_view key,
                                   const std::vector<std::string> &allowed) {
  if (key.size() > 64)
    return std::nullopt;
  std::optional<std::string> best;
  std::size_t bestDist = 3;
  for (const std::string &a : allowed) {
    std::size_t dist = editDistance(key, a);
    if (dist < bestDist && dist <= std::max<std::size_t>(1, key.size() / 2)) {
      best = a;
      bestDist = dist;
    }
  }
  return best;
}

bool isIdentifier(std::string_view s) {
  if (s.empty())
    return false;
  auto alpha = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  if (!alpha(s[0]))
    return false;
  for (char c : s)
    if (!alpha(c) && !(c >= '0' && c <= '9'))
      return false;
  return true;
}

/// Strips nlohmann's "[json.exception.parse_error.101] parse error at line 1,
/// column 2: " prefix from an exception message.
std::string stripNlohmannPrefix(std::string msg) {
  if (!msg.empty() && msg[0] == '[') {
    std::size_t close = msg.find("] ");
    if (close != std::string::npos)
      msg.erase(0, close + 2);
  }
  if (msg.rfind("parse error", 0) == 0) {
    std::size_t colon = msg.find(": ");
    if (colon != std::string::npos)
      msg.erase(0, colon + 2);
  }
  return msg;
}

/// A SAX consumer that only records the first syntax error.
struct SyntaxCheck : json::json_sax_t {
  bool failed = false;
  std::size_t byte = 0;
  std::string token;
  std::string message;
  int id = 0;
  bool numberOverflow = false;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t &) override { return true; }
  bool string(string_t &) override { return true; }
  bool binary(binary_t &) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t &) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string &lastToken,
                   const nlohmann::detail::exception &ex) override {
    if (!failed) {
      failed = true;
      byte = position;
      token = lastToken;
      id = ex.id;
      // out_of_range.406: "number overflow parsing '1e400'".
      numberOverflow = ex.id == 406;
      message = stripNlohmannPrefix(ex.what());
    }
    return false;
  }
};

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
  void checkGroupSize(const json &doc);
  void checkStates(const json &doc);
  void checkEncoding(const json &enc, const std::string &ptr, StateSpec &state);
  void checkGroupConsistency();
  void checkHyper(const json &doc);
  void checkTargets(const json &doc);
};

std::optional<Spec> SpecParser::run(std::vector<Diagnostic> &out) {
  spec.file = file;
  spec.dir = fs::path(file).parent_path().generic_string();
  spec.text = std::string(text);

  // 1. Syntax, with nlohmann/json's parser.
  SyntaxCheck sax;
  bool ok = json::sax_parse(text.begin(), text.end(), &sax);
  if (!ok || sax.failed) {
    // nlohmann's position counts the characters read, the offending one
    // included; a number overflow is found after the whole number was read.
    std::size_t offset = sax.byte > 0 ? sax.byte - 1 : 0;
    if (sax.numberOverflow)
      offset = sax.byte >= sax.token.size() ? sax.byte - sax.token.size() : 0;
    std::string msg = sax.message.empty() ? "syntax error" : sax.message;
    error(at(lines.at(offset), ""), "invalid JSON: " + msg);
    out.insert(out.end(), diags.begin(), diags.end());
    return std::nullopt;
  }

  // 2. Positions, duplicate keys, nesting.
  positions = JsonPositions::build(text);
  if (positions.tooDeep()) {
    error(at(*positions.tooDeep(), positions.tooDeepPointer()),
          fmt::format("nested too deeply: more than {} levels of objects and "
                      "arrays",
                      JsonPositions::kDefaultMaxDepth));
    out.insert(out.end(), diags.begin(), diags.end());
    return std::nullopt;
  }
  for (const DuplicateKey &d : positions.duplicates())
    error(at(d.at, d.pointer),
          fmt::format("duplicate key {} (first defined at {}:{})", quote(d.key),
                      d.first.line, d.first.col));

  // 3. The schema.
  json doc = json::parse(text.begin(), text.end());
  spec.loc = valueLoc("");
  if (!doc.is_object()) {
    error(valueLoc(""), fmt::format("expected a JSON object at the top level, "
                                    "found {}",
                                    describe(doc)));
  } else {
    checkKeys(doc, "", kTopKeys);
    checkName(doc);
    checkRule(doc);
    checkDescription(doc);
    checkParam(doc);
    checkGrad(doc);
    checkAccumulator(doc);
    checkArithmetic(doc);
    checkGroupSize(doc);
    checkStates(doc);
    checkGroupConsistency();
    checkHyper(doc);
    checkTargets(doc);
  }

  std::stable_sort(diags.begin(), diags.end(),
                   [](const Diagnostic &a, const Diagnostic &b) {
                     return std::make_pair(a.loc.line, a.loc.col) <
                            std::make_pair(b.loc.line, b.loc.col);
                   });
  if (diags.size() > kMaxErrors) {
    std::size_t total = diags.size();
    SourceLoc loc = diags[kMaxErrors].loc;
    diags.resize(kMaxErrors);
    error(loc, fmt::format("too many errors ({} in all); the first {} are "
                           "shown",
                           total, kMaxErrors));
  }
  if (!diags.empty()) {
    out.insert(out.end(), diags.begin(), diags.end());
    return std::nullopt;
  }
  spec.canonicalJson = doc.dump();
  return std::move(spec);
}

void SpecParser::checkName(const json &doc) {
  auto it = doc.find("name");
  if (it == doc.end()) {
    missing("", "name");
    return;
  }
  if (!it->is_string()) {
    expected("/name", "a string", *it);
    return;
  }
  const std::string &name = it->get_ref<const std::string &>();
  if (!isIdentifier(name)) {
    expected("/name", "an identifier ([A-Za-z_][A-Za-z0-9_]*)", *it);
    return;
  }
  spec.name = {name, true, valueLoc("/name")};
}

void SpecParser::checkRule(const json &doc) {
  auto it = doc.find("rule");
  if (it == doc.end()) {
    missing("", "rule");
    return;
  }
  spec.rule.loc = valueLoc("/rule");
  if (it->is_string()) {
    const std::string &name = it->get_ref<const std::string &>();
    const auto &names = builtinRuleNames();
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      spec.rule.builtin = true;
      spec.rule.name = name;
      return;
    }
  }
  if (!it->is_object()) {
    expected("/rule",
             fmt::format("a built-in rule ({}) or an object {{\"file\": "
                         "\"rule.mlir\"}}",
                         quoteList(builtinRuleNames())),
             *it);
    return;
  }
  spec.rule.builtin = false;
  checkKeys(*it, "/rule", kRuleKeys);
  auto f = it->find("file");
  if (f == it->end()) {
    missing("/rule", "file");
    return;
  }
  checkRuleFile(*f, "/rule/file");
}

void SpecParser::checkRuleFile(const json &v, const std::string &ptr) {
  spec.rule.fileLoc = valueLoc(ptr);
  if (!v.is_string()) {
    expected(ptr, "a string (the path of a rule file)", v);
    return;
  }
  const std::string &written = v.get_ref<const std::string &>();
  if (written.empty()) {
    expected(ptr, "a non-empty path", v);
    return;
  }
  if (written.find('\0') != std::string::npos) {
    expected(ptr, "a path without NUL characters", v);
    return;
  }
  fs::path p(written);
  fs::path resolved =
      p.is_absolute() ? p : (fs::path(spec.dir) / p).lexically_normal();
  std::string shown = resolved.generic_string();
  std::string where =
      shown == written
          ? ""
          : fmt::format(" (resolved to {})",
                        json(shown).dump(-1, ' ', false,
                                         json::error_handler_t::replace));
  std::string reason;
  std::optional<std::string> content =
      readFile(resolved, kMaxRuleBytes, reason);
  if (!content) {
    if (reason == "no such file")
      error(valueLoc(ptr),
            fmt::format("rule file {} not found{}", quote(written), where));
    else
      error(valueLoc(ptr), fmt::format("cannot read rule file {}{}: {}",
                                       quote(written), where, reason));
    return;
  }
  spec.rule.file = written;
  spec.rule.path = shown;
  spec.rule.text = std::move(*content);
}

void SpecParser::checkDescription(const json &doc) {
  auto it = doc.find("description");
  if (it == doc.end()) {
    setDefault(spec.description, std::string(), "", "description");
    return;
  }
  if (!it->is_string()) {
    expected("/description", "a string", *it);
    return;
  }
  spec.description = {it->get<std::string>(), true, valueLoc("/description")};
}

void SpecParser::checkParam(const json &doc) {
  auto it = doc.find("param");
  if (it == doc.end()) {
    missing("", "param");
    return;
  }
  spec.paramLoc = valueLoc("/param");
  if (!it->is_object()) {
    expected("/param", "an object {\"dtype\": ..., \"correction\": ...}", *it);
    return;
  }
  checkKeys(*it, "/param", kParamKeys);
  bool dtypeOk = false;
  auto d = it->find("dtype");
  if (d == it->end()) {
    missing("/param", "dtype");
  } else if (auto s = oneOf(*d, "/param/dtype", kDTypes)) {
    spec.paramDType = {*parseDType(*s), true, valueLoc("/param/dtype")};
    dtypeOk = true;
  }
  auto c = it->find("correction");
  if (c == it->end()) {
    setDefault(spec.correction, Correction::None, "/param", "correction");
    return;
  }
  auto s = oneOf(*c, "/param/correction", kCorrections);
  if (!s)
    return;
  spec.correction = {*parseCorrection(*s), true, valueLoc("/param/correction")};
  if (dtypeOk && spec.paramDType.value == DType::F32 &&
      spec.correction.value != Correction::None)
    expected("/param/correction",
             "\"none\" with an f32 parameter (a correction term needs a bf16 "
             "or f16 parameter)",
             *c);
}

void SpecParser::checkGrad(const json &doc) {
  auto it = doc.find("grad");
  if (it == doc.end()) {
    setDefault(spec.grad, spec.paramDType.value, "", "grad");
    return;
  }
  if (auto s = oneOf(*it, "/grad", kDTypes))
    spec.grad = {*parseDType(*s), true, valueLoc("/grad")};
}

void SpecParser::checkAccumulator(const json &doc) {
  auto it = doc.find("accumulator");
  if (it == doc.end()) {
    setDefault(spec.accumulator, Accumulator::None, "", "accumulator");
    return;
  }
  // `true` asks for accumulation with the default encoding (f32).
  if (it->is_boolean()) {
    spec.accumulator = {it->get<bool>() ? Accumulator::F32 : Accumulator::None,
                        true, valueLoc("/accumulator")};
    return;
  }
  if (!it->is_string()) {
    expected("/accumulator",
             "one of " + quoteList(kAccumulators) + " or a boolean", *it);
    return;
  }
  auto s = oneOf(*it, "/accumulator", kAccumulators);
  if (!s)
    return;
  Accumulator a = *s == "f32"       ? Accumulator::F32
                  : *s == "bf16+i8" ? Accumulator::BF16I8
                  : *s == "bf16"    ? Accumulator::BF16
                                    : Accumulator::None;
  spec.accumulator = {a, true, valueLoc("/accumulator")};
}

void SpecParser::checkArithmetic(const json &doc) {
  auto it = doc.find("arithmetic");
  if (it == doc.end()) {
    setDefault(spec.arithmetic, Arithmetic::Exact, "", "arithmetic");
    return;
  }
  auto s = oneOf(*it, "/arithmetic", kArithmetics);
  if (!s)
    return;
  spec.arithmetic = {*s == "fast" ? Arithmetic::Fast : Arithmetic::Exact, true,
                     valueLoc("/arithmetic")};
}

void SpecParser::checkGroupSize(const json &doc) {
  auto it = doc.find("group_size");
  if (it == doc.end()) {
    setDefault(spec.groupSize, kDefaultGroupSize, "", "group_size");
    return;
  }
  if (auto g = groupValue(*it, "/group_size")) {
    spec.groupSize = {*g, true, valueLoc("/group_size")};
  } else {
    // Keep checking the states against the default.
    setDefault(spec.groupSize, kDefaultGroupSize, "", "group_size");
    spec.groupSize.loc = valueLoc("/group_size");
  }
}

void SpecParser::checkStates(const json &doc) {
  auto it = doc.find("states");
  if (it == doc.end()) {
    setDefault(spec.statesForm, StatesForm::Default, "", "states");
    return;
  }
  spec.statesForm.given = true;
  spec.statesForm.loc = valueLoc("/states");
  if (it->is_string()) {
    const std::string &s = it->get_ref<const std::string &>();
    if (s == "quantized") {
      spec.statesForm.value = StatesForm::Quantized;
      return;
    }
    if (auto st = parseStorage(s); st && isPlain(*st)) {
      spec.statesForm.value = StatesForm::Plain;
      spec.statesPlainStorage = *st;
      return;
    }
  }
  if (!it->is_object()) {
    expected("/states",
             "\"quantized\", \"f32\", \"bf16\", \"f16\" or an object mapping "
             "state names to encodings",
             *it);
    return;
  }
  spec.statesForm.value = StatesForm::PerState;
  for (const auto &[name, enc] : membersInTextOrder(*it, "/states")) {
    std::string ptr = child("/states", name);
    StateSpec state;
    state.name = name;
    state.keyLoc = keyLoc(ptr);
    state.loc = valueLoc(ptr);
    checkEncoding(*enc, ptr, state);
    spec.states.push_back(std::move(state));
  }
}

void SpecParser::checkEncoding(const json &enc, const std::string &ptr,
                               StateSpec &state) {
  if (!enc.is_object()) {
    expected(ptr, "an encoding object such as {\"storage\": \"i8\"}", enc);
    return;
  }
  checkKeys(enc, ptr, kEncodingKeys);
  std::optional<Storage> storage;
  auto s = enc.find("storage");
  if (s == enc.end()) {
    missing(ptr, "storage");
  } else if (auto name = oneOf(*s, child(ptr, "storage"), kStorages)) {
    storage = parseStorage(*name);
    state.storage = {*storage, true, valueLoc(child(ptr, "storage"))};
  }

  // Plain and elided states take no other key.
  if (storage && !isQuantized(*storage)) {
    for (const char *key : {"group", "compand", "scale"}) {
      if (enc.find(key) == enc.end())
        continue;
      error(keyLoc(child(ptr, key)),
            fmt::format("key \"{}\" is not allowed with storage \"{}\"{}; only "
                        "quantized storages (\"i8\", \"ui8\") take \"group\", "
                        "\"compand\" and \"scale\"",
                        key, spelling(*storage),
                        *storage == Storage::None ? " (an elided state)" : ""));
    }
    return;
  }

  // Quantized (or unknown) storage: check what is there.
  auto g = enc.find("group");
  if (g == enc.end()) {
    setDefault(state.group, spec.groupSize.value, ptr, "group");
  } else if (auto n = groupValue(*g, child(ptr, "group"))) {
    state.group = {*n, true, valueLoc(child(ptr, "group"))};
  } else {
    setDefault(state.group, spec.groupSize.value, ptr, "group");
  }

  auto c = enc.find("compand");
  if (c == enc.end()) {
    setDefault(state.compand,
               storage ? defaultCompand(*storage) : Compand::None, ptr,
               "compand");
  } else if (auto name = oneOf(*c, child(ptr, "compand"), kCompanders)) {
    Compand comp = *parseCompand(*name);
    state.compand = {comp, true, valueLoc(child(ptr, "compand"))};
    if (storage && comp == Compand::Softsign && *storage != Storage::I8)
      error(valueLoc(child(ptr, "compand")),
            fmt::format("compand \"softsign\" needs storage \"i8\", found "
                        "storage \"{}\"",
                        spelling(*storage)));
    if (storage && comp == Compand::Sqrt && *storage != Storage::UI8)
      error(valueLoc(child(ptr, "compand")),
            fmt::format("compand \"sqrt\" needs storage \"ui8\", found "
                        "storage \"{}\"",
                        spelling(*storage)));
  }

  auto sc = enc.find("scale");
  if (sc == enc.end()) {
    setDefault(state.scale, DType::F16, ptr, "scale");
  } else if (auto name = oneOf(*sc, child(ptr, "scale"), kScales)) {
    state.scale = {*parseDType(*name), true, valueLoc(child(ptr, "scale"))};
  }
}

void SpecParser::checkGroupConsistency() {
  // The reference: "group_size" if written and valid, else the first
  // "group" a quantized state writes, else the default.
  unsigned ref = spec.groupSize.value;
  std::string from;
  if (spec.groupSize.given) {
    from = fmt::format("{} at {}:{}", spec.groupSize.loc.path,
                       spec.groupSize.loc.line, spec.groupSize.loc.col);
  } else {
    for (const StateSpec &s : spec.states) {
      if (s.storage.given && s.quantized() && s.group.given) {
        ref = s.group.value;
        from = fmt::format("{} at {}:{}", s.group.loc.path, s.group.loc.line,
                           s.group.loc.col);
        spec.groupSize.value = ref;
        break;
      }
    }
  }
  for (StateSpec &s : spec.states) {
    if (!s.storage.given || !s.quantized())
      continue;
    if (s.group.given && s.group.value != ref)
      error(s.group.loc,
            fmt::format("all quantized states must use the same group size: "
                        "expected {} (from {}), found {}",
                        ref, from, s.group.value));
    else if (!s.group.given)
      s.group.value = ref;
  }
}

void SpecParser::checkHyper(const json &doc) {
  auto it = doc.find("hyper");
  if (it == doc.end()) {
    spec.hyperLoc = missingLoc("", "hyper");
    return;
  }
  spec.hyperLoc = valueLoc("/hyper");
  if (!it->is_object()) {
    expected("/hyper", "an object mapping hyper-parameter names to numbers",
             *it);
    return;
  }
  for (const auto &[name, v] : membersInTextOrder(*it, "/hyper")) {
    std::string ptr = child("/hyper", name);
    HyperSpec h;
    h.name = name;
    h.keyLoc = keyLoc(ptr);
    h.loc = valueLoc(ptr);
    if (v->is_boolean()) {
      h.isBool = true;
      h.value = v->get<bool>() ? 1.0 : 0.0;
    } else if (v->is_number()) {
      h.value = v->get<double>();
      if (!std::isfinite(h.value) || std::fabs(h.value) > FLT_MAX) {
        expected(ptr, "a finite number within the f32 range", *v);
        continue;
      }
    } else {
      expected(ptr, "a number or a boolean", *v);
      continue;
    }
    spec.hypers.push_back(std::move(h));
  }
}

void SpecParser::checkTargets(const json &doc) {
  auto it = doc.find("targets");
  if (it == doc.end()) {
    setDefault(spec.targets, std::vector<std::string>{"cpu"}, "", "targets");
    spec.targetLocs = {spec.targets.loc};
    return;
  }
  spec.targets.given = true;
  spec.targets.loc = valueLoc("/targets");
  if (!it->is_array() || it->empty()) {
    expected("/targets",
             fmt::format("a non-empty array of targets ({})",
                         quoteList(knownTargets())),
             *it);
    return;
  }
  std::map<std::string, SourceLoc> seen;
  for (std::size_t i = 0; i < it->size(); ++i) {
    std::string ptr = "/targets/" + std::to_string(i);
    auto t = oneOf((*it)[i], ptr, knownTargets());
    if (!t)
      continue;
    SourceLoc loc = valueLoc(ptr);
    auto [prev, inserted] = seen.emplace(*t, loc);
    if (!inserted) {
      error(loc, fmt::format("duplicate target {} (first listed at {}:{})",
                             quote(*t), prev->second.line, prev->second.col));
      continue;
    }
    spec.targets.value.push_back(*t);
    spec.targetLocs.push_back(loc);
  }
}

} // namespace

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

std::optional<Spec> parseSpecText(std::string_view text,
                                  const std::string &filename,
                                  std::vector<Diagnostic> &diags) noexcept {
  try {
    SpecParser parser(text, filename);
    return parser.run(diags);
  } catch (const std::exception &e) {
    try {
      SourceLoc loc;
      loc.file = filename;
      diags.push_back(
          makeDiag(loc, fmt::format("internal error while parsing the spec: {}",
                                    e.what())));
    } catch (...) {
    }
  } catch (...) {
    try {
      SourceLoc loc;
      loc.file = filename;
      diags.push_back(makeDiag(loc, "internal error while parsing the spec"));
    } catch (...) {
    }
  }
  return std::nullopt;
}

std::optional<Spec> parseSpecFile(const std::string &path,
                                  std::vector<Diagnostic> &diags) noexcept {
  try {
    std::string reason;
    std::optional<std::string> text = readFile(path, kMaxSpecBytes, reason);
    if (!text) {
      SourceLoc loc;
      loc.file = path;
      diags.push_back(
          makeDiag(loc, fmt::format("cannot read spec file: {}", reason)));
      return std::nullopt;
    }
    return parseSpecText(*text, path, diags);
  } catch (...) {
    try {
      SourceLoc loc;
      loc.file = path;
      diags.push_back(makeDiag(loc, "cannot read spec file"));
    } catch (...) {
    }
  }
  return std::nullopt;
}

} // namespace flashopt::spec
