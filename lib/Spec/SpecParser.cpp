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
///      every error with its location, and the Spec model is filled in
///      (the top-level members here; "states", "hyper" and "targets" in
///      SpecParserStates.cpp; the messages' wording in SpecText.cpp).
/// Exceptions (nlohmann throws; so can allocation) are caught by the entry
/// points at the end of this file: none leaves the spec library.
///
//===----------------------------------------------------------------------===//

#include "SpecParserImpl.h"

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

namespace detail {

//===----------------------------------------------------------------------===//
// The parser (the states, hyper-parameters and targets: SpecParserStates.cpp)
//===----------------------------------------------------------------------===//

namespace {

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

} // namespace

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
    checkNumerics(doc);
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

void SpecParser::checkNumerics(const json &doc) {
  auto it = doc.find("numerics");
  if (it == doc.end()) {
    setDefault(spec.numerics, NumericsMode::Bounded, "", "numerics");
    return;
  }
  auto s = oneOf(*it, "/numerics", kNumerics);
  if (!s)
    return;
  spec.numerics = {*s == "flashoptim" ? NumericsMode::FlashOptim
                                      : NumericsMode::Bounded,
                   true, valueLoc("/numerics")};
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

} // namespace detail

using detail::kMaxSpecBytes;
using detail::readFile;
using detail::SpecParser;

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
