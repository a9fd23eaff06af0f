//===- Spec.h - Optimizer spec files: model and parser ----------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The spec front end: a spec file (one JSON object, docs/SPEC.md) is parsed
/// and checked against the schema, and becomes a `Spec` — every field with
/// its value, whether it was written, and where (file:line:col plus the JSON
/// pointer), so that later stages which see the rule (unknown state or
/// hyper-parameter names, eliding a non-elidable state) can report located
/// errors too.
///
/// This library is plain C++17 with no MLIR/LLVM dependency. It uses
/// nlohmann/json and exceptions internally, but no exception leaves its API:
/// the parse functions are noexcept and report every problem, including
/// internal ones, as `Diagnostic`s; the small helpers throw nothing but
/// std::bad_alloc. Callers may be built with -fno-exceptions.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_SPEC_SPEC_H
#define FLASHOPT_SPEC_SPEC_H

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashopt::spec {

//===----------------------------------------------------------------------===//
// Locations and diagnostics
//===----------------------------------------------------------------------===//

/// Where something is written in a spec file.
struct SourceLoc {
  /// The spec file's path, as given to the parser.
  std::string file;
  /// 1-based line; 0 when there is no position (e.g. an unreadable file).
  unsigned line = 0;
  /// 1-based column, counted in bytes; 0 when there is no position.
  unsigned col = 0;
  /// JSON pointer (RFC 6901) of the value concerned, e.g. "/param/dtype";
  /// "" for the whole document.
  std::string path;

  /// Whether the location has a line:col.
  bool hasPosition() const { return line != 0; }
};

/// One error found in a spec.
struct Diagnostic {
  /// Where the error is.
  SourceLoc loc;
  /// What was expected and what was found (no location, no "error:").
  std::string message;

  /// The diagnostic as one line:
  /// "file:line:col: error: /json/pointer: message". The ":line:col" part is
  /// left out when the location has no position, the "/json/pointer: " part
  /// when the path is empty; an empty file name prints as "<spec>".
  std::string str() const;
};

/// Makes a diagnostic at `loc` with `msg`.
Diagnostic makeDiag(const SourceLoc &loc, std::string msg);

/// 64-bit FNV-1a hash of `data` (spec hashes in manifests).
uint64_t fnv1a64(std::string_view data);

//===----------------------------------------------------------------------===//
// Enumerations
//===----------------------------------------------------------------------===//

/// A floating-point element type: parameters, gradients, plain states and
/// quantization scales.
enum class DType { BF16, F16, F32 };

/// The correction term of the master weight (docs/NUMERICS.md §1).
enum class Correction { None, I8, I16 };

/// The gradient accumulator's encoding (docs/NUMERICS.md §6, docs/SPEC.md
/// "accumulator"): none (the optimizer cannot accumulate), f32, bf16 with an
/// i8 correction term (the master-weight split of §1, 3 B/param), bf16.
enum class Accumulator { None, F32, BF16I8, BF16 };

/// The spelling used in spec files ("none", "f32", "bf16+i8", "bf16").
const char *spelling(Accumulator v) noexcept;

/// The kernels' arithmetic (docs/SPEC.md "arithmetic", docs/NUMERICS.md §7):
/// IEEE division and square root (the default), or the portable fast mode.
enum class Arithmetic { Exact, Fast };

/// The spelling used in spec files ("exact", "fast").
const char *spelling(Arithmetic v) noexcept;

/// The state numerics (docs/SPEC.md "numerics", docs/NUMERICS.md §8): the
/// bounded numerics (the default: dithered state codes, Adam's moment
/// bound) or FlashOptim's, bit-identical to its kernels.
enum class NumericsMode { Bounded, FlashOptim };

/// The spelling used in spec files ("bounded", "flashoptim").
const char *spelling(NumericsMode v) noexcept;

/// How a state is stored: quantized codes (I8, UI8), plain floats (F32, BF16,
/// F16), or not at all (None: the state is elided).
enum class Storage { I8, UI8, F32, BF16, F16, None, I4, UI4 };

/// The companding function of a quantized state (docs/NUMERICS.md §2): the
/// linear codes of FlashOptim (None, Softsign, Sqrt) or the minifloat codes
/// (E3M4: signed, E4M4: unsigned; §2d), and the 4-bit minifloat codes
/// (E2M1, E3M0: signed, i4; E3M1, E4M0: unsigned, ui4; §2e).
enum class Compand { None, Softsign, Sqrt, E3M4, E4M4, E2M1, E3M0, E3M1, E4M0 };

/// How the "states" member was written.
enum class StatesForm {
  /// No "states" member: every state keeps the rule's default encoding.
  Default,
  /// "states": "quantized" — every state keeps the rule's default quantized
  /// encoding (with the spec's group size).
  Quantized,
  /// "states": "quantized4" — every state whose rule default is quantized in
  /// the 4-bit code of its signedness (i4 e2m1 or ui4 e3m1, bf16 scales,
  /// the spec's group size; docs/NUMERICS.md §2e).
  Quantized4,
  /// "states": "f32" | "bf16" | "f16" — every state plain of that dtype.
  Plain,
  /// "states": {...} — per-state encodings; states not listed keep the
  /// rule's default encoding.
  PerState,
};

/// The spelling used in spec files ("bf16", "f16", "f32").
const char *spelling(DType v) noexcept;
/// The spelling used in spec files ("none", "i8", "i16").
const char *spelling(Correction v) noexcept;
/// The spelling used in spec files ("i8", "ui8", "f32", "bf16", "f16",
/// "none").
const char *spelling(Storage v) noexcept;
/// The spelling used in spec files ("none", "softsign", "sqrt", "e3m4",
/// "e4m4").
const char *spelling(Compand v) noexcept;

/// Parses a dtype spelling; nullopt if it is not one.
std::optional<DType> parseDType(std::string_view s) noexcept;
/// Parses a correction spelling; nullopt if it is not one.
std::optional<Correction> parseCorrection(std::string_view s) noexcept;
/// Parses a storage spelling; nullopt if it is not one.
std::optional<Storage> parseStorage(std::string_view s) noexcept;
/// Parses a compander spelling; nullopt if it is not one.
std::optional<Compand> parseCompand(std::string_view s) noexcept;

/// Whether `s` is a quantized storage (i8, ui8, i4, ui4).
bool isQuantized(Storage s) noexcept;
/// The width of a quantized storage's codes: 8 (i8, ui8) or 4 (i4, ui4);
/// 0 for the others.
unsigned codeBits(Storage s) noexcept;
/// Whether a quantized storage's codes are signed (i8, i4).
bool isSignedCodes(Storage s) noexcept;
/// The storage a compander's codes need (softsign, e3m4: i8; sqrt, e4m4:
/// ui8; e2m1, e3m0: i4; e3m1, e4m0: ui4), or nullopt for none (i8 or ui8).
std::optional<Storage> storageFor(Compand c) noexcept;
/// Whether `s` is a plain float storage (f32, bf16, f16).
bool isPlain(Storage s) noexcept;
/// The dtype of a plain storage; nullopt for quantized storages and None.
std::optional<DType> plainDType(Storage s) noexcept;
/// The default compander of a quantized storage: softsign for i8, sqrt for
/// ui8, e2m1 for i4, e3m1 for ui4 (None for the others).
Compand defaultCompand(Storage s) noexcept;

/// The built-in rule names, in a stable order: sgd, sgdw, adam, adamw, lion.
const std::vector<std::string> &builtinRuleNames();
/// The known targets, in a stable order: cpu, sm_80, sm_90, sm_100.
const std::vector<std::string> &knownTargets();

/// The default group size of quantized states.
constexpr unsigned kDefaultGroupSize = 32;
/// The smallest allowed group size.
constexpr unsigned kMinGroupSize = 16;
/// The largest allowed group size.
constexpr unsigned kMaxGroupSize = 128;

//===----------------------------------------------------------------------===//
// The spec model
//===----------------------------------------------------------------------===//

/// A value of a spec together with whether it was written and where.
/// When `given` is false the value is the default and `loc` names the object
/// that would have held it (its line:col) with the pointer of the missing
/// member as `path`, so a later stage can still point somewhere useful.
template <typename T> struct Located {
  /// The value (written or defaulted).
  T value{};
  /// Whether the spec wrote it.
  bool given = false;
  /// Where it is written (see above when not given).
  SourceLoc loc;
};

/// The rule a spec applies: a built-in one or a user's rule file.
struct RuleRef {
  /// True for a built-in rule ("rule": "adamw"), false for a rule file.
  bool builtin = true;
  /// The built-in rule's name (builtin only).
  std::string name;
  /// The rule file as written in the spec (rule file only).
  std::string file;
  /// The rule file resolved against the spec file's directory (absolute
  /// paths are kept as written), lexically normalized (rule file only).
  std::string path;
  /// The rule file's contents, read when the spec was parsed (rule file
  /// only).
  std::string text;
  /// Where the "rule" value is written (the string, or the object).
  SourceLoc loc;
  /// Where the "file" value is written (rule file only).
  SourceLoc fileLoc;
};

/// The encoding of one state, as written in the per-state "states" object.
struct StateSpec {
  /// The state's name (the key in "states"); the rule decides whether it
  /// exists.
  std::string name;
  /// Where the key is written.
  SourceLoc keyLoc;
  /// Where the encoding object is written.
  SourceLoc loc;
  /// "storage" (always given in a valid spec).
  Located<Storage> storage;
  /// "group": quantized only. `value` is the effective group size, i.e.
  /// Spec::groupSize (a valid spec has one group size for all quantized
  /// states); `given` says whether the state wrote "group".
  Located<unsigned> group;
  /// "compand": quantized only. `value` is the effective compander (the
  /// storage's default when not given: softsign for i8, sqrt for ui8).
  Located<Compand> compand;
  /// "scale": quantized only. `value` is the effective scale dtype (f16 when
  /// not given).
  Located<DType> scale;

  /// Whether the storage is quantized (i8, ui8).
  bool quantized() const { return isQuantized(storage.value); }
  /// Whether the state is elided ("storage": "none").
  bool elided() const { return storage.value == Storage::None; }
};

/// One hyper-parameter default.
struct HyperSpec {
  /// The hyper-parameter's name (the key in "hyper"); the rule decides
  /// whether it exists.
  std::string name;
  /// The value (booleans become 1 and 0). Finite and within the f32 range.
  double value = 0.0;
  /// Whether the value was written as a boolean.
  bool isBool = false;
  /// Where the key is written.
  SourceLoc keyLoc;
  /// Where the value is written.
  SourceLoc loc;
};

/// A parsed and schema-checked spec file.
struct Spec {
  /// The spec file's path, as given to the parser.
  std::string file;
  /// The spec file's directory (what rule files are resolved against; "" for
  /// the current directory).
  std::string dir;
  /// The original text of the spec file.
  std::string text;
  /// The document re-serialized canonically (nlohmann/json dump: keys
  /// sorted, no whitespace), for hashing.
  std::string canonicalJson;
  /// Where the top-level object is written.
  SourceLoc loc;

  /// "name": the optimizer's name (kernel symbol, bundle directory).
  Located<std::string> name;
  /// "rule".
  RuleRef rule;
  /// "description" ("" when not given).
  Located<std::string> description;

  /// Where the "param" object is written.
  SourceLoc paramLoc;
  /// "param"/"dtype".
  Located<DType> paramDType;
  /// "param"/"correction" (None when not given).
  Located<Correction> correction;
  /// "grad" (the parameter dtype when not given).
  Located<DType> grad;
  /// "accumulator" (None when not given; `true` means F32).
  Located<Accumulator> accumulator;
  /// "arithmetic" (Exact when not given).
  Located<Arithmetic> arithmetic;
  /// "numerics" (Bounded when not given).
  Located<NumericsMode> numerics;

  /// The group size of every quantized state. `given` and `loc` describe
  /// "group_size". When "group_size" is not written, the first "group" a
  /// state writes (in text order) sets it, else it is 32.
  Located<unsigned> groupSize;

  /// How "states" was written; `loc` is the "states" value.
  Located<StatesForm> statesForm;
  /// The storage of StatesForm::Plain (F32, BF16 or F16).
  Storage statesPlainStorage = Storage::F32;
  /// The per-state encodings (StatesForm::PerState), in text order.
  std::vector<StateSpec> states;

  /// Where the "hyper" object is written (or the top-level object).
  SourceLoc hyperLoc;
  /// The hyper-parameter defaults, in text order.
  std::vector<HyperSpec> hypers;

  /// "targets" (["cpu"] when not given); `loc` is the array.
  Located<std::vector<std::string>> targets;
  /// Where each target is written (parallel to targets.value; when targets
  /// is not given, the top-level object).
  std::vector<SourceLoc> targetLocs;

  /// The per-state encoding of `stateName`, or null if "states" does not
  /// list it.
  const StateSpec *findState(std::string_view stateName) const;
  /// The hyper-parameter default `hyperName`, or null if not given.
  const HyperSpec *findHyper(std::string_view hyperName) const;
  /// Whether the spec lists `target`.
  bool hasTarget(std::string_view target) const;
};

//===----------------------------------------------------------------------===//
// Parsing
//===----------------------------------------------------------------------===//

/// Reads and parses the spec file at `path`. Rule files are resolved against
/// the directory of `path`. Appends every error found to `diags` (sorted by
/// position) and returns nullopt if there is any; never throws.
std::optional<Spec> parseSpecFile(const std::string &path,
                                  std::vector<Diagnostic> &diags) noexcept;

/// Parses spec `text` as if read from `filename` (used in diagnostics and to
/// resolve rule files: against the directory part of `filename`, or the
/// current directory if it has none). Appends every error found to `diags`
/// (sorted by position) and returns nullopt if there is any; never throws.
std::optional<Spec> parseSpecText(std::string_view text,
                                  const std::string &filename,
                                  std::vector<Diagnostic> &diags) noexcept;

} // namespace flashopt::spec

#endif // FLASHOPT_SPEC_SPEC_H
