//===- SpecParserStates.cpp - Spec states, hyper-parameters, targets ------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The SpecParser members that check "states" (each state's encoding and the
/// group sizes they must share), "hyper" and "targets" (docs/SPEC.md).
///
//===----------------------------------------------------------------------===//

#include "SpecParserImpl.h"

#include <cfloat>
#include <map>
#include <set>

namespace flashopt::spec::detail {

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
    if (s == "quantized4") {
      spec.statesForm.value = StatesForm::Quantized4;
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
             "\"quantized\", \"quantized4\", \"f32\", \"bf16\", \"f16\" or "
             "an object mapping "
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
                        "quantized storages (\"i8\", \"ui8\", \"i4\", \"ui4\") "
                        "take \"group\", "
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
    // Each code format needs its storage's signedness and width: signed
    // 8-bit (softsign, e3m4), unsigned 8-bit (sqrt, e4m4), i4 (e2m1, e3m0),
    // ui4 (e3m1, e4m0); none takes either 8-bit storage.
    std::optional<Storage> needs = storageFor(comp);
    if (storage && needs && *storage != *needs)
      error(valueLoc(child(ptr, "compand")),
            fmt::format("compand \"{}\" needs storage \"{}\", found "
                        "storage \"{}\"",
                        spelling(comp), spelling(*needs), spelling(*storage)));
    if (storage && !needs && codeBits(*storage) == 4)
      error(valueLoc(child(ptr, "compand")),
            fmt::format("compand \"{}\" needs 8-bit storage (\"i8\" or "
                        "\"ui8\"); 4-bit codes take \"e2m1\" or \"e3m0\" "
                        "(\"i4\"), \"e3m1\" or \"e4m0\" (\"ui4\")",
                        spelling(comp)));
  }

  // 4-bit codes default to bf16 scales and refuse f16 ones: f16's range
  // (2^-14 .. 2^15) would narrow a narrow code's further (docs/NUMERICS.md
  // §2e); 8-bit codes default to FlashOptim's f16.
  bool fourBit = storage && codeBits(*storage) == 4;
  auto sc = enc.find("scale");
  if (sc == enc.end()) {
    setDefault(state.scale, fourBit ? DType::BF16 : DType::F16, ptr, "scale");
  } else if (auto name = oneOf(*sc, child(ptr, "scale"), kScales)) {
    state.scale = {*parseDType(*name), true, valueLoc(child(ptr, "scale"))};
    if (fourBit && state.scale.value == DType::F16)
      error(valueLoc(child(ptr, "scale")),
            fmt::format("4-bit codes (storage \"{}\") take \"bf16\" or "
                        "\"f32\" scales: an f16 scale's range (2^-14 to 2^15) "
                        "would narrow the code's",
                        spelling(*storage)));
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

} // namespace flashopt::spec::detail
