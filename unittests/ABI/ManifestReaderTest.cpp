//===- ManifestReaderTest.cpp - Reading manifests ------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// abi/src/ManifestReader.cpp: the model a manifest parses into, and errors
/// naming the file and the field for every kind of bad manifest.
///
//===----------------------------------------------------------------------===//

#include "RuntimeTestSupport.h"

#include <cmath>

using namespace flashopt::testing;

TEST_CASE("the fake bundle's manifest parses into the expected model") {
  auto m = load_manifest(kBundle + "/manifest.json");
  REQUIRE_MESSAGE(m.ok(), m.error());
  CHECK(m->name == "fake_sgd");
  CHECK(m->group_size == 32);
  CHECK(m->param == DType::F32);
  CHECK_FALSE(m->correction.has_value());
  CHECK(m->grad == DType::F32);
  REQUIRE(m->hypers.size() == 2);
  CHECK(m->hypers[0].name == "lr");
  CHECK(*m->hypers[0].default_value == doctest::Approx(0.01));
  CHECK(m->hyper_index("momentum") == 1);
  CHECK(m->hyper_index("nope") == -1);
  REQUIRE(m->buffers.size() == 3);
  CHECK(m->buffers[0].role == BufferRole::Param);
  CHECK(m->buffers[1].role == BufferRole::Grad);
  CHECK_FALSE(m->buffers[1].writable);
  CHECK(m->buffers[2].role == BufferRole::State);
  CHECK(m->record_words == 7);
  REQUIRE(m->kernels.size() == 3);
  CHECK(m->kernels[0].target == "sm_90"); // GPU entries are kept, not loaded
  CHECK(m->kernels[1].features.size() == 4);

  auto a = parse_manifest(adamwLikeManifest().dump(), "adamw_like");
  REQUIRE_MESSAGE(a.ok(), a.error());
  CHECK(*a->correction == DType::I8);
  CHECK(a->buffers[4].per == Per::Group);
  CHECK(a->states[1].compand == "sqrt");
  CHECK(a->computed_bytes_per_param().total == doctest::Approx(7.125));
}

TEST_CASE("4-bit states: i4/ui4 storage with the 4-bit minifloats parses") {
  auto a = parse_manifest(adamw4bitLikeManifest().dump(), "adamw_like_4bit");
  REQUIRE_MESSAGE(a.ok(), a.error());
  CHECK(a->states[0].storage == DType::I4);
  CHECK(a->states[0].compand == "e2m1");
  CHECK(a->states[1].storage == DType::U4);
  CHECK(a->states[1].compand == "e3m1");
  CHECK(a->buffers[3].dtype == DType::I4);
  CHECK(a->buffers[5].dtype == DType::U4);
  // docs/design/4bit-states.md §1: 6.125 B/param, 4.125 with grad release.
  CHECK(a->computed_bytes_per_param().states == 1.125);
  CHECK(a->computed_bytes_per_param().total == 6.125);
  CHECK(a->computed_bytes_per_param().total_with_grad_release == 4.125);
  // Every 4-bit minifloat in its storage; the writer round-trips them.
  for (auto [storage, compand] :
       {std::pair{"i4", "e2m1"}, {"i4", "e3m0"}, {"ui4", "e3m1"},
        {"ui4", "e4m0"}}) {
    json x = adamw4bitLikeManifest();
    int s = std::string(storage) == "i4" ? 0 : 1;
    x["states"][s]["encoding"]["compand"] = compand;
    auto r = parse_manifest(x.dump(), "m.json");
    REQUIRE_MESSAGE(r.ok(), r.error());
    CHECK(r->states[size_t(s)].compand == compand);
    auto back = parse_manifest(write_manifest(*r), "again.json");
    REQUIRE_MESSAGE(back.ok(), back.error());
    CHECK(write_manifest(*back) == write_manifest(*r));
  }
  // The kernel's ABI description spells the packed dtypes.
  CHECK(kernel_abi_description(*a).find("exp_avg.codes:i4") !=
        std::string::npos);
}

TEST_CASE("bad manifests give errors naming the file and the field") {
  auto expectError = [](const json &m, const std::string &needle) {
    auto r = parse_manifest(m.dump(), "/some/bundle/manifest.json");
    REQUIRE_FALSE(r.ok());
    INFO(r.error());
    CHECK(r.error().rfind("/some/bundle/manifest.json: ", 0) == 0);
    CHECK(r.error().find(needle) != std::string::npos);
  };
  json m = fakeManifest();
  { json x = m; x.erase("group_size");
    expectError(x, "field 'group_size': missing"); }
  { json x = m; x["format"] = "flashopt-bundle";
    expectError(x, "field 'format': expected \"flashopt-manifest\""); }
  { json x = m; x["format_version"] = 2;
    expectError(x, "field 'format_version': unsupported version 2"); }
  { json x = m; x["group_size"] = 48;
    expectError(x, "field 'group_size': expected a power of two"); }
  { json x = m; x["param"]["dtype"] = "f64";
    expectError(x, "field 'param.dtype': expected one of bf16, f16, f32, got \"f64\""); }
  { json x = m; x["param"]["correction"] = "i8";
    expectError(x, "field 'param.correction': an f32 parameter takes no correction"); }
  { json x = m; x["hypers"][1].erase("name");
    expectError(x, "field 'hypers[1].name': missing"); }
  { json x = m; x["hypers"][1]["default"] = "0.9";
    expectError(x, "field 'hypers[1].default': expected a number or null"); }
  // Envelopes (docs/NUMERICS.md §8.4): the running max or min of an earlier
  // plain hyper-parameter, with no default.
  {
    json x = m;
    x["hypers"].push_back({{"name", "momentum_max"}, {"default", nullptr},
                           {"envelope", {{"keep", "max"}, {"of", "momentum"}}}});
    auto r = parse_manifest(x.dump(), "/some/bundle/manifest.json");
    REQUIRE_MESSAGE(r.ok(), r.error());
    CHECK(r->hypers[2].is_envelope());
    CHECK(r->hypers[2].envelope == "max");
    CHECK(r->hypers[2].envelope_of == "momentum");
    CHECK_FALSE(r->hypers[1].is_envelope());
    json y = x;
    y["hypers"][2]["envelope"]["keep"] = "mean";
    expectError(y, "field 'hypers[2].envelope.keep': expected max or min, got \"mean\"");
    y = x;
    y["hypers"][2]["envelope"]["of"] = "beta9";
    expectError(y, "field 'hypers[2].envelope.of': names no earlier plain hyper-parameter: \"beta9\"");
    y = x;
    y["hypers"][2]["envelope"]["of"] = "momentum_max";
    expectError(y, "names no earlier plain hyper-parameter");
    y = x;
    y["hypers"][2]["default"] = 0.5;
    expectError(y, "field 'hypers[2].default': an envelope has no default");
  }
  { json x = m; x["states"][0]["encoding"]["storage"] = "i8";
    expectError(x, "field 'states[0].encoding.storage': expected one of f32, bf16, f16"); }
  { json x = m; x["buffers"][2]["dtype"] = "bf16";
    expectError(x, "field 'buffers[2]': expected buffer \"momentum_buffer\" (f32"); }
  { json x = m; std::swap(x["buffers"][0], x["buffers"][1]);
    expectError(x, "field 'buffers[0]': expected buffer \"param\""); }
  { json x = m; x["buffers"].erase(2);
    expectError(x, "field 'buffers': has 2 entries, expected 3"); }
  { json x = m; x["table"]["record_words"] = 10;
    expectError(x, "field 'table.record_words': expected 7"); }
  { json x = m; x["bytes_per_param"]["states"] = 2.125;
    expectError(x, "field 'bytes_per_param.states': is 2.125 but the buffers give 4"); }
  { json x = m; x["kernels"][1].erase("symbol");
    expectError(x, "field 'kernels[1].symbol': missing"); }
  { json x = m; x["kernels"][2]["features"] = "avx2";
    expectError(x, "field 'kernels[2].features': expected an array"); }
  { json x = adamwLikeManifest(); x["states"][0]["encoding"]["group"] = 64;
    expectError(x, "field 'states[0].encoding.group': is 64 but group_size is 32"); }
  { json x = adamwLikeManifest(); x["states"][1]["encoding"]["compand"] = "softsign";
    expectError(x, "field 'states[1].encoding.compand': compand \"softsign\" needs i8 storage, got ui8"); }
  // 4-bit codes (i4/ui4): the compander's width and signedness are the
  // storage's (a minifloat's codeBits(); the linear companders at 8 bits).
  auto with = [](const char *storage, const char *compand, const char *st2,
                 const char *compand2) {
    json x = adamw4bitLikeManifest();
    x["states"][0]["encoding"]["storage"] = storage;
    x["states"][0]["encoding"]["compand"] = compand;
    x["buffers"][3]["dtype"] = storage;
    x["states"][1]["encoding"]["storage"] = st2;
    x["states"][1]["encoding"]["compand"] = compand2;
    x["buffers"][5]["dtype"] = st2;
    x.erase("bytes_per_param"); // derived from the buffers
    return x;
  };
  expectError(with("i8", "e2m1", "ui4", "e3m1"),
              "field 'states[0].encoding.compand': compand \"e2m1\" needs i4 storage, got i8");
  expectError(with("i4", "e3m4", "ui4", "e3m1"),
              "compand \"e3m4\" needs i8 storage, got i4");
  expectError(with("i4", "e3m1", "ui4", "e3m1"),
              "compand \"e3m1\" needs ui4 storage, got i4");
  expectError(with("ui4", "e3m0", "ui4", "e3m1"),
              "compand \"e3m0\" needs i4 storage, got ui4");
  expectError(with("i4", "e2m1", "ui8", "e4m0"),
              "field 'states[1].encoding.compand': compand \"e4m0\" needs ui4 storage, got ui8");
  expectError(with("i4", "e2m1", "ui4", "e4m4"),
              "compand \"e4m4\" needs ui8 storage, got ui4");
  expectError(with("i4", "softsign", "ui4", "e3m1"),
              "compand \"softsign\" needs i8 storage, got i4");
  expectError(with("i4", "e2m1", "ui4", "sqrt"),
              "compand \"sqrt\" needs ui8 storage, got ui4");
  expectError(with("i4", "none", "ui4", "e3m1"),
              "compand \"none\" needs 8-bit storage (i8 or ui8), got i4");
  expectError(with("i4", "e2m1", "f32", "e3m1"),
              "field 'states[1].encoding.storage': expected one of i8, ui8, i4, ui4");
  { json x = adamw4bitLikeManifest(); x["buffers"][3]["dtype"] = "i8";
    expectError(x, "field 'buffers[3]': expected buffer \"exp_avg.codes\" (i4"); }
  { json x = adamw4bitLikeManifest(); x["bytes_per_param"]["states"] = 2.125;
    expectError(x, "field 'bytes_per_param.states': is 2.125 but the buffers give 1.125"); }
  auto r = parse_manifest("{\"format\": ", "broken.json");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().rfind("broken.json: invalid JSON", 0) == 0);
  r = parse_manifest("[1, 2]", "array.json");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("top level") != std::string::npos);
}

TEST_CASE("deeply nested manifests are refused before parsing") {
  // Found by the whole-tree ASan preset: the fuzz corpus's 20,000-deep input
  // overflowed the stack in json::dump (the error message's excerpt).
  std::string deep = "{\"format\": " + std::string(20000, '[') +
                     std::string(20000, ']') + "}";
  auto r = parse_manifest(deep, "deep.json");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error() == "deep.json: invalid JSON: nesting deeper than 64 levels "
                     "at byte 74");
  // Brackets inside strings do not count; 64 levels are fine for the scan.
  std::string inString = "{\"x\": \"" + std::string(100, '[') + "\"}";
  auto s = parse_manifest(inString, "str.json");
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().find("nesting") == std::string::npos);
}
