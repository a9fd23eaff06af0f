//===- SpecToDialect.cpp - Spec files → flashopt.optimizer -----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Applies a parsed spec to its rule's `flashopt.optimizer`. Everything that
/// needs the rule to be seen is checked here and reported at the spec's
/// file:line:col, in the same format as the spec parser's own errors.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Spec/SpecToDialect.h"
#include "flashopt/Dialect/FlashOpt/IR/Companders.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Rules/BuiltinRules.h"
#include "flashopt/Spec/Spec.h"
#include "flashopt/Spec/InputLimits.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <cmath>

using namespace mlir;
using namespace mlir::flashopt;
namespace spec = ::flashopt::spec;

namespace {

/// Prints located spec errors.
struct Reporter {
  llvm::raw_ostream &os;
  bool failed = false;
  void error(const spec::SourceLoc &loc, const std::string &message) {
    os << spec::makeDiag(loc, message).str() << "\n";
    failed = true;
  }
};

std::string quotedList(llvm::ArrayRef<std::string> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i ? ", \"" : "\"") + names[i] + "\"";
  return out.empty() ? "none" : out;
}

Type dtypeType(MLIRContext *ctx, spec::DType d) {
  switch (d) {
  case spec::DType::BF16:
    return BFloat16Type::get(ctx);
  case spec::DType::F16:
    return Float16Type::get(ctx);
  case spec::DType::F32:
    return Float32Type::get(ctx);
  }
  return nullptr;
}

Type storageType(MLIRContext *ctx, spec::Storage s) {
  return parseStorageTypeName(ctx, spec::spelling(s));
}

/// The dialect's compander of a spec's: the spec spells them as the
/// dialect's enum does.
Compander companderOf(spec::Compand c) {
  std::optional<Compander> compander = symbolizeCompander(spec::spelling(c));
  assert(compander && "a spec compander the dialect does not know");
  return *compander;
}

/// The rule's name for messages.
std::string ruleName(const spec::Spec &s) {
  return s.rule.builtin ? s.rule.name : s.rule.file;
}

/// Builds the encoding a per-state entry asks for, or null after reporting.
StateEncodingAttrInterface encodingFor(MLIRContext *ctx, const spec::Spec &s,
                      const spec::StateSpec &entry, StateOp state,
                      Reporter &rep) {
  if (entry.elided()) {
    if (!state.getElidable()) {
      rep.error(entry.storage.loc,
                "state \"" + entry.name + "\" cannot be elided: rule \"" +
                    ruleName(s) + "\" does not declare it elidable");
      return {};
    }
    return ElidedAttr::get(ctx);
  }
  Type storage = storageType(ctx, entry.storage.value);
  if (spec::isPlain(entry.storage.value))
    return PlainAttr::get(ctx, storage);
  // Quantized: what the entry leaves out comes from the rule's own
  // encoding when that is quantized with the same signedness and width.
  auto ruleQuant = dyn_cast<QuantAttr>(state.getEncoding());
  bool isSigned = spec::isSignedCodes(entry.storage.value);
  unsigned bits = spec::codeBits(entry.storage.value);
  bool inherit = ruleQuant && ruleQuant.isSigned() == isSigned &&
                 ruleQuant.getCodeBits() == bits;
  if (bits == 4 && s.numerics.value == spec::NumericsMode::FlashOptim) {
    rep.error(entry.storage.loc,
              "state \"" + entry.name +
                  "\": numerics \"flashoptim\" has no 4-bit codes "
                  "(FlashOptim's states are 8-bit); 4-bit states need the "
                  "bounded numerics");
    return {};
  }
  Compander compand =
      entry.compand.given ? companderOf(entry.compand.value)
      : inherit           ? ruleQuant.getCompand()
                          : companderOf(spec::defaultCompand(entry.storage.value));
  // The default scale: FlashOptim's f16 for 8-bit codes, bf16 for 4-bit
  // ones (the parser's default, docs/NUMERICS.md §2e).
  Type scale = entry.scale.given || bits == 4
                   ? dtypeType(ctx, entry.scale.value)
               : inherit ? ruleQuant.getScale()
                         : Float16Type::get(ctx);
  return QuantAttr::get(ctx, storage, int64_t(s.groupSize.value), compand,
                        scale);
}

/// FlashOptim's encoding of a built-in rule's quantized state, for the
/// FlashOptim numerics: its softsign (signed) or sqrt (unsigned) linear
/// codes with f16 scales (docs/NUMERICS.md §8); other encodings are kept.
StateEncodingAttrInterface flashoptimEncoding(StateEncodingAttrInterface enc) {
  auto q = dyn_cast<QuantAttr>(enc);
  if (!q)
    return enc;
  MLIRContext *ctx = q.getContext();
  return QuantAttr::get(ctx, q.getStorage(), q.getGroup(),
                        q.isSigned() ? Compander::softsign : Compander::sqrt,
                        Float16Type::get(ctx));
}

/// Sets the group size of a rule's quantized encoding to the spec's.
StateEncodingAttrInterface withGroup(StateEncodingAttrInterface enc,
                                     const spec::Spec &s) {
  if (auto q = dyn_cast<QuantAttr>(enc))
    if (s.groupSize.given || q.getGroup() != int64_t(s.groupSize.value))
      return QuantAttr::get(q.getContext(), q.getStorage(),
                            int64_t(s.groupSize.value), q.getCompand(),
                            q.getScale());
  return enc;
}

/// Applies `s` to `op`; reports every problem found.
void applySpec(const spec::Spec &s, OptimizerOp op, Reporter &rep) {
  MLIRContext *ctx = op.getContext();
  op.setSymName(s.name.value);
  Type paramType = dtypeType(ctx, s.paramDType.value);
  Type correction;
  if (s.correction.value == spec::Correction::I8)
    correction = IntegerType::get(ctx, 8);
  else if (s.correction.value == spec::Correction::I16)
    correction = IntegerType::get(ctx, 16);
  op.setParamAttr(MasterAttr::get(ctx, paramType, correction));
  op.setGrad(dtypeType(ctx, s.grad.value));
  // The portable fast mode (flashopt-fast-arithmetic, docs/NUMERICS.md §7).
  op.setArithmetic(s.arithmetic.value == spec::Arithmetic::Fast
                       ? ::mlir::flashopt::Arithmetic::Fast
                       : ::mlir::flashopt::Arithmetic::Exact);
  // The state numerics (docs/NUMERICS.md §8); the rule text alone means the
  // bounded numerics too.
  op.setNumerics(s.numerics.value == spec::NumericsMode::FlashOptim
                     ? ::mlir::flashopt::Numerics::FlashOptim
                     : ::mlir::flashopt::Numerics::Bounded);
  switch (s.accumulator.value) {
  case spec::Accumulator::None:
    break;
  case spec::Accumulator::F32:
    op.setAccumulateAttr(MasterAttr::get(ctx, Float32Type::get(ctx), Type()));
    break;
  case spec::Accumulator::BF16I8:
    op.setAccumulateAttr(MasterAttr::get(ctx, BFloat16Type::get(ctx),
                                         IntegerType::get(ctx, 8)));
    break;
  case spec::Accumulator::BF16:
    op.setAccumulateAttr(MasterAttr::get(ctx, BFloat16Type::get(ctx), Type()));
    break;
  }

  SmallVector<StateOp> states = getStates(op);
  std::vector<std::string> stateNames;
  for (StateOp st : states)
    stateNames.push_back(st.getName().str());

  // Rule defaults first (with the spec's group size; FlashOptim's codes in
  // its numerics), then the spec's form.
  for (StateOp st : states) {
    StateEncodingAttrInterface enc = withGroup(st.getEncoding(), s);
    if (s.numerics.value == spec::NumericsMode::FlashOptim && s.rule.builtin)
      enc = flashoptimEncoding(enc);
    st.setEncodingAttr(enc);
  }
  switch (s.statesForm.value) {
  case spec::StatesForm::Default:
    break;
  case spec::StatesForm::Quantized:
    for (StateOp st : states)
      if (!isa<QuantAttr>(st.getEncoding()))
        rep.error(s.statesForm.loc,
                  "\"quantized\" asks for the rule's default quantized "
                  "encoding, but state \"" +
                      st.getName().str() + "\" of rule \"" + ruleName(s) +
                      "\" has none; give its encoding explicitly");
    break;
  case spec::StatesForm::Quantized4:
    if (s.numerics.value == spec::NumericsMode::FlashOptim) {
      rep.error(s.statesForm.loc,
                "\"quantized4\" asks for 4-bit codes, which numerics "
                "\"flashoptim\" does not have (FlashOptim's states are "
                "8-bit); use the bounded numerics");
      break;
    }
    for (StateOp st : states) {
      auto q = dyn_cast<QuantAttr>(st.getEncoding());
      if (!q) {
        rep.error(s.statesForm.loc,
                  "\"quantized4\" asks for the 4-bit code of the rule's "
                  "default quantized encoding, but state \"" +
                      st.getName().str() + "\" of rule \"" + ruleName(s) +
                      "\" has none; give its encoding explicitly");
        continue;
      }
      bool isSigned = q.isSigned();
      spec::Storage storage = isSigned ? spec::Storage::I4 : spec::Storage::UI4;
      st.setEncodingAttr(QuantAttr::get(
          ctx, storageType(ctx, storage), q.getGroup(),
          companderOf(spec::defaultCompand(storage)), BFloat16Type::get(ctx)));
    }
    break;
  case spec::StatesForm::Plain: {
    Type t = storageType(ctx, s.statesPlainStorage);
    for (StateOp st : states)
      st.setEncodingAttr(PlainAttr::get(ctx, t));
    break;
  }
  case spec::StatesForm::PerState:
    for (const spec::StateSpec &entry : s.states) {
      auto it = llvm::find_if(states, [&](StateOp st) {
        return st.getName() == entry.name;
      });
      if (it == states.end()) {
        rep.error(entry.keyLoc, "rule \"" + ruleName(s) +
                                    "\" has no state \"" + entry.name +
                                    "\" (its states: " +
                                    quotedList(stateNames) + ")");
        continue;
      }
      if (StateEncodingAttrInterface enc =
              encodingFor(ctx, s, entry, *it, rep))
        it->setEncodingAttr(enc);
    }
    break;
  }

  // Hyper-parameter defaults.
  SmallVector<HyperOp> hypers = getHypers(op);
  std::vector<std::string> hyperNames;
  for (HyperOp h : hypers)
    hyperNames.push_back(h.getName().str());
  for (const spec::HyperSpec &h : s.hypers) {
    auto it = llvm::find_if(
        hypers, [&](HyperOp hop) { return hop.getName() == h.name; });
    if (it == hypers.end()) {
      rep.error(h.keyLoc, "rule \"" + ruleName(s) +
                              "\" has no hyper-parameter \"" + h.name +
                              "\" (its hyper-parameters: " +
                              quotedList(hyperNames) + ")");
      continue;
    }
    float v = float(h.value);
    if (!std::isfinite(v)) {
      rep.error(h.loc, "hyper-parameter \"" + h.name + "\" = " +
                           std::to_string(h.value) + " does not fit in f32");
      continue;
    }
    it->setDefaultValueAttr(FloatAttr::get(Float32Type::get(ctx), v));
  }

  // An elided state needs its hyper-parameter at 0.
  for (StateOp st : states) {
    if (!st.isElided() || !st.getElidable())
      continue;
    StringRef hyperName = *st.getElidable();
    auto it = llvm::find_if(
        hypers, [&](HyperOp hop) { return hop.getName() == hyperName; });
    if (it == hypers.end())
      continue;
    auto def = it->getDefaultValueAttr();
    if (def && def.getValueAsDouble() != 0.0) {
      const spec::HyperSpec *given = s.findHyper(hyperName);
      const spec::StateSpec *entry = s.findState(st.getName());
      rep.error(given ? given->loc : entry ? entry->storage.loc : s.loc,
                "state \"" + st.getName().str() +
                    "\" is elided, so hyper-parameter \"" + hyperName.str() +
                    "\" must default to 0 (it is " +
                    std::to_string(def.getValueAsDouble()) + ")");
    }
  }
}

} // namespace



std::optional<spec::LoadedSpec>
spec::loadSpecAsOptimizer(MLIRContext &ctx, const std::string &path,
                          llvm::raw_ostream &errs) {
  std::vector<spec::Diagnostic> diags;
  std::optional<spec::Spec> parsed = spec::parseSpecFile(path, diags);
  for (const spec::Diagnostic &d : diags)
    errs << d.str() << "\n";
  if (!parsed)
    return std::nullopt;
  const spec::Spec &s = *parsed;
  Reporter rep{errs};

  std::string ruleText, bufferName;
  if (s.rule.builtin) {
    std::optional<std::string_view> text = ::flashopt::getBuiltinRule(s.rule.name);
    if (!text) {
      rep.error(s.rule.loc, "unknown built-in rule \"" + s.rule.name + "\"");
      return std::nullopt;
    }
    ruleText = std::string(*text);
    bufferName = "<builtin>/" + s.rule.name + ".mlir";
  } else {
    ruleText = s.rule.text;
    bufferName = s.rule.path;
  }

  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(ruleText, bufferName), llvm::SMLoc());
  SourceMgrDiagnosticHandler handler(sourceMgr, &ctx, errs);
  // The parser recurses per bracket without a bound: refuse deep nesting
  // first (InputLimits.h), at its line and column in the rule file.
  if (std::optional<spec::NestingViolation> deep =
          spec::findExcessiveNesting(ruleText)) {
    emitError(FileLineColLoc::get(&ctx, bufferName, unsigned(deep->line),
                                  unsigned(deep->column)))
        << deep->message;
    rep.error(s.rule.builtin ? s.rule.loc : s.rule.fileLoc,
              "rule \"" + ruleName(s) + "\" does not parse or verify (see above)");
    return std::nullopt;
  }
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &ctx);
  if (!module) {
    rep.error(s.rule.builtin ? s.rule.loc : s.rule.fileLoc,
              "rule \"" + ruleName(s) + "\" does not parse or verify (see above)");
    return std::nullopt;
  }
  auto optimizers = llvm::to_vector(module->getOps<OptimizerOp>());
  if (optimizers.size() != 1 ||
      !llvm::hasSingleElement(module->getBody()->getOperations())) {
    rep.error(s.rule.builtin ? s.rule.loc : s.rule.fileLoc,
              "rule \"" + ruleName(s) +
                  "\" must hold exactly one flashopt.optimizer and nothing "
                  "else (found " +
                  std::to_string(optimizers.size()) + " optimizers)");
    return std::nullopt;
  }
  if (failed(verify(*module))) {
    rep.error(s.rule.builtin ? s.rule.loc : s.rule.fileLoc,
              "rule \"" + ruleName(s) + "\" is not a valid optimizer (see above)");
    return std::nullopt;
  }

  applySpec(s, optimizers.front(), rep);
  if (rep.failed)
    return std::nullopt;

  // Anything the spec made invalid (the verifiers say what).
  std::string verifierMessages;
  {
    ScopedDiagnosticHandler capture(&ctx, [&](mlir::Diagnostic &d) {
      verifierMessages += d.str();
      return success();
    });
    if (failed(verify(*module))) {
      rep.error(s.loc, "the spec's encodings do not fit rule \"" +
                           ruleName(s) + "\": " + verifierMessages);
      return std::nullopt;
    }
  }

  spec::LoadedSpec out;
  out.module = std::move(module);
  out.specHash =
      "fnv1a64:" +
      llvm::utohexstr(spec::fnv1a64(s.canonicalJson + std::string(1, '\0') + ruleText),
                      /*LowerCase=*/true, /*Width=*/16);
  out.rule = s.rule.builtin ? s.rule.name : "file:" + s.rule.file;
  out.description = s.description.value;
  out.targets = s.targets.value;
  return out;
}
