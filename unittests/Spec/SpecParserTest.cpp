//===- SpecParserTest.cpp - Unit tests of the spec front end --------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Tests lib/Spec: every kind of mistake with its exact file:line:col, JSON
/// pointer and message; the model of valid specs (defaults, shorthands, text
/// order, locations); rule files resolved against the spec's directory; the
/// shipped specs; the bad inputs of test/flashopt-gen/Inputs/bad against
/// their README; and a no-crash test over truncated and mutated specs.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Spec/InputLimits.h"
#include "flashopt/Spec/JsonPositions.h"
#include "flashopt/Spec/Spec.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace flashopt::spec;
namespace fs = std::filesystem;

namespace {

struct Result {
  std::optional<Spec> spec;
  std::vector<Diagnostic> diags;
};

Result parse(std::string_view text, const std::string &file = "t.json") {
  Result r;
  r.spec = parseSpecText(text, file, r.diags);
  return r;
}

std::string allDiags(const Result &r) {
  std::string out;
  for (const Diagnostic &d : r.diags)
    out += d.str() + "\n";
  return out;
}

/// Checks that parsing failed with exactly one error, at line:col with
/// `path`, whose message contains `phrase`.
void expectOneError(const Result &r, unsigned line, unsigned col,
                    const std::string &path, const std::string &phrase) {
  INFO("diagnostics:\n" << allDiags(r));
  CHECK_FALSE(r.spec.has_value());
  REQUIRE(r.diags.size() == 1);
  const Diagnostic &d = r.diags[0];
  CHECK(d.loc.file == "t.json");
  CHECK(d.loc.line == line);
  CHECK(d.loc.col == col);
  CHECK(d.loc.path == path);
  CHECK(d.message.find(phrase) != std::string::npos);
}

std::string readText(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeText(const fs::path &p, const std::string &text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

/// The source tree (FLASHOPT_SOURCE_DIR from ctest, else the build-time
/// path), or "" if unknown.
std::string sourceDir() {
  if (const char *env = std::getenv("FLASHOPT_SOURCE_DIR"))
    return env;
#ifdef FLASHOPT_SPEC_SOURCE_DIR
  return FLASHOPT_SPEC_SOURCE_DIR;
#else
  return "";
#endif
}

/// A fresh temporary directory, removed at the end of the scope.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl =
        (fs::temp_directory_path() / "flashopt-spec-XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (char *p = ::mkdtemp(buf.data()))
      path = p;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty())
      fs::remove_all(path, ec);
  }
};

/// A valid spec using every member; line:col of interesting values noted.
const char *kFullSpec = R"({
  "name": "my_adamw",
  "description": "AdamW with mixed encodings",
  "rule": "adamw",
  "param": {"dtype": "bf16", "correction": "i16"},
  "grad": "f32",
  "group_size": 64,
  "states": {
    "exp_avg_sq": {"storage": "ui8", "group": 64, "scale": "f32"},
    "exp_avg": {"storage": "i8", "compand": "none"}
  },
  "hyper": {"lr": 0.002, "weight_decay": 0, "decouple_lr": true},
  "targets": ["cpu", "sm_90"]
}
)";

/// The smallest valid spec.
const char *kMinimalSpec = R"({
  "name": "m",
  "rule": "sgd",
  "param": {"dtype": "f16"}
}
)";

} // namespace

//===----------------------------------------------------------------------===//
// Valid specs
//===----------------------------------------------------------------------===//

TEST_CASE("a full spec fills every field with its location") {
  Result r = parse(kFullSpec);
  INFO(allDiags(r));
  REQUIRE(r.spec);
  CHECK(r.diags.empty());
  const Spec &s = *r.spec;
  CHECK(s.file == "t.json");
  CHECK(s.dir == "");
  CHECK(s.text == kFullSpec);
  CHECK(s.loc.line == 1);
  CHECK(s.loc.col == 1);

  CHECK(s.name.value == "my_adamw");
  CHECK(s.name.given);
  CHECK(s.name.loc.line == 2);
  CHECK(s.name.loc.col == 11);
  CHECK(s.name.loc.path == "/name");
  CHECK(s.description.value == "AdamW with mixed encodings");
  CHECK(s.description.loc.col == 18);

  CHECK(s.rule.builtin);
  CHECK(s.rule.name == "adamw");
  CHECK(s.rule.loc.line == 4);
  CHECK(s.rule.loc.col == 11);

  CHECK(s.paramLoc.line == 5);
  CHECK(s.paramLoc.col == 12);
  CHECK(s.paramDType.value == DType::BF16);
  CHECK(s.paramDType.loc.col == 22);
  CHECK(s.correction.value == Correction::I16);
  CHECK(s.correction.given);
  CHECK(s.correction.loc.col == 44);
  CHECK(s.correction.loc.path == "/param/correction");
  CHECK(s.grad.value == DType::F32);
  CHECK(s.grad.given);
  CHECK(s.grad.loc.line == 6);
  CHECK(s.groupSize.value == 64);
  CHECK(s.groupSize.given);
  CHECK(s.groupSize.loc.line == 7);
  CHECK(s.groupSize.loc.col == 17);

  CHECK(s.statesForm.value == StatesForm::PerState);
  CHECK(s.statesForm.loc.line == 8);
  CHECK(s.statesForm.loc.col == 13);
  REQUIRE(s.states.size() == 2);
  // Text order, not alphabetical order.
  const StateSpec &v = s.states[0];
  CHECK(v.name == "exp_avg_sq");
  CHECK(v.keyLoc.line == 9);
  CHECK(v.keyLoc.col == 5);
  CHECK(v.loc.col == 19);
  CHECK(v.quantized());
  CHECK(v.storage.value == Storage::UI8);
  CHECK(v.storage.loc.col == 31);
  CHECK(v.group.value == 64);
  CHECK(v.group.given);
  CHECK(v.group.loc.col == 47);
  CHECK(v.compand.value == Compand::Sqrt);
  CHECK_FALSE(v.compand.given);
  CHECK(v.compand.loc.path == "/states/exp_avg_sq/compand");
  CHECK(v.compand.loc.col == 19);
  CHECK(v.scale.value == DType::F32);
  CHECK(v.scale.loc.col == 60);
  const StateSpec &m = s.states[1];
  CHECK(m.name == "exp_avg");
  CHECK(m.storage.value == Storage::I8);
  CHECK(m.storage.loc.line == 10);
  CHECK(m.storage.loc.col == 28);
  CHECK(m.group.value == 64);
  CHECK_FALSE(m.group.given);
  CHECK(m.compand.value == Compand::None);
  CHECK(m.compand.given);
  CHECK(m.compand.loc.col == 45);
  CHECK(m.scale.value == DType::F16);
  CHECK_FALSE(m.scale.given);
  CHECK(s.findState("exp_avg") == &m);
  CHECK(s.findState("momentum_buffer") == nullptr);

  CHECK(s.hyperLoc.line == 12);
  CHECK(s.hyperLoc.col == 12);
  REQUIRE(s.hypers.size() == 3);
  CHECK(s.hypers[0].name == "lr");
  CHECK(s.hypers[0].value == doctest::Approx(0.002));
  CHECK(s.hypers[0].keyLoc.col == 13);
  CHECK(s.hypers[0].loc.col == 19);
  CHECK(s.hypers[1].name == "weight_decay");
  CHECK(s.hypers[1].value == 0.0);
  CHECK(s.hypers[1].loc.col == 42);
  CHECK(s.hypers[2].name == "decouple_lr");
  CHECK(s.hypers[2].value == 1.0);
  CHECK(s.hypers[2].isBool);
  CHECK(s.hypers[2].keyLoc.col == 45);
  CHECK(s.hypers[2].loc.col == 60);
  CHECK(s.hypers[2].loc.path == "/hyper/decouple_lr");
  CHECK(s.findHyper("lr") == &s.hypers[0]);
  CHECK(s.findHyper("eps") == nullptr);

  CHECK(s.targets.given);
  CHECK(s.targets.value == std::vector<std::string>{"cpu", "sm_90"});
  CHECK(s.targets.loc.line == 13);
  CHECK(s.targets.loc.col == 14);
  REQUIRE(s.targetLocs.size() == 2);
  CHECK(s.targetLocs[1].col == 22);
  CHECK(s.targetLocs[1].path == "/targets/1");
  CHECK(s.hasTarget("sm_90"));
  CHECK_FALSE(s.hasTarget("sm_80"));
}

TEST_CASE("a minimal spec gets the documented defaults") {
  Result r = parse(kMinimalSpec);
  INFO(allDiags(r));
  REQUIRE(r.spec);
  const Spec &s = *r.spec;
  CHECK(s.rule.name == "sgd");
  CHECK(s.paramDType.value == DType::F16);
  CHECK(s.correction.value == Correction::None);
  CHECK_FALSE(s.correction.given);
  // Defaults point at the enclosing object, with the member's pointer.
  CHECK(s.correction.loc.line == 4);
  CHECK(s.correction.loc.col == 12);
  CHECK(s.correction.loc.path == "/param/correction");
  CHECK(s.grad.value == DType::F16);
  CHECK_FALSE(s.grad.given);
  CHECK(s.grad.loc.line == 1);
  CHECK(s.grad.loc.col == 1);
  CHECK(s.grad.loc.path == "/grad");
  CHECK(s.groupSize.value == 32);
  CHECK_FALSE(s.groupSize.given);
  CHECK(s.statesForm.value == StatesForm::Default);
  CHECK_FALSE(s.statesForm.given);
  CHECK(s.states.empty());
  CHECK(s.hypers.empty());
  CHECK(s.hyperLoc.path == "/hyper");
  CHECK(s.targets.value == std::vector<std::string>{"cpu"});
  CHECK_FALSE(s.targets.given);
  CHECK(s.targetLocs.size() == 1);
  CHECK(s.description.value.empty());
  CHECK_FALSE(s.description.given);
}

TEST_CASE("states shorthand: quantized") {
  Result r = parse(R"({"name": "q", "rule": "adam", "param": {"dtype": "bf16"},
 "group_size": 128, "states": "quantized"})");
  INFO(allDiags(r));
  REQUIRE(r.spec);
  CHECK(r.spec->statesForm.value == StatesForm::Quantized);
  CHECK(r.spec->statesForm.given);
  CHECK(r.spec->statesForm.loc.line == 2);
  CHECK(r.spec->statesForm.loc.col == 31);
  CHECK(r.spec->groupSize.value == 128);
  CHECK(r.spec->states.empty());
}

TEST_CASE("states shorthand: plain dtypes") {
  for (auto [name, storage] :
       {std::pair{"f32", Storage::F32}, std::pair{"bf16", Storage::BF16},
        std::pair{"f16", Storage::F16}}) {
    CAPTURE(name);
    std::string text = std::string(R"({"name": "p", "rule": "lion",
 "param": {"dtype": "bf16", "correction": "i8"}, "states": ")") +
                       name + "\"}";
    Result r = parse(text);
    INFO(allDiags(r));
    REQUIRE(r.spec);
    CHECK(r.spec->statesForm.value == StatesForm::Plain);
    CHECK(r.spec->statesPlainStorage == storage);
  }
  // "none" and the quantized storages are not shorthands.
  for (const char *bad : {"none", "i8", "ui8"}) {
    CAPTURE(bad);
    Result r = parse(std::string(R"({"name": "p", "rule": "lion",
 "param": {"dtype": "bf16"}, "states": ")") +
                     bad + "\"}");
    CHECK_FALSE(r.spec);
  }
}

TEST_CASE("per-state encodings get storage defaults") {
  Result r = parse(R"({"name": "e", "rule": "sgd", "param": {"dtype": "bf16"},
  "states": {
    "b": {"storage": "ui8"},
    "a": {"storage": "i8", "scale": "bf16"},
    "c": {"storage": "none"},
    "d": {"storage": "bf16"}
  }})");
  INFO(allDiags(r));
  REQUIRE(r.spec);
  const Spec &s = *r.spec;
  REQUIRE(s.states.size() == 4);
  CHECK(s.states[0].name == "b");
  CHECK(s.states[0].compand.value == Compand::Sqrt);
  CHECK_FALSE(s.states[0].compand.given);
  CHECK(s.states[0].scale.value == DType::F16);
  CHECK(s.states[0].group.value == 32);
  CHECK(s.states[1].name == "a");
  CHECK(s.states[1].compand.value == Compand::Softsign);
  CHECK(s.states[1].scale.value == DType::BF16);
  CHECK(s.states[1].scale.given);
  CHECK(s.states[2].elided());
  CHECK_FALSE(s.states[2].quantized());
  CHECK(s.states[3].storage.value == Storage::BF16);
  CHECK(plainDType(s.states[3].storage.value) == DType::BF16);
}

TEST_CASE("without group_size the first explicit group sets the group size") {
  Result r = parse(R"({"name": "g", "rule": "adamw", "param": {"dtype": "bf16"},
  "states": {"exp_avg": {"storage": "i8"},
             "exp_avg_sq": {"storage": "ui8", "group": 16}}})");
  INFO(allDiags(r));
  REQUIRE(r.spec);
  CHECK(r.spec->groupSize.value == 16);
  CHECK_FALSE(r.spec->groupSize.given);
  CHECK(r.spec->states[0].group.value == 16);
  CHECK(r.spec->states[1].group.value == 16);
  CHECK(r.spec->states[1].group.given);
}

TEST_CASE("hyper booleans become 1 and 0") {
  Result r = parse(R"({"name": "h", "rule": "sgd", "param": {"dtype": "f32"},
  "hyper": {"nesterov": true, "momentum": 0.9, "dampening": false,
            "lr": 3, "weight_decay": -0.5e-2, "big": 18446744073709551615}})");
  INFO(allDiags(r));
  REQUIRE(r.spec);
  const auto &h = r.spec->hypers;
  REQUIRE(h.size() == 6);
  CHECK(h[0].name == "nesterov");
  CHECK(h[0].value == 1.0);
  CHECK(h[0].isBool);
  CHECK(h[1].value == doctest::Approx(0.9));
  CHECK_FALSE(h[1].isBool);
  CHECK(h[2].name == "dampening");
  CHECK(h[2].value == 0.0);
  CHECK(h[2].isBool);
  CHECK(h[3].value == 3.0);
  CHECK(h[4].value == doctest::Approx(-0.005));
  CHECK(h[5].value == doctest::Approx(1.8446744073709552e19));
}

TEST_CASE("rule files resolve against the spec file's directory") {
  TempDir tmp;
  REQUIRE(!tmp.path.empty());
  fs::create_directories(tmp.path / "specs" / "rules");
  const std::string ruleText = "flashopt.optimizer @mine param(...) {}\n";
  writeText(tmp.path / "specs" / "rules" / "mine.mlir", ruleText);
  fs::path specPath = tmp.path / "specs" / "mine.json";
  writeText(specPath,
            R"({"name": "mine", "rule": {"file": "rules/../rules/mine.mlir"},
  "param": {"dtype": "bf16"}})");
  std::vector<Diagnostic> diags;
  std::optional<Spec> s = parseSpecFile(specPath.string(), diags);
  INFO((diags.empty() ? std::string() : diags[0].str()));
  REQUIRE(s);
  CHECK_FALSE(s->rule.builtin);
  CHECK(s->rule.file == "rules/../rules/mine.mlir");
  CHECK(fs::path(s->rule.path) == tmp.path / "specs" / "rules" / "mine.mlir");
  CHECK(s->rule.text == ruleText);
  CHECK(s->rule.fileLoc.line == 1);
  CHECK(s->rule.fileLoc.col == 35);
  CHECK(s->rule.fileLoc.path == "/rule/file");
  CHECK(s->dir == (tmp.path / "specs").generic_string());

  // The same text parsed from another directory does not find the file.
  Result r = parse(readText(specPath), (tmp.path / "mine.json").string());
  REQUIRE(r.diags.size() == 1);
  CHECK(r.diags[0].loc.line == 1);
  CHECK(r.diags[0].loc.col == 35);
  CHECK(r.diags[0].message.find("not found (resolved to") != std::string::npos);
}

TEST_CASE("absolute rule file paths are used as written") {
  TempDir tmp;
  REQUIRE(!tmp.path.empty());
  fs::path rule = tmp.path / "abs.mlir";
  writeText(rule, "// rule\n");
  Result r = parse(R"({"name": "a", "rule": {"file": ")" + rule.string() +
                       R"("}, "param": {"dtype": "bf16"}})",
                   "elsewhere/t.json");
  INFO(allDiags(r));
  REQUIRE(r.spec);
  CHECK(r.spec->rule.path == rule.string());
  CHECK(r.spec->rule.text == "// rule\n");
}

TEST_CASE("error: rule file is a directory") {
  TempDir tmp;
  REQUIRE(!tmp.path.empty());
  fs::create_directories(tmp.path / "rules");
  fs::path spec = tmp.path / "s.json";
  writeText(spec, "{\"name\": \"d\",\n \"rule\": {\"file\": \"rules\"},\n"
                  " \"param\": {\"dtype\": \"bf16\"}}");
  std::vector<Diagnostic> diags;
  CHECK_FALSE(parseSpecFile(spec.string(), diags));
  REQUIRE(diags.size() == 1);
  CHECK(diags[0].loc.file == spec.string());
  CHECK(diags[0].loc.line == 2);
  CHECK(diags[0].loc.col == 19);
  CHECK(diags[0].loc.path == "/rule/file");
  CHECK(diags[0].message.find("is a directory") != std::string::npos);
}

TEST_CASE("parseSpecFile reports an unreadable spec file") {
  std::vector<Diagnostic> diags;
  CHECK_FALSE(parseSpecFile("/nonexistent/dir/spec.json", diags));
  REQUIRE(diags.size() == 1);
  CHECK(diags[0].loc.line == 0);
  CHECK(diags[0].str() ==
        "/nonexistent/dir/spec.json: error: cannot read spec file: no such "
        "file");
  // Diagnostics are appended, never cleared.
  CHECK_FALSE(parseSpecFile("/nonexistent/other.json", diags));
  CHECK(diags.size() == 2);
}

TEST_CASE("canonical JSON ignores whitespace and member order") {
  Result a = parse(R"({"name":"c","rule":"sgd","param":{"dtype":"bf16"}})");
  Result b = parse(R"({
    "param": { "dtype" : "bf16" },
    "rule": "sgd",
    "name": "c"
  })");
  REQUIRE(a.spec);
  REQUIRE(b.spec);
  CHECK(a.spec->canonicalJson == b.spec->canonicalJson);
  CHECK(a.spec->canonicalJson ==
        R"({"name":"c","param":{"dtype":"bf16"},"rule":"sgd"})");
  CHECK(a.spec->text != b.spec->text);
}

TEST_CASE("fnv1a64 matches the reference values") {
  CHECK(fnv1a64("") == 0xcbf29ce484222325ULL);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cULL);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ULL);
}

TEST_CASE("Diagnostic::str formats") {
  SourceLoc loc;
  loc.file = "specs/x.json";
  loc.line = 3;
  loc.col = 13;
  loc.path = "/param/dtype";
  CHECK(makeDiag(loc,
                 "expected one of \"bf16\", \"f16\", \"f32\", found \"bf32\"")
            .str() == "specs/x.json:3:13: error: /param/dtype: expected one "
                      "of \"bf16\", \"f16\", \"f32\", found \"bf32\"");
  loc.path.clear();
  CHECK(makeDiag(loc, "m").str() == "specs/x.json:3:13: error: m");
  loc.line = loc.col = 0;
  CHECK(makeDiag(loc, "m").str() == "specs/x.json: error: m");
}

TEST_CASE("enum spellings round-trip") {
  for (DType d : {DType::BF16, DType::F16, DType::F32})
    CHECK(parseDType(spelling(d)) == d);
  for (Correction c : {Correction::None, Correction::I8, Correction::I16})
    CHECK(parseCorrection(spelling(c)) == c);
  for (Storage s : {Storage::I8, Storage::UI8, Storage::F32, Storage::BF16,
                    Storage::F16, Storage::None})
    CHECK(parseStorage(spelling(s)) == s);
  for (Compand c : {Compand::None, Compand::Softsign, Compand::Sqrt})
    CHECK(parseCompand(spelling(c)) == c);
  CHECK_FALSE(parseDType("f64"));
  CHECK(isQuantized(Storage::UI8));
  CHECK_FALSE(isQuantized(Storage::None));
  CHECK(isPlain(Storage::F16));
  CHECK_FALSE(isPlain(Storage::None));
  CHECK(defaultCompand(Storage::I8) == Compand::Softsign);
  CHECK(defaultCompand(Storage::UI8) == Compand::Sqrt);
  CHECK(builtinRuleNames().size() == 5);
  CHECK(knownTargets().size() == 4);
}

TEST_CASE("JsonPositions maps pointers, escapes and duplicates") {
  std::string text = "{\"a/b\": {\"~\": [10, {\"x\": null}]},\n"
                     " \"\\u00e9\\ud83d\\ude00\": 1,\n"
                     " \"k\": {\"old\": 1}, \"k\": {\"new\": 2}}";
  JsonPositions p = JsonPositions::build(text);
  CHECK(p.complete());
  const JsonPosEntry *e = p.lookup("/a~1b/~0/1/x");
  REQUIRE(e);
  CHECK(e->value.line == 1);
  CHECK(e->value.col == 26);
  CHECK(e->key.col == 21);
  CHECK(e->hasKey);
  const JsonPosEntry *arr = p.lookup("/a~1b/~0/0");
  REQUIRE(arr);
  CHECK_FALSE(arr->hasKey);
  CHECK(arr->value.col == 16);
  const JsonPosEntry *u = p.lookup("/\xc3\xa9\xf0\x9f\x98\x80");
  REQUIRE(u);
  CHECK(u->key.line == 2);
  CHECK(u->key.col == 2);
  // The last duplicate wins, and the first one's members are forgotten.
  REQUIRE(p.duplicates().size() == 1);
  CHECK(p.duplicates()[0].pointer == "/k");
  CHECK(p.duplicates()[0].at.line == 3);
  CHECK(p.duplicates()[0].at.col == 19);
  CHECK(p.duplicates()[0].first.col == 2);
  CHECK(p.lookup("/k/old") == nullptr);
  CHECK(p.lookup("/k/new") != nullptr);
  CHECK(JsonPositions::escapeToken("a~/b") == "a~0~1b");
}

TEST_CASE("LineTable counts bytes and clamps") {
  LineTable t("ab\ncd\n");
  CHECK(t.at(0).line == 1);
  CHECK(t.at(0).col == 1);
  CHECK(t.at(2).col == 3);
  CHECK(t.at(3).line == 2);
  CHECK(t.at(4).col == 2);
  CHECK(t.at(6).line == 3);
  CHECK(t.at(6).col == 1);
  CHECK(t.at(1000).offset == 6);
}

//===----------------------------------------------------------------------===//
// Mistakes, one kind per test case
//===----------------------------------------------------------------------===//

namespace {
/// Lines 1-4 of a valid spec; the member under test goes on line 5, col 3.
std::string withMember(const std::string &member) {
  return "{\n  \"name\": \"t\",\n  \"rule\": \"adamw\",\n"
         "  \"param\": {\"dtype\": \"bf16\"},\n  " +
         member + "\n}\n";
}
/// A spec whose "name" (line 2), "rule" (line 3) and "param" (line 4) values
/// are given.
std::string withValues(const std::string &name, const std::string &rule,
                       const std::string &param) {
  return "{\n  \"name\": " + name + ",\n  \"rule\": " + rule +
         ",\n  \"param\": " + param + "\n}\n";
}
} // namespace

TEST_CASE("the helpers build valid specs") {
  Result a = parse(withMember(R"("grad": "bf16")"));
  CHECK(a.spec);
  Result b = parse(withValues(R"("t")", R"("adamw")", R"({"dtype": "bf16"})"));
  CHECK(b.spec);
}

TEST_CASE("error: JSON syntax") {
  std::string text = "{\n  \"name\": \"t\",\n  \"rule\": \"adamw\",\n"
                     "  \"param\": {\"dtype\": \"bf16\"},\n}\n";
  expectOneError(parse(text), 5, 1, "", "invalid JSON: syntax error");
  expectOneError(parse(""), 1, 1, "", "unexpected end of input");
  expectOneError(parse("{\"name\": tru}"), 1, 13, "", "invalid literal");
  expectOneError(parse("{} {}"), 1, 4, "", "expected end of input");
}

TEST_CASE("error: number overflow") {
  expectOneError(parse(withMember(R"("hyper": {"lr": 1e400})")), 5, 19, "",
                 "number overflow parsing '1e400'");
}

TEST_CASE("error: top level is not an object") {
  expectOneError(parse("\n  [1, 2]"), 2, 3, "",
                 "expected a JSON object at the top level, found an array");
}

TEST_CASE("error: unknown key") {
  Result r = parse(withMember(R"("hypers": {})"));
  expectOneError(r, 5, 3, "/hypers", "unknown key \"hypers\"; expected one of");
  CHECK(r.diags[0].message.find("(did you mean \"hyper\"?)") !=
        std::string::npos);
  // No suggestion when nothing is close.
  Result far = parse(withMember(R"("zzzzzz": 1)"));
  expectOneError(far, 5, 3, "/zzzzzz", "unknown key \"zzzzzz\"");
  CHECK(far.diags[0].message.find("did you mean") == std::string::npos);
}

TEST_CASE("error: duplicate key") {
  expectOneError(parse(withMember(R"("rule": "sgd")")), 5, 3, "/rule",
                 "duplicate key \"rule\" (first defined at 3:3)");
}

TEST_CASE("error: missing name") {
  expectOneError(parse("{\n  \"rule\": \"adamw\",\n  \"param\": {\"dtype\": "
                       "\"bf16\"}\n}\n"),
                 1, 1, "/name", "missing required key \"name\"");
}

TEST_CASE("error: name is not an identifier") {
  expectOneError(
      parse(withValues(R"("2fast")", R"("adamw")", R"({"dtype": "bf16"})")), 2,
      11, "/name",
      "expected an identifier ([A-Za-z_][A-Za-z0-9_]*), found "
      "\"2fast\"");
}

TEST_CASE("error: name is not a string") {
  expectOneError(parse(withValues("7", R"("adamw")", R"({"dtype": "bf16"})")),
                 2, 11, "/name", "expected a string, found number 7");
}

TEST_CASE("error: unknown built-in rule") {
  expectOneError(
      parse(withValues(R"("t")", R"("adamx")", R"({"dtype": "bf16"})")), 3, 11,
      "/rule", "expected a built-in rule (\"sgd\", ");
}

TEST_CASE("error: rule file not found") {
  expectOneError(parse(withValues(R"("t")", R"({"file": "nope.mlir"})",
                                  R"({"dtype": "bf16"})")),
                 3, 20, "/rule/file", "rule file \"nope.mlir\" not found");
}

TEST_CASE("error: rule object without file") {
  Result r = parse(
      withValues(R"("t")", R"({"path": "x.mlir"})", R"({"dtype": "bf16"})"));
  CHECK_FALSE(r.spec);
  REQUIRE(r.diags.size() == 2);
  CHECK(r.diags[0].loc.line == 3);
  CHECK(r.diags[0].loc.col == 11);
  CHECK(r.diags[0].loc.path == "/rule/file");
  CHECK(r.diags[0].message == "missing required key \"file\"");
  CHECK(r.diags[1].loc.col == 12);
  CHECK(r.diags[1].loc.path == "/rule/path");
  CHECK(r.diags[1].message.find("unknown key \"path\"") != std::string::npos);
}

TEST_CASE("error: missing param") {
  expectOneError(parse("{\n  \"name\": \"t\",\n  \"rule\": \"adamw\"\n}\n"), 1,
                 1, "/param", "missing required key \"param\"");
}

TEST_CASE("error: param is not an object") {
  expectOneError(parse(withValues(R"("t")", R"("adamw")", R"("bf16")")), 4, 12,
                 "/param", "expected an object {\"dtype\": ..., ");
}

TEST_CASE("error: bad param dtype") {
  Result r = parse(withValues(R"("t")", R"("adamw")", R"({"dtype": "bf32"})"));
  expectOneError(r, 4, 22, "/param/dtype",
                 "expected one of \"bf16\", \"f16\", \"f32\", found \"bf32\"");
  CHECK(r.diags[0].str() ==
        "t.json:4:22: error: /param/dtype: expected one of \"bf16\", \"f16\", "
        "\"f32\", found \"bf32\"");
}

TEST_CASE("error: missing param dtype") {
  expectOneError(
      parse(withValues(R"("t")", R"("adamw")", R"({"correction": "i8"})")), 4,
      12, "/param/dtype", "missing required key \"dtype\"");
}

TEST_CASE("error: bad correction") {
  expectOneError(parse(withValues(R"("t")", R"("adamw")",
                                  R"({"dtype": "bf16", "correction": "i32"})")),
                 4, 44, "/param/correction",
                 "expected one of \"none\", \"i8\", \"i16\", found \"i32\"");
}

TEST_CASE("error: f32 parameter with a correction") {
  expectOneError(parse(withValues(R"("t")", R"("adamw")",
                                  R"({"dtype": "f32", "correction": "i16"})")),
                 4, 43, "/param/correction",
                 "expected \"none\" with an f32 parameter");
  // f32 with an explicit "none" is fine.
  CHECK(parse(withValues(R"("t")", R"("adamw")",
                         R"({"dtype": "f32", "correction": "none"})"))
            .spec);
}

TEST_CASE("error: bad grad dtype") {
  expectOneError(parse(withMember(R"("grad": "f64")")), 5, 11, "/grad",
                 "expected one of \"bf16\", \"f16\", \"f32\", found \"f64\"");
}

TEST_CASE("error: group_size not a power of two in [16, 128]") {
  expectOneError(parse(withMember(R"("group_size": 48)")), 5, 17, "/group_size",
                 "expected a power of two in [16, 128], found number 48");
  expectOneError(parse(withMember(R"("group_size": 256)")), 5, 17,
                 "/group_size", "found number 256");
  expectOneError(parse(withMember(R"("group_size": 8)")), 5, 17, "/group_size",
                 "found number 8");
  expectOneError(parse(withMember(R"("group_size": -32)")), 5, 17,
                 "/group_size", "found number -32");
  CHECK(parse(withMember(R"("group_size": 16.0)")).spec);
}

TEST_CASE("error: group_size not an integer") {
  expectOneError(parse(withMember(R"("group_size": "32")")), 5, 17,
                 "/group_size", "expected an integer, a power of two");
  expectOneError(parse(withMember(R"("group_size": 32.5)")), 5, 17,
                 "/group_size", "found number 32.5");
  expectOneError(parse(withMember(R"("group_size": true)")), 5, 17,
                 "/group_size", "found boolean true");
}

TEST_CASE("error: bad states shorthand") {
  expectOneError(parse(withMember(R"("states": "int8")")), 5, 13, "/states",
                 "expected \"quantized\", \"quantized4\", \"f32\", \"bf16\", "
                 "\"f16\" or an object mapping state names to encodings, found "
                 "\"int8\"");
}

TEST_CASE("error: state encoding is not an object") {
  expectOneError(parse(withMember(R"("states": {"exp_avg": "i8"})")), 5, 25,
                 "/states/exp_avg",
                 "expected an encoding object such as {\"storage\": \"i8\"}, "
                 "found \"i8\"");
}

TEST_CASE("error: missing storage") {
  expectOneError(
      parse(withMember(R"("states": {"exp_avg": {"compand": "softsign"}})")), 5,
      25, "/states/exp_avg/storage", "missing required key \"storage\"");
}

TEST_CASE("error: bad storage") {
  expectOneError(
      parse(withMember(R"("states": {"exp_avg": {"storage": "int8"}})")), 5, 37,
      "/states/exp_avg/storage",
      "expected one of \"i8\", \"ui8\", \"i4\", \"ui4\", \"f32\", \"bf16\", "
      "\"f16\", \"none\", found \"int8\"");
}

TEST_CASE("error: quantization key with a plain storage") {
  expectOneError(
      parse(withMember(
          R"("states": {"exp_avg": {"storage": "bf16", "group": 32}})")),
      5, 45, "/states/exp_avg/group",
      "key \"group\" is not allowed with storage \"bf16\"");
}

TEST_CASE("error: quantization key with an elided state") {
  expectOneError(
      parse(withMember(
          R"("states": {"exp_avg": {"storage": "none", "compand": "none"}})")),
      5, 45, "/states/exp_avg/compand",
      "key \"compand\" is not allowed with storage \"none\" (an elided state)");
}

TEST_CASE("error: compander does not fit the storage") {
  expectOneError(
      parse(withMember(
          R"("states": {"exp_avg_sq": {"storage": "ui8", "compand": "softsign"}})")),
      5, 58, "/states/exp_avg_sq/compand",
      "compand \"softsign\" needs storage \"i8\", found storage \"ui8\"");
  // "none" fits both.
  CHECK(
      parse(
          withMember(
              R"("states": {"exp_avg_sq": {"storage": "ui8", "compand": "none"}})"))
          .spec);
}

TEST_CASE("error: bad scale dtype") {
  expectOneError(
      parse(withMember(
          R"("states": {"exp_avg": {"storage": "i8", "scale": "f64"}})")),
      5, 52, "/states/exp_avg/scale",
      "expected one of \"f16\", \"bf16\", \"f32\", found \"f64\"");
}

TEST_CASE("error: quantized states with different group sizes") {
  expectOneError(
      parse(withMember(
          R"("states": {"exp_avg": {"storage": "i8", "group": 64}, "exp_avg_sq": {"storage": "ui8", "group": 128}})")),
      5, 99, "/states/exp_avg_sq/group",
      "all quantized states must use the same group size: expected 64 (from "
      "/states/exp_avg/group at 5:52), found 128");
  // Against group_size.
  Result r =
      parse("{\"name\": \"t\", \"rule\": \"adamw\", \"param\": {\"dtype\": "
            "\"bf16\"},\n \"group_size\": 64,\n \"states\": {\"exp_avg\": "
            "{\"storage\": \"i8\", \"group\": 32}}}");
  expectOneError(r, 3, 51, "/states/exp_avg/group",
                 "expected 64 (from /group_size at 2:16), found 32");
}

TEST_CASE("error: unknown key in an encoding") {
  Result r = parse(
      withMember(R"("states": {"exp_avg": {"storage": "i8", "groups": 32}})"));
  expectOneError(r, 5, 43, "/states/exp_avg/groups",
                 "unknown key \"groups\"; expected one of \"storage\", "
                 "\"group\", \"compand\", \"scale\"");
  CHECK(r.diags[0].message.find("did you mean \"group\"") != std::string::npos);
}

TEST_CASE("error: unknown key in param") {
  expectOneError(parse(withValues(R"("t")", R"("adamw")",
                                  R"({"dtype": "bf16", "dtpye": "f16"})")),
                 4, 30, "/param/dtpye", "(did you mean \"dtype\"?)");
}

TEST_CASE("error: hyper is not an object") {
  expectOneError(parse(withMember(R"("hyper": [0.1])")), 5, 12, "/hyper",
                 "expected an object mapping hyper-parameter names to "
                 "numbers, found an array");
}

TEST_CASE("error: hyper value is not a number") {
  expectOneError(parse(withMember(R"("hyper": {"lr": null})")), 5, 19,
                 "/hyper/lr", "expected a number or a boolean, found null");
  expectOneError(parse(withMember(R"("hyper": {"lr": "1e-3"})")), 5, 19,
                 "/hyper/lr", "found \"1e-3\"");
}

TEST_CASE("error: hyper value outside the f32 range") {
  expectOneError(parse(withMember(R"("hyper": {"lr": -1e39})")), 5, 19,
                 "/hyper/lr",
                 "expected a finite number within the f32 range, found "
                 "number -1e+39");
}

TEST_CASE("error: empty targets") {
  expectOneError(parse(withMember(R"("targets": [])")), 5, 14, "/targets",
                 "expected a non-empty array of targets (\"cpu\", \"sm_80\", "
                 "\"sm_90\", \"sm_100\"), found an empty array");
}

TEST_CASE("error: targets is not an array") {
  expectOneError(parse(withMember(R"("targets": "cpu")")), 5, 14, "/targets",
                 "found \"cpu\"");
}

TEST_CASE("error: unknown target") {
  expectOneError(parse(withMember(R"("targets": ["cpu", "sm_86"])")), 5, 22,
                 "/targets/1",
                 "expected one of \"cpu\", \"sm_80\", \"sm_90\", \"sm_100\", "
                 "found \"sm_86\"");
}

TEST_CASE("error: duplicate target") {
  expectOneError(parse(withMember(R"("targets": ["sm_90", "cpu", "sm_90"])")),
                 5, 31, "/targets/2",
                 "duplicate target \"sm_90\" (first listed at 5:15)");
}

TEST_CASE("error: description is not a string") {
  expectOneError(parse(withMember(R"("description": ["a"])")), 5, 18,
                 "/description", "expected a string, found an array");
}

TEST_CASE("error: nesting too deep") {
  std::string deep = std::string(70, '[') + std::string(70, ']');
  Result r = parse(withMember("\"hyper\": {\"lr\": " + deep + "}"));
  std::string path = "/hyper/lr";
  for (int i = 0; i < 62; ++i)
    path += "/0";
  expectOneError(r, 5, 81, path, "nested too deeply: more than 64 levels");
  // Very deep input is refused without recursion trouble.
  std::string huge = std::string(100000, '[') + std::string(100000, ']');
  Result h = parse(huge);
  CHECK_FALSE(h.spec);
  REQUIRE(h.diags.size() == 1);
  CHECK(h.diags[0].loc.col == 65);
}

TEST_CASE("errors are collected, sorted by position") {
  Result r = parse(R"({
  "name": "bad name",
  "rule": "adamw",
  "param": {"dtype": "f64", "extra": 1},
  "unknown1": 1,
  "unknown2": 2,
  "targets": ["gpu"]
})");
  CHECK_FALSE(r.spec);
  INFO(allDiags(r));
  REQUIRE(r.diags.size() == 6);
  CHECK(r.diags[0].loc.path == "/name");
  CHECK(r.diags[1].loc.path == "/param/dtype");
  CHECK(r.diags[2].loc.path == "/param/extra");
  CHECK(r.diags[3].loc.path == "/unknown1");
  CHECK(r.diags[4].loc.path == "/unknown2");
  CHECK(r.diags[5].loc.path == "/targets/0");
  for (std::size_t i = 1; i < r.diags.size(); ++i)
    CHECK(std::make_pair(r.diags[i - 1].loc.line, r.diags[i - 1].loc.col) <
          std::make_pair(r.diags[i].loc.line, r.diags[i].loc.col));
}

TEST_CASE("too many errors are capped") {
  std::string text =
      "{\"name\": \"t\", \"rule\": \"sgd\", \"param\": {\"dtype\": "
      "\"bf16\"}, \"targets\": [";
  for (int i = 0; i < 200; ++i)
    text += (i ? ", " : "") + std::string("\"x\"");
  text += "]}";
  Result r = parse(text);
  CHECK_FALSE(r.spec);
  REQUIRE(r.diags.size() == 51);
  CHECK(r.diags.back().message.find("too many errors (200 in all)") !=
        std::string::npos);
}

//===----------------------------------------------------------------------===//
// Shipped specs and the bad inputs
//===----------------------------------------------------------------------===//

TEST_CASE("every shipped spec parses cleanly") {
  std::string src = sourceDir();
  if (src.empty()) {
    MESSAGE("FLASHOPT_SOURCE_DIR unknown; skipped");
    return;
  }
  std::vector<fs::path> files;
  for (const auto &e : fs::directory_iterator(fs::path(src) / "specs"))
    if (e.path().extension() == ".json")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  // specs/generate.py: 5 rules x 7 parameter modes x {8-bit, f32 states}
  // x {exact, fast}, plus FlashOptim's numerics where they differ, plus 4-bit
  // states for 5 rules x {bf16 + 24-bit exact and fast, f32 exact} (bounded).
  CHECK(files.size() == 204);
  for (const fs::path &f : files) {
    CAPTURE(f.string());
    std::vector<Diagnostic> diags;
    std::optional<Spec> s = parseSpecFile(f.string(), diags);
    INFO((diags.empty() ? std::string() : diags[0].str()));
    REQUIRE(s);
    std::string stem = f.stem().string();
    CHECK(s->name.value == stem);
    CHECK(s->rule.builtin);
    CHECK(stem.rfind(s->rule.name + "_", 0) == 0);
    CHECK_FALSE(s->description.value.empty());
    CHECK(s->description.value.find('\n') == std::string::npos);
    CHECK(s->targets.value ==
          std::vector<std::string>{"cpu", "sm_80", "sm_90", "sm_100"});
    std::string variant = stem.substr(s->rule.name.size() + 1);
    auto dropSuffix = [&](const std::string &suffix) {
      bool has = variant.size() > suffix.size() &&
                 variant.compare(variant.size() - suffix.size(),
                                 suffix.size(), suffix) == 0;
      if (has)
        variant.resize(variant.size() - suffix.size());
      return has;
    };
    bool flashoptim = dropSuffix("_flashoptim");
    bool fast = dropSuffix("_fast");
    CHECK(s->numerics.value ==
          (flashoptim ? NumericsMode::FlashOptim : NumericsMode::Bounded));
    CHECK(s->arithmetic.value == (fast ? Arithmetic::Fast : Arithmetic::Exact));
    CHECK_FALSE((flashoptim && fast));
    if (variant.size() > 10 &&
        variant.compare(variant.size() - 10, 10, "_f32states") == 0) {
      CHECK(s->statesForm.value == StatesForm::Plain);
      CHECK(s->statesPlainStorage == Storage::F32);
    } else if (variant.size() > 5 &&
               variant.compare(variant.size() - 5, 5, "_4bit") == 0) {
      CHECK(s->statesForm.value == StatesForm::Quantized4);
      // Fast 4-bit only with bf16 parameters and 24-bit masters.
      CHECK((!fast || variant.rfind("bf16_m24", 0) == 0));
      CHECK_FALSE(flashoptim);
    } else {
      CHECK(s->statesForm.value == StatesForm::Quantized);
    }
    DType p = variant.rfind("f32", 0) == 0   ? DType::F32
              : variant.rfind("f16", 0) == 0 ? DType::F16
                                             : DType::BF16;
    CHECK(s->paramDType.value == p);
    CHECK(s->grad.value == p);
    Correction c = variant.find("m24") != std::string::npos ? Correction::I8
                   : variant.find("m32") != std::string::npos
                       ? Correction::I16
                       : Correction::None;
    CHECK(s->correction.value == c);
  }
}

TEST_CASE("every bad input fails with the error its README lists") {
  std::string src = sourceDir();
  if (src.empty()) {
    MESSAGE("FLASHOPT_SOURCE_DIR unknown; skipped");
    return;
  }
  const std::string rel = "test/flashopt-gen/Inputs/bad/";
  fs::path dir = fs::path(src) / rel;
  std::string readme = readText(dir / "README.md");
  REQUIRE_FALSE(readme.empty());
  std::vector<fs::path> files;
  for (const auto &e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  CHECK(files.size() >= 16);
  for (const fs::path &f : files) {
    std::string name = rel + f.filename().string();
    CAPTURE(name);
    // Parsed as `flashopt-gen test/flashopt-gen/Inputs/bad/<file>` would from
    // the source root (rule files resolve against that relative path).
    Result r;
    r.spec = parseSpecText(readText(f), name, r.diags);
    CHECK_FALSE(r.spec);
    REQUIRE(r.diags.size() == 1);
    std::string got = r.diags[0].str();
    std::string expected;
    std::istringstream lines(readme);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind(name + ":", 0) == 0)
        expected = line;
    CHECK(got == expected);
  }
}

//===----------------------------------------------------------------------===//
// Robustness
//===----------------------------------------------------------------------===//

namespace {
void checkInvariants(std::string_view text) {
  Result r = parse(text);
  CHECK(r.spec.has_value() == r.diags.empty());
  for (const Diagnostic &d : r.diags) {
    CHECK(d.loc.file == "t.json");
    CHECK(d.loc.line >= 1);
    CHECK(d.loc.col >= 1);
    CHECK_FALSE(d.message.empty());
  }
  if (r.spec) {
    CHECK_FALSE(r.spec->name.value.empty());
    CHECK_FALSE(r.spec->canonicalJson.empty());
  }
  JsonPositions::build(text); // never crashes on its own either
}
} // namespace

TEST_CASE("truncated and mutated specs never crash") {
  const std::string base = kFullSpec;
  for (std::size_t n = 0; n <= base.size(); ++n)
    checkInvariants(std::string_view(base).substr(0, n));

  const std::vector<std::string> tokens = {
      "{",
      "}",
      "[",
      "]",
      "\"",
      ",",
      ":",
      "1e400",
      "true",
      "null",
      "\\u0000",
      "\\ud800",
      "\xff",
      "\xc3",
      "\"name\": \"x\",",
      "\n",
      "-",
      "0x1",
      "\\",
      "\"states\": {\"a\": {\"storage\": \"i8\", \"group\": 64}}",
      "[[[[[[[[",
      "\"hyper\": {\"lr\": 1e39},",
      "\"targets\": [],",
      "\t",
      " "};
  std::mt19937 rng(20240607);
  auto pick = [&](std::size_t n) {
    return n == 0 ? 0
                  : std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  std::size_t accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = base;
    int edits = 1 + static_cast<int>(pick(3));
    for (int k = 0; k < edits; ++k) {
      std::size_t at = pick(text.size() + 1);
      switch (pick(4)) {
      case 0: // replace a byte
        if (!text.empty())
          text[std::min(at, text.size() - 1)] = static_cast<char>(pick(256));
        break;
      case 1: // delete a range
        text.erase(std::min(at, text.size()), pick(8));
        break;
      case 2: // insert a token
        text.insert(std::min(at, text.size()), tokens[pick(tokens.size())]);
        break;
      default: { // duplicate a slice
        std::size_t from = pick(text.size() + 1);
        std::string slice = text.substr(from, pick(40));
        text.insert(std::min(at, text.size()), slice);
        break;
      }
      }
    }
    Result r = parse(text);
    accepted += r.spec ? 1 : 0;
    checkInvariants(text);
  }
  MESSAGE("mutated specs accepted: " << accepted << " of 3000");

  // Random bytes.
  for (int iter = 0; iter < 500; ++iter) {
    std::string text(pick(200), '\0');
    for (char &c : text)
      c = static_cast<char>(pick(256));
    checkInvariants(text);
  }
}

TEST_CASE("dialect nesting pre-scan (InputLimits.h)") {
  using flashopt::spec::findExcessiveNesting;
  // 256 levels pass, 257 fail at the 257th bracket.
  CHECK(!findExcessiveNesting(std::string(256, '(')));
  auto v = findExcessiveNesting("x\n  " + std::string(300, '{'));
  REQUIRE(v);
  CHECK(v->line == 2);
  CHECK(v->column == 3 + 256);
  CHECK(v->message.find("nesting deeper than 256") != std::string::npos);
  // Closing brackets unwind; "->" is not one; strings and // comments are
  // not scanned.
  std::string balanced;
  for (int i = 0; i < 1000; ++i)
    balanced += "(x) -> (y) {} [<>] ";
  CHECK(!findExcessiveNesting(balanced));
  std::string arrows;
  for (int i = 0; i < 200; ++i)
    arrows += "( -> ";
  CHECK(!findExcessiveNesting(arrows)); // 200 open, none closed by "->"
  CHECK(findExcessiveNesting(arrows + arrows));
  CHECK(!findExcessiveNesting("\"" + std::string(1000, '(') + "\""));
  CHECK(!findExcessiveNesting("\"\\\"" + std::string(1000, '(') + "\""));
  CHECK(!findExcessiveNesting("// " + std::string(1000, '[') + "\nx"));
  // A string does not run past its line.
  auto w = findExcessiveNesting("\"open\n" + std::string(257, '('));
  REQUIRE(w);
  CHECK(w->line == 2);
  CHECK(findExcessiveNesting(std::string(20000, '(')));
}
