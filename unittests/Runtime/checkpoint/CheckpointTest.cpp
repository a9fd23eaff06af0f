//===- CheckpointTest.cpp - Checkpoints, without C handles ----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// runtime/src/checkpoint over CPU optimizers of shipped bundles
/// (<build>/kernels), each with the train::Stepper that steps it and a
/// NameTable: round trips bit for bit in both forms (parameters, correction
/// terms, states, step counters, hyper tables with their envelopes); the
/// staged load (read -> validate -> apply) and its Plan; validate refusing
/// a lying, malformed, corrupt or truncated checkpoint and one of another
/// layout (tensor count, shape, group, encoding, spec), each time with the
/// code that says which and the optimizer unchanged; a failed save leaving
/// the previous file intact. 4-bit optimizers (the shipped *_4bit specs): packed
/// codes as U8 [ceil(n/2)], bit-exact round trips, the compressed size, the
/// state_encodings check across widths and the f32 form converting between
/// them.
///
//===----------------------------------------------------------------------===//

#include "checkpoint/Checkpoint.h"
#include "RuntimeTestSupport.h"
#include "checkpoint/MasterWeights.h"
#include "flashopt/host/Float16.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace flashopt;
using checkpoint::Form;
using checkpoint::NameTable;
using checkpoint::Subject;
using flashopt::testing::noEnv;
using host::Code;
using host::DType;
using json = nlohmann::json;
namespace fs = std::filesystem;
namespace safetensors = host::safetensors;

namespace {

/// Shipped bundle `name` (<build>/kernels; the 4-bit ones are
/// <rule>_<mode>_4bit, specs/generate.py).
std::string kernels(const std::string &name) {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return std::string(b ? b : FLASHOPT_TEST_BINARY_DIR) + "/kernels/" + name;
}

void requireOk(const host::Status &s) { REQUIRE_MESSAGE(s.ok(), s.message()); }

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

/// One parameter to register: its name, shape and param group.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int group = 0;
};

/// The default layout: sizes that are not a multiple of the group size, a
/// 2-D shape, one tensor smaller than a group, two param groups.
const std::vector<Param> kParams = {
    {"w0", {1000}, 0}, {"w1", {7, 11}, 1}, {"b", {5}, 1}};

/// A CPU optimizer of bundle `spec` with its stepper and names, over
/// parameters and gradients it owns (filled from `seed`).
struct Run {
  std::unique_ptr<host::CpuOptimizer> opt;
  std::unique_ptr<train::Stepper> stepper;
  NameTable names;
  std::vector<std::vector<uint8_t>> p, g;

  explicit Run(const std::string &spec, unsigned seed,
               const std::vector<Param> &params = kParams) {
    host::CpuOptimizerOptions opts;
    opts.threads = 2;
    auto o = host::CpuOptimizer::create(kernels(spec), noEnv(), opts);
    REQUIRE_MESSAGE(o.ok(), o.error());
    opt = std::move(o.value());
    stepper = std::make_unique<train::Stepper>(*opt);
    const host::Manifest &m = opt->manifest();
    int groups = 1;
    for (const Param &q : params)
      groups = std::max(groups, q.group + 1);
    while (opt->num_param_groups() < groups)
      REQUIRE(opt->add_param_group() >= 0);
    // Different values per group, so that a group mix-up shows.
    for (int k = 0; k < groups; ++k)
      requireOk(opt->set_hyper(k, "lr", 1e-2f * float(k + 1)));
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (const Param &q : params) {
      int64_t n = 1;
      for (int64_t e : q.shape)
        n *= e;
      p.emplace_back(fill(rng, d, n, m.param, 1.0f));
      g.emplace_back(fill(rng, d, n, m.grad, 0.1f));
      auto r = opt->add_param(q.group, p.back().data(), n, g.back().data());
      REQUIRE_MESSAGE(r.ok(), r.error());
      requireOk(names.add(q.name, q.shape));
    }
  }

  static std::vector<uint8_t> fill(std::mt19937 &rng,
                                   std::normal_distribution<float> &d,
                                   int64_t n, DType t, float scale) {
    std::vector<uint8_t> out(size_t(host::dtype_bytes(t, uint64_t(n))));
    for (int64_t k = 0; k < n; ++k) {
      float x = scale * d(rng);
      if (t == DType::F32) {
        std::memcpy(out.data() + 4 * k, &x, 4);
      } else {
        uint16_t h =
            t == DType::BF16 ? host::f32_to_bf16(x) : host::f32_to_f16(x);
        std::memcpy(out.data() + 2 * k, &h, 2);
      }
    }
    return out;
  }

  Subject subject() const { return Subject(*stepper, names); }

  /// A few steps with distinct counters: two plain steps, a gradient
  /// release of tensor 1, a skipped (non-finite) step.
  void train() {
    requireOk(stepper->step());
    requireOk(stepper->step());
    requireOk(stepper->step_tensor(1));
    requireOk(stepper->set_nonfinite_policy(train::NonFinitePolicy::Skip));
    std::vector<uint8_t> keep = g[0];
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (opt->manifest().grad == DType::F32)
      std::memcpy(g[0].data(), &nan, 4);
    else
      std::memset(g[0].data(), 0xFF, 2); // a NaN in bf16 and f16
    requireOk(stepper->step());
    g[0] = keep;
    requireOk(stepper->set_nonfinite_policy(train::NonFinitePolicy::Propagate));
  }
};

/// Everything a checkpoint holds, read back from the optimizer: every
/// buffer of the compressed form, the counters, the hyper table and which
/// of its entries are given.
struct Snapshot {
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<int64_t> steps;
  int64_t step = 0, skipped = 0;
  std::vector<float> hypers;
  std::vector<bool> given;

  explicit Snapshot(const Run &r) {
    Subject s = r.subject();
    for (const checkpoint::Entry &e :
         checkpoint::expected_tensors(s, Form::Compressed)) {
      auto b = r.opt->read_buffer(e.param, e.buffer);
      REQUIRE_MESSAGE(b.ok(), b.error());
      buffers.push_back(std::move(b.value()));
    }
    for (int64_t i = 0; i < r.opt->num_tensors(); ++i)
      steps.push_back(r.stepper->tensor_step(i));
    step = r.stepper->step_count();
    skipped = r.stepper->skipped_steps();
    hypers = r.opt->hyper_table();
    const size_t H = r.opt->manifest().hypers.size();
    for (int k = 0; k < r.opt->num_param_groups(); ++k)
      for (size_t h = 0; h < H; ++h)
        given.push_back(r.opt->hypers().given(k, h));
  }
  bool operator==(const Snapshot &o) const {
    return buffers == o.buffers && steps == o.steps && step == o.step &&
           skipped == o.skipped && hypers.size() == o.hypers.size() &&
           std::memcmp(hypers.data(), o.hypers.data(),
                       hypers.size() * sizeof(float)) == 0 &&
           given == o.given;
  }
};

std::vector<uint8_t> save(const Run &r, Form form) {
  auto bytes = checkpoint::save_buffer(r.subject(), form);
  REQUIRE_MESSAGE(bytes.ok(), bytes.error());
  return std::move(bytes.value());
}

std::vector<uint8_t> fileBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

fs::path scratch(const std::string &name) {
  fs::path dir = flashopt::testing::scratchDir() / "checkpoint";
  fs::create_directories(dir);
  return dir / name;
}

/// A checkpoint rewritten: its tensors as they are (or as `edit` leaves
/// them) and its metadata as `meta` leaves it; `resum` recomputes the
/// metadata checksum (a consistent lie), else the old one stays (a header
/// edited behind the writer's back).
template <typename EditTensors, typename EditMeta>
std::vector<uint8_t> rewrite(const std::vector<uint8_t> &bytes,
                             EditTensors edit, EditMeta meta, bool resum) {
  auto f = safetensors::File::parse(bytes, "test");
  REQUIRE_MESSAGE(f.ok(), f.error());
  std::vector<safetensors::TensorRef> refs;
  for (const auto &kv : f->tensors()) {
    safetensors::TensorRef r;
    r.name = kv.first;
    r.dtype = kv.second.dtype;
    r.shape = kv.second.shape;
    r.data = kv.second.data;
    refs.push_back(std::move(r));
  }
  edit(refs);
  std::map<std::string, std::string> m = f->metadata();
  meta(m);
  if (resum)
    m[checkpoint::kMetadataChecksumKey] = checkpoint::metadata_checksum(m);
  auto out = safetensors::serialize(refs, m);
  REQUIRE_MESSAGE(out.ok(), out.error());
  return std::move(out.value());
}

template <typename EditMeta>
std::vector<uint8_t> rewriteMeta(const std::vector<uint8_t> &bytes,
                                 EditMeta meta, bool resum = true) {
  return rewrite(
      bytes, [](std::vector<safetensors::TensorRef> &) {}, meta, resum);
}

/// Loads `bytes` into `r` expecting `code` and a message containing `what`,
/// and checks that nothing changed.
void refused(Run &r, const std::vector<uint8_t> &bytes, Code code,
             const std::string &what) {
  Snapshot before(r);
  host::Status s =
      checkpoint::load_buffer(r.subject(), bytes.data(), bytes.size());
  CHECK_MESSAGE(s.code() == code, s.message());
  CHECK_MESSAGE(contains(s.message(), what), s.message());
  CHECK_MESSAGE(Snapshot(r) == before, "the refused load changed the "
                                       "optimizer: "
                                           << s.message());
}

} // namespace

TEST_CASE("checkpoint: a compressed round trip restores buffers, counters "
          "and hyper tables bit for bit, and training goes on the same") {
  Run a("adamw_bf16_m24", 1);
  a.train();
  Run b("adamw_bf16_m24", 2); // other parameters, untrained
  CHECK(!(Snapshot(a) == Snapshot(b)));
  std::vector<uint8_t> bytes = save(a, Form::Compressed);
  requireOk(checkpoint::load_buffer(b.subject(), bytes.data(), bytes.size()));
  CHECK(Snapshot(a) == Snapshot(b));
  CHECK(b.stepper->tensor_step(1) == 3);
  CHECK(b.stepper->tensor_step(0) == 2);
  CHECK(b.stepper->step_count() == 2);
  CHECK(b.stepper->skipped_steps() == 1);
  // The params are the caller's memory: restored there.
  CHECK(a.p == b.p);
  // The same gradients from here on: the same steps.
  b.g = a.g;
  for (int k = 0; k < 2; ++k) {
    requireOk(a.stepper->step());
    requireOk(b.stepper->step());
  }
  CHECK(Snapshot(a) == Snapshot(b));
  // Saving the loaded optimizer gives the same bytes.
  Run c("adamw_bf16_m24", 3);
  requireOk(checkpoint::load_buffer(c.subject(), bytes.data(), bytes.size()));
  CHECK(save(c, Form::Compressed) == bytes);
}

TEST_CASE("checkpoint: envelopes before their first step stay unset "
          "through a round trip") {
  Run a("adamw_bf16_m24", 4);
  Run b("adamw_bf16_m24", 5);
  b.train(); // b's envelopes are set
  std::vector<uint8_t> bytes = save(a, Form::Compressed);
  auto f = safetensors::File::parse(bytes, "test");
  REQUIRE(f.ok());
  json groups = json::parse(f->metadata().at("param_groups"));
  CHECK(groups[0]["beta1_max"].is_null());
  requireOk(checkpoint::load_buffer(b.subject(), bytes.data(), bytes.size()));
  CHECK(Snapshot(a) == Snapshot(b));
}

TEST_CASE("checkpoint: the f32 form restores masters and plain states bit "
          "for bit, and a file holds the buffer's bytes") {
  Run a("adamw_bf16_m24_f32states", 6);
  a.train();
  Run b("adamw_bf16_m24_f32states", 7);
  std::vector<uint8_t> bytes = save(a, Form::F32);
  const std::string path = scratch("f32.safetensors").string();
  requireOk(checkpoint::save_file(a.subject(), path, Form::F32));
  CHECK(fileBytes(path) == bytes);
  requireOk(checkpoint::load_file(b.subject(), path));
  // The masters as fp32 values (their param + correction pairs as the
  // host codec encodes them: not necessarily the pairs the kernel left),
  // the plain states, the counters and hyper tables: the same f32 image.
  for (int64_t i = 0; i < 3; ++i) {
    auto ma = checkpoint::export_master(a.subject(), i);
    auto mb = checkpoint::export_master(b.subject(), i);
    REQUIRE(ma.ok());
    REQUIRE(mb.ok());
    CHECK(*ma == *mb);
  }
  Snapshot x(a), y(b);
  CHECK(x.steps == y.steps);
  CHECK(x.skipped == y.skipped);
  CHECK(x.given == y.given);
  CHECK(save(b, Form::F32) == bytes);
  // The f32 form of a quantized spec holds the decoded states, one f32
  // tensor per state: what export_state gives.
  Run q("adamw_bf16_m24", 8);
  q.train();
  auto f = safetensors::File::parse(save(q, Form::F32), "test");
  REQUIRE(f.ok());
  const host::StateSpec *s =
      checkpoint::stored_state(q.opt->manifest(), "exp_avg_sq");
  REQUIRE(s);
  auto v = checkpoint::export_state(q.subject(), 1, *s);
  REQUIRE(v.ok());
  const safetensors::StoredTensor *t = f->find("w1.exp_avg_sq");
  REQUIRE(t);
  CHECK(t->dtype == DType::F32);
  CHECK(t->shape == std::vector<int64_t>{7, 11});
  REQUIRE(size_t(t->bytes) == v->size() * sizeof(float));
  CHECK(std::memcmp(t->data, v->data(), size_t(t->bytes)) == 0);
}

TEST_CASE("checkpoint: validate returns the plan of a load, changing "
          "nothing, and apply carries it out") {
  Run a("adamw_bf16_m24", 9);
  a.train();
  Run b("adamw_bf16_m24", 10);
  const std::vector<uint8_t> bytes = save(a, Form::Compressed);
  auto f = checkpoint::read_buffer(bytes.data(), bytes.size());
  REQUIRE_MESSAGE(f.ok(), f.error());
  Snapshot before(b);
  auto plan = checkpoint::validate(b.subject(), *f, "test");
  REQUIRE_MESSAGE(plan.ok(), plan.error());
  CHECK(Snapshot(b) == before);
  CHECK(plan->form == Form::Compressed);
  CHECK(plan->steps == std::vector<int64_t>{2, 3, 2});
  CHECK(plan->step == 2);
  CHECK(plan->skipped == 1);
  CHECK(plan->hypers.size() == 2);
  // Per tensor: param, correction, exp_avg codes + scales, exp_avg_sq
  // codes + scales.
  REQUIRE(plan->tensors.size() == 3 * 6);
  CHECK(plan->tensors[0].name == "w0");
  CHECK(plan->tensors[1].name == "w0.correction");
  CHECK(plan->tensors[1].buffer == "correction");
  requireOk(checkpoint::apply(b.subject(), *f, *plan));
  CHECK(Snapshot(a) == Snapshot(b));
}

TEST_CASE("checkpoint: validate refuses a corrupt, truncated, malformed or "
          "lying checkpoint with FORMAT, and nothing is loaded") {
  Run a("adamw_bf16_m24", 11);
  a.train();
  Run b("adamw_bf16_m24", 12);
  b.train();
  const std::vector<uint8_t> good = save(a, Form::Compressed);

  SUBCASE("a flipped data bit") {
    std::vector<uint8_t> bad = good;
    bad.back() ^= 0x10;
    refused(b, bad, Code::Format, "(the file is corrupt)");
  }
  SUBCASE("truncated") {
    std::vector<uint8_t> bad(good.begin(), good.begin() + good.size() / 2);
    refused(b, bad, Code::Format, "checkpoint buffer");
    refused(b, std::vector<uint8_t>(good.begin(), good.begin() + 5),
            Code::Format, "checkpoint buffer");
  }
  SUBCASE("a header edited without its checksum") {
    refused(b,
            rewriteMeta(
                good, [](auto &m) { m["step"] = "7"; }, /*resum=*/false),
            Code::Format, "(the header is corrupt or was edited)");
  }
  SUBCASE("not a flashopt checkpoint") {
    refused(b, rewriteMeta(good, [](auto &m) { m.clear(); }), Code::Format,
            "not a flashopt checkpoint");
    refused(b, rewriteMeta(good, [](auto &m) { m["format_version"] = "2"; }),
            Code::Format, "unsupported checkpoint format_version '2'");
    refused(b, rewriteMeta(good, [](auto &m) { m["checkpoint"] = "fp8"; }),
            Code::Format, "unknown checkpoint form 'fp8'");
  }
  SUBCASE("malformed counters and lists") {
    refused(b, rewriteMeta(good, [](auto &m) { m["step"] = "-1"; }),
            Code::Format, "'step' is not a non-negative integer");
    refused(b, rewriteMeta(good, [](auto &m) { m.erase("skipped_steps"); }),
            Code::Format, "has no 'skipped_steps'");
    refused(b, rewriteMeta(good, [](auto &m) { m["params"] = "{"; }),
            Code::Format, "'params' is not valid JSON");
    refused(b,
            rewriteMeta(good,
                        [](auto &m) {
                          json p = json::parse(m["params"]);
                          p.push_back(p[0]);
                          m["params"] = p.dump();
                        }),
            Code::Format, "lists parameter 'w0' more than once");
    refused(b,
            rewriteMeta(good,
                        [](auto &m) {
                          json g = json::parse(m["param_groups"]);
                          g[1]["lr"] = "fast";
                          m["param_groups"] = g.dump();
                        }),
            Code::Format, "param group 1 has no number 'lr'");
  }
  SUBCASE("a checksum that lies about the data") {
    refused(b,
            rewriteMeta(good,
                        [](auto &m) {
                          json c = json::parse(m["checksums"]);
                          c["w1.correction"] = "crc32c:00000000";
                          m["checksums"] = c.dump();
                        }),
            Code::Format, "tensor 'w1.correction': data checksum is crc32c:");
    refused(b,
            rewriteMeta(good,
                        [](auto &m) {
                          json c = json::parse(m["checksums"]);
                          c["w9"] = "crc32c:00000000";
                          m["checksums"] = c.dump();
                        }),
            Code::Format, "names tensors the file does not hold");
  }
  SUBCASE("an f32 master beyond the parameter's range") {
    const std::vector<uint8_t> f32 = save(a, Form::F32);
    // Finite in f32, +Inf once rounded to bf16.
    std::vector<float> huge(1000, std::numeric_limits<float>::max());
    refused(b,
            rewrite(
                f32,
                [&](std::vector<safetensors::TensorRef> &refs) {
                  for (auto &r : refs)
                    if (r.name == "w0")
                      r.data = huge.data();
                },
                [&](auto &m) {
                  json c = json::parse(m["checksums"]);
                  c["w0"] = checkpoint::checksum_text(huge.data(), 4000);
                  m["checksums"] = c.dump();
                },
                true),
            Code::Format,
            "tensor 'w0': parameter 'w0' (index 0): element 0 is");
  }
}

TEST_CASE("checkpoint: validate refuses a checkpoint of another layout with "
          "MISMATCH, and nothing is loaded") {
  Run a("adamw_bf16_m24", 13);
  a.train();
  const std::vector<uint8_t> good = save(a, Form::Compressed);

  SUBCASE("fewer tensors here") {
    Run b("adamw_bf16_m24", 14, {kParams[0], kParams[1]});
    refused(b, good, Code::Mismatch,
            "the checkpoint holds parameter 'b', which is not registered "
            "here");
  }
  SUBCASE("more tensors here") {
    std::vector<Param> more = kParams;
    more.push_back({"extra", {3}, 0});
    Run b("adamw_bf16_m24", 15, more);
    refused(b, good, Code::Mismatch,
            "parameter 'extra' (index 3) is not in the checkpoint");
  }
  SUBCASE("another shape of the same numel") {
    std::vector<Param> other = kParams;
    other[1].shape = {11, 7};
    Run b("adamw_bf16_m24", 16, other);
    refused(b, good, Code::Mismatch,
            "gives parameter 'w1' shape [7, 11], but parameter 'w1' (index "
            "1) has shape [11, 7]");
  }
  SUBCASE("another numel") {
    std::vector<Param> other = kParams;
    other[0].shape = {999};
    Run b("adamw_bf16_m24", 17, other);
    refused(b, good, Code::Mismatch, "numel 1000, but parameter 'w0'");
  }
  SUBCASE("another param group") {
    std::vector<Param> other = kParams;
    other[2].group = 0;
    Run b("adamw_bf16_m24", 18, other);
    refused(b, good, Code::Mismatch,
            "parameter 'b' is in param group 1 in the checkpoint but in "
            "group 0 here");
  }
  SUBCASE("another encoding of a tensor") {
    Run b("adamw_bf16_m24", 19);
    // exp_avg's codes recorded as U8 (the same bytes, consistent
    // checksums): the encoding is not this spec's.
    refused(b,
            rewrite(
                good,
                [](std::vector<safetensors::TensorRef> &refs) {
                  for (auto &r : refs)
                    if (r.name == "w0.exp_avg.codes")
                      r.dtype = DType::U8;
                },
                [](auto &) {}, true),
            Code::Mismatch, "tensor 'w0.exp_avg.codes' is U8, expected I8");
    // A tensor the spec does not have.
    std::vector<uint8_t> extra(4, 0);
    refused(b,
            rewrite(
                good,
                [&](std::vector<safetensors::TensorRef> &refs) {
                  safetensors::TensorRef r;
                  r.name = "w0.momentum";
                  r.dtype = DType::F32;
                  r.shape = {1};
                  r.data = extra.data();
                  refs.push_back(r);
                },
                [](auto &) {}, true),
            Code::Mismatch, "unexpected tensor 'w0.momentum'");
  }
  SUBCASE("another spec") {
    Run b("adamw_bf16_m24_f32states", 20);
    refused(b, good, Code::Mismatch, "checkpoint of spec 'adamw_bf16_m24'");
  }
  SUBCASE("more param groups in the checkpoint") {
    const std::vector<Param> one = {
        {"w0", {1000}, 0}, {"w1", {7, 11}, 0}, {"b", {5}, 0}};
    Run c("adamw_bf16_m24", 21, one);
    Run b("adamw_bf16_m24", 25, one);
    refused(b,
            rewriteMeta(save(c, Form::Compressed),
                        [](auto &m) {
                          json g = json::parse(m["param_groups"]);
                          g.push_back(g[0]);
                          m["param_groups"] = g.dump();
                        }),
            Code::Mismatch,
            "the checkpoint has 2 param groups, this optimizer 1");
  }
}

TEST_CASE("checkpoint: a failed save leaves the previous checkpoint intact") {
  Run a("adamw_bf16_m24", 22);
  const std::string path = scratch("kept.safetensors").string();
  requireOk(checkpoint::save_file(a.subject(), path, Form::Compressed));
  const std::vector<uint8_t> first = fileBytes(path);
  a.train();
  for (auto stage :
       {safetensors::WriteStage::Open, safetensors::WriteStage::Write,
        safetensors::WriteStage::Fsync, safetensors::WriteStage::Rename}) {
    safetensors::WriteFault fault;
    fault.stage = stage;
    fault.at_byte = 100;
    safetensors::set_write_fault_for_testing(fault);
    host::Status s = checkpoint::save_file(a.subject(), path, Form::Compressed);
    safetensors::set_write_fault_for_testing(std::nullopt);
    CHECK(s.code() == Code::Io);
    CHECK(fileBytes(path) == first);
  }
  // No temporary file was left next to it.
  int files = 0;
  for (const auto &e : fs::directory_iterator(fs::path(path).parent_path()))
    files += contains(e.path().filename().string(), "kept") ? 1 : 0;
  CHECK(files == 1);
  // The previous checkpoint still loads.
  Run b("adamw_bf16_m24", 23);
  requireOk(checkpoint::load_file(b.subject(), path));
  Run c("adamw_bf16_m24", 22);
  CHECK(Snapshot(b) == Snapshot(c));
  // A path that cannot be a file.
  CHECK(
      checkpoint::save_file(a.subject(), scratch("").string(), Form::Compressed)
          .code() == Code::Io);
  CHECK(checkpoint::load_file(b.subject(), scratch("none").string()).code() ==
        Code::Io);
}

TEST_CASE("checkpoint: names that do not name every tensor are INTERNAL, "
          "and nothing is read or written") {
  Run a("adamw_bf16_m24", 24);
  NameTable two;
  requireOk(two.add("w0", {1000}));
  requireOk(two.add("w1", {7, 11}));
  CHECK(two.add("w0", {1}).code() == Code::InvalidArgument);
  Subject s(*a.stepper, two);
  CHECK(checkpoint::save_buffer(s, Form::Compressed).code() == Code::Internal);
  std::vector<uint8_t> bytes = save(a, Form::Compressed);
  Snapshot before(a);
  CHECK(checkpoint::load_buffer(s, bytes.data(), bytes.size()).code() ==
        Code::Internal);
  CHECK(Snapshot(a) == before);
}

//===----------------------------------------------------------------------===//
// 4-bit states (docs/design/4bit-states.md §6, §8 T4)
//===----------------------------------------------------------------------===//

namespace {

const char *const kFourBit[] = {"adamw_bf16_m24_4bit", "sgd_f32_4bit"};

/// The 8-bit shipped spec a 4-bit test spec differs from in its states only.
std::string eightBitOf(const std::string &fourbit) {
  return fourbit.substr(0, fourbit.size() - 5);
}

std::vector<float> masterOf(const Run &r, int64_t i) {
  auto v = checkpoint::export_master(r.subject(), i);
  REQUIRE_MESSAGE(v.ok(), v.error());
  return std::move(v.value());
}

std::vector<float> stateOf(const Run &r, int64_t i, const std::string &name) {
  const host::StateSpec *s = checkpoint::stored_state(r.opt->manifest(), name);
  REQUIRE(s);
  auto v = checkpoint::export_state(r.subject(), i, *s);
  REQUIRE_MESSAGE(v.ok(), v.error());
  return std::move(v.value());
}

/// `from`'s f32 checkpoint loaded into `to` (another state width): the same
/// masters, counters and hyper tables; states re-encoded from the fp32 ones,
/// so close to them (the coarser code's error), not equal.
void convertsThroughF32(const Run &from, Run &to) {
  std::vector<uint8_t> f32 = save(from, Form::F32);
  requireOk(checkpoint::load_buffer(to.subject(), f32.data(), f32.size()));
  Snapshot x(from), y(to);
  CHECK(x.steps == y.steps);
  CHECK(x.step == y.step);
  CHECK(x.skipped == y.skipped);
  CHECK(x.hypers == y.hypers);
  CHECK(x.given == y.given);
  for (int64_t i = 0; i < from.opt->num_tensors(); ++i) {
    CAPTURE(i);
    CHECK(masterOf(from, i) == masterOf(to, i));
    for (const host::StateSpec &st : from.opt->manifest().states) {
      CAPTURE(st.name);
      std::vector<float> a = stateOf(from, i, st.name);
      std::vector<float> b = stateOf(to, i, st.name);
      REQUIRE(a.size() == b.size());
      double err = 0, mass = 0;
      for (size_t k = 0; k < a.size(); ++k) {
        err += std::abs(double(a[k]) - double(b[k]));
        mass += std::abs(double(a[k]));
      }
      CHECK(mass > 0);
      CHECK(err <= 0.25 * mass);
    }
  }
}

} // namespace

TEST_CASE("checkpoint: a 4-bit optimizer round-trips bit for bit in both "
          "forms, its codes stored as U8 [ceil(n/2)] with a zero pad nibble") {
  for (const char *spec : kFourBit) {
    CAPTURE(spec);
    Run a(spec, 31);
    a.train();
    const std::vector<uint8_t> bytes = save(a, Form::Compressed);
    auto f = safetensors::File::parse(bytes, "test");
    REQUIRE_MESSAGE(f.ok(), f.error());
    CHECK(f->metadata().at("packing") == "nibbles:low-first");
    CHECK(f->metadata().at("state_encodings") ==
          (std::string(spec) == "sgd_f32_4bit"
               ? "momentum_buffer=quantized:i4:e2m1:32:bf16"
               : "exp_avg=quantized:i4:e2m1:32:bf16;"
                 "exp_avg_sq=quantized:ui4:e3m1:32:bf16"));
    // Odd (77, 5) and even (1000) numels: ceil(n/2) bytes, the last one's
    // high nibble 0 when n is odd.
    const host::StateSpec &st0 = a.opt->manifest().states[0];
    for (size_t i = 0; i < kParams.size(); ++i) {
      const std::string name = kParams[i].name + "." + st0.name + ".codes";
      CAPTURE(name);
      const safetensors::StoredTensor *t = f->find(name);
      REQUIRE(t);
      const int64_t n = a.opt->tensor(int64_t(i)).numel;
      CHECK(t->dtype == DType::U8);
      CHECK(t->shape == std::vector<int64_t>{(n + 1) / 2});
      REQUIRE(t->bytes == (n + 1) / 2);
      if (n % 2)
        CHECK((t->data[t->bytes - 1] & 0xF0) == 0);
      auto held = a.opt->read_buffer(int64_t(i), st0.name + ".codes");
      REQUIRE(held.ok());
      CHECK(std::vector<uint8_t>(t->data, t->data + t->bytes) == *held);
    }
    // Compressed: every buffer, counter and hyper-parameter, and training
    // goes on the same.
    Run b(spec, 32);
    requireOk(checkpoint::load_buffer(b.subject(), bytes.data(), bytes.size()));
    CHECK(Snapshot(a) == Snapshot(b));
    CHECK(a.p == b.p);
    CHECK(save(b, Form::Compressed) == bytes);
    b.g = a.g;
    for (int k = 0; k < 2; ++k) {
      requireOk(a.stepper->step());
      requireOk(b.stepper->step());
    }
    CHECK(Snapshot(a) == Snapshot(b));
    // f32: masters and decoded states; loading re-encodes them, and decoded
    // 4-bit values re-encode to the same values, so the f32 image comes back
    // bit for bit. (Not necessarily the same codes: a group whose largest
    // value the kernel left below the top code gets the scale of its
    // largest value, and codes that say the same values at that scale.)
    const std::vector<uint8_t> f32 = save(a, Form::F32);
    auto g = safetensors::File::parse(f32, "test");
    REQUIRE(g.ok());
    CHECK(g->metadata().count("packing") == 0);
    CHECK(g->metadata().at("state_encodings") ==
          f->metadata().at("state_encodings"));
    Run c(spec, 33);
    requireOk(checkpoint::load_buffer(c.subject(), f32.data(), f32.size()));
    CHECK(save(c, Form::F32) == f32);
  }
}

TEST_CASE("checkpoint: a compressed 4-bit AdamW bf16 + i8 checkpoint takes "
          "at most 4.2 bytes per parameter (T4)") {
  // A 2^20-element tensor plus 10 small ones.
  std::vector<Param> params = {{"big", {1 << 20}, 0}};
  int64_t numel = 1 << 20;
  for (int k = 0; k < 10; ++k) {
    params.push_back({"small" + std::to_string(k), {3 + 37 * k}, k % 2});
    numel += 3 + 37 * k;
  }
  Run a("adamw_bf16_m24_4bit", 34, params);
  requireOk(a.stepper->step());
  const std::string path = scratch("t4.safetensors").string();
  requireOk(checkpoint::save_file(a.subject(), path, Form::Compressed));
  const double perParam = double(fs::file_size(path)) / double(numel);
  MESSAGE("compressed adamw_bf16_m24_4bit: " << perParam << " B/param");
  CHECK(perParam >= 4.125); // 2 + 1 + 2 x (0.5 + 2/32), plus the header
  CHECK(perParam <= 4.2);
  Run b("adamw_bf16_m24_4bit", 35, params);
  requireOk(checkpoint::load_file(b.subject(), path));
  CHECK(Snapshot(a) == Snapshot(b));
}

TEST_CASE("checkpoint: compressed files are refused across state widths, "
          "naming the state, and the f32 form converts between 8 and 4 "
          "bits") {
  Run a4("adamw_bf16_m24_4bit", 36);
  a4.train();
  Run a8("adamw_bf16_m24", 37);
  a8.train();
  SUBCASE("4-bit file, 8-bit optimizer") {
    Run b8("adamw_bf16_m24", 38);
    refused(b8, save(a4, Form::Compressed), Code::Mismatch,
            "the checkpoint holds 4-bit exp_avg (i4 e2m1), this optimizer "
            "8-bit exp_avg (i8 softsign): load its f32 form to convert");
    convertsThroughF32(a4, b8);
  }
  SUBCASE("8-bit file, 4-bit optimizer") {
    Run b4("adamw_bf16_m24_4bit", 39);
    refused(b4, save(a8, Form::Compressed), Code::Mismatch,
            "the checkpoint holds 8-bit exp_avg (i8 softsign), this optimizer "
            "4-bit exp_avg (i4 e2m1): load its f32 form to convert");
    convertsThroughF32(a8, b4);
  }
  SUBCASE("one state each way, SGD with momentum") {
    Run s4("sgd_f32_4bit", 40), s8(eightBitOf("sgd_f32_4bit"), 41);
    s4.train();
    s8.train();
    Run t4("sgd_f32_4bit", 42), t8(eightBitOf("sgd_f32_4bit"), 43);
    refused(t8, save(s4, Form::Compressed), Code::Mismatch,
            "the checkpoint holds 4-bit momentum_buffer (i4 e2m1), this "
            "optimizer 8-bit momentum_buffer");
    refused(t4, save(s8, Form::Compressed), Code::Mismatch,
            "this optimizer 4-bit momentum_buffer (i4 e2m1)");
    convertsThroughF32(s4, t8);
    convertsThroughF32(s8, t4);
  }
  SUBCASE("the spec check still holds when the encodings agree") {
    // Another spec of the same 4-bit states (a spec_hash edit, checksum
    // fixed up): refused by the spec, in both forms.
    Run b4("adamw_bf16_m24_4bit", 44);
    for (Form form : {Form::Compressed, Form::F32})
      refused(b4,
              rewriteMeta(save(a4, form),
                          [](auto &m) { m["spec_hash"] = "fnv1a64:0"; }),
              Code::Mismatch, "checkpoint of spec 'adamw_bf16_m24_4bit'");
  }
}

TEST_CASE("checkpoint: an edited state_encodings or packing is refused, and "
          "files written before state_encodings existed still load") {
  Run a("adamw_bf16_m24_4bit", 45);
  a.train();
  Run b("adamw_bf16_m24_4bit", 46);
  const std::vector<uint8_t> good = save(a, Form::Compressed);
  SUBCASE("a consistent lie about the encodings") {
    refused(b,
            rewriteMeta(good,
                        [](auto &m) {
                          m["state_encodings"] =
                              "exp_avg=quantized:i4:e2m1:32:bf16;"
                              "exp_avg_sq=quantized:ui8:e4m4:32:bf16";
                        }),
            Code::Mismatch,
            "the checkpoint holds 8-bit exp_avg_sq (ui8 e4m4), this "
            "optimizer 4-bit exp_avg_sq (ui4 e3m1)");
    refused(b,
            rewriteMeta(good,
                        [](auto &m) {
                          m["state_encodings"] =
                              "exp_avg=quantized:i4:e2m1:64:bf16;"
                              "exp_avg_sq=quantized:ui4:e3m1:32:bf16";
                        }),
            Code::Mismatch,
            "4-bit exp_avg (i4 e2m1, groups of 64, bf16 scales), this "
            "optimizer 4-bit exp_avg (i4 e2m1, groups of 32, bf16 scales)");
  }
  SUBCASE("an edit without the checksum") {
    refused(b,
            rewriteMeta(
                good,
                [](auto &m) {
                  m["state_encodings"] = "exp_avg=plain:f32;exp_avg_sq=elided";
                },
                /*resum=*/false),
            Code::Format, "(the header is corrupt or was edited)");
  }
  SUBCASE("malformed") {
    refused(
        b, rewriteMeta(good, [](auto &m) { m["state_encodings"] = "exp_avg"; }),
        Code::Format,
        "__metadata__ 'state_encodings' entry 'exp_avg' is not "
        "<state>=<encoding>");
    refused(b,
            rewriteMeta(good,
                        [](auto &m) {
                          m["state_encodings"] =
                              "exp_avg=elided;exp_avg=elided";
                        }),
            Code::Format, "lists state 'exp_avg' more than once");
  }
  SUBCASE("packing") {
    refused(
        b,
        rewriteMeta(good, [](auto &m) { m["packing"] = "nibbles:high-first"; }),
        Code::Format, "unknown __metadata__ 'packing' 'nibbles:high-first'");
    refused(b, rewriteMeta(good, [](auto &m) { m.erase("packing"); }),
            Code::Format,
            "the checkpoint holds packed 4-bit codes, but __metadata__ has no "
            "'packing'");
  }
  SUBCASE("an older file (no state_encodings) loads as before") {
    Run o("adamw_bf16_m24", 47);
    o.train();
    Run p("adamw_bf16_m24", 48);
    for (bool checksum : {true, false}) {
      std::vector<uint8_t> old = rewriteMeta(
          save(o, Form::Compressed),
          [&](auto &m) {
            m.erase("state_encodings");
            if (!checksum)
              m.erase(checkpoint::kMetadataChecksumKey);
          },
          checksum);
      requireOk(checkpoint::load_buffer(p.subject(), old.data(), old.size()));
      CHECK(Snapshot(o) == Snapshot(p));
    }
    // Without the key, another width is the spec's mismatch, as before.
    refused(b,
            rewriteMeta(save(o, Form::Compressed),
                        [](auto &m) { m.erase("state_encodings"); }),
            Code::Mismatch, "checkpoint of spec 'adamw_bf16_m24'");
  }
}

TEST_CASE("checkpoint: the 4-bit seed of the checkpoint fuzzer's corpus") {
  // FLASHOPT_WRITE_FOURBIT_SEED=FILE writes fuzz/corpus/checkpoint/
  // compressed-4bit.safetensors: the fuzzer's parameters ("w" [100], "b" [32]
  // in two groups) in a 4-bit AdamW, stepped twice.
  const std::vector<Param> fuzzParams = {{"w", {100}, 0}, {"b", {32}, 1}};
  Run a("adamw_bf16_m24_4bit", 49, fuzzParams);
  requireOk(a.stepper->step());
  requireOk(a.stepper->step());
  const std::vector<uint8_t> bytes = save(a, Form::Compressed);
  CHECK(bytes.size() < 8192);
  if (const char *out = std::getenv("FLASHOPT_WRITE_FOURBIT_SEED"))
    requireOk(checkpoint::save_file(a.subject(), out, Form::Compressed));
}
