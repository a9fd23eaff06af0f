//===- CApiTest.cpp - The C ABI on every shipped spec
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The C ABI on the CPU, for every shipped spec (specs/*.json, bundles in
/// build/kernels): stepping through the ABI equals host::Optimizer stepping
/// identical copies bit for bit; step_param over every parameter equals one
/// step; checkpoints round-trip in both forms; resume is exact; master
/// weights, states and buffers export and import; bundles and buffers are
/// described. The other API areas are in the files beside this one.
///
//===----------------------------------------------------------------------===//

#include "CApiTestSupport.h"

using namespace capitest;

//===----------------------------------------------------------------------===//
// Every shipped spec
//===----------------------------------------------------------------------===//

TEST_CASE("every shipped spec has a bundle") {
  std::vector<std::string> specs = shippedSpecs();
  CHECK(specs.size() >= 20);
  for (const std::string &s : specs)
    CHECK_MESSAGE(fs::exists(bundleDir(s) + "/manifest.json"),
                  s << ": no bundle in " << bundleDir(s));
}

TEST_CASE("C ABI on the CPU, every shipped spec") {
  for (const std::string &spec : shippedSpecs()) {
    CAPTURE(spec);
    Expected<Manifest> mOr = load_manifest(bundleDir(spec) + "/manifest.json");
    REQUIRE_MESSAGE(mOr.ok(), mOr.error());
    const Manifest &m = *mOr;
    const int N = 3, M = 2;

    // ABI vs host::Optimizer on identical copies, N steps.
    Model base(m, 7);
    Model ma = base.clone(), mh = base.clone();
    AbiOpt a(spec, ma);
    std::unique_ptr<CpuOptimizer> h = hostOpt(spec, mh);
    flashopt_optimizer_info info{};
    REQUIRE(flashopt_optimizer_get_info(a.opt, &info) == FLASHOPT_OK);
    CHECK(std::string(info.name) == spec);
    CHECK(std::string(info.spec_hash) == m.spec_hash);
    CHECK(info.group_size == m.group_size);
    CHECK(info.device_type == FLASHOPT_DEVICE_CPU);
    {
      // What the bundle is, without an optimizer; its buffers, with one.
      flashopt_bundle_desc d{};
      REQUIRE(flashopt_describe_bundle(bundleDir(spec).c_str(), &d) ==
              FLASHOPT_OK);
      CHECK(std::string(d.name) == spec);
      CHECK(std::string(d.rule) == m.rule);
      CHECK(std::string(d.numerics) == m.numerics);
      CHECK(std::string(d.arithmetic) == m.arithmetic);
      CHECK(d.param_dtype == info.param_dtype);
      CHECK(d.has_correction == info.has_correction);
      int32_t q = 0, p = 0, bits = 0;
      for (const StateSpec &st : m.states) {
        q += st.kind == StateKind::Quantized;
        p += st.kind == StateKind::Plain;
        if (st.kind == StateKind::Quantized)
          bits = std::max(bits, int32_t(flashopt::abi::dtype_bits(st.storage)));
      }
      CHECK(d.quantized_states == q);
      CHECK(d.plain_states == p);
      CHECK(d.state_bits == bits);
      // The shipped bundles: 8-bit states, or 4-bit ones in the *_4bit and
      // *_4bit_fast specs.
      bool fourBit = spec.find("_4bit") != std::string::npos;
      CHECK(d.state_bits == (q > 0 ? (fourBit ? 4 : 8) : 0));
      int32_t nb = -1;
      REQUIRE(flashopt_num_buffers(a.opt, &nb) == FLASHOPT_OK);
      std::vector<std::string> names;
      for (int32_t k = 0; k < nb; ++k) {
        flashopt_buffer_desc b{};
        REQUIRE(flashopt_get_buffer_desc(a.opt, k, &b) == FLASHOPT_OK);
        names.push_back(b.name);
        // Each one reads back at the size its description implies.
        const int64_t n0 = kSizes[0];
        const int64_t count = b.per_group ? (n0 + m.group_size - 1) / m.group_size : n0;
        std::vector<uint8_t> bytes(
            (size_t(count) * flashopt_dtype_bits(b.dtype) + 7) / 8);
        size_t sized = 0;
        REQUIRE(flashopt_buffer_size(a.opt, 0, b.name, &sized) == FLASHOPT_OK);
        CHECK(sized == bytes.size());
        CHECK_MESSAGE(flashopt_read_buffer(a.opt, 0, b.name, bytes.data(),
                                           bytes.size()) == FLASHOPT_OK,
                      b.name << ": " << lastError());
      }
      std::vector<std::string> want;
      if (m.correction)
        want.push_back("correction");
      for (const StateSpec &st : m.states)
        for (const flashopt::abi::StateBuffer &b :
             flashopt::abi::state_buffers(st))
          want.push_back(st.name + b.suffix);
      CHECK(names == want);
      flashopt_buffer_desc none{};
      CHECK(flashopt_get_buffer_desc(a.opt, nb, &none) ==
            FLASHOPT_ERROR_INVALID_ARGUMENT);
    }
    for (int s = 1; s <= N; ++s) {
      ma.fillGrads(s);
      mh.fillGrads(s);
      stepOk(a.opt);
      REQUIRE(h->step().ok());
    }
    int64_t t = -1;
    REQUIRE(flashopt_get_step(a.opt, -1, &t) == FLASHOPT_OK);
    CHECK(t == N);
    REQUIRE(flashopt_get_step(a.opt, 2, &t) == FLASHOPT_OK);
    CHECK(t == N);
    CHECK_MESSAGE(!(ma.params[2] == base.params[2]), "the steps moved nothing");
    checkSameAsHost(a.opt, ma, *h, mh, spec + "-vs-host");

    // step_param over every parameter (reverse order) == step, N times.
    Model mp = base.clone();
    AbiOpt p(spec, mp);
    for (int s = 1; s <= N; ++s) {
      mp.fillGrads(s);
      for (int64_t i = int64_t(kSizes.size()) - 1; i >= 0; --i)
        REQUIRE_MESSAGE(flashopt_step_param(p.opt, i) == FLASHOPT_OK,
                        lastError());
    }
    REQUIRE(flashopt_get_step(p.opt, -1, &t) == FLASHOPT_OK);
    CHECK(t == 0); // no flashopt_step call
    REQUIRE(flashopt_get_step(p.opt, 0, &t) == FLASHOPT_OK);
    CHECK(t == N);
    for (size_t i = 0; i < kSizes.size(); ++i)
      CHECK_MESSAGE(mp.params[i] == ma.params[i], "step_param: param " << i);
    std::string pathA = savePath(spec + "-a"), pathP = savePath(spec + "-p");
    saveOk(a.opt, pathA);
    saveOk(p.opt, pathP);
    checkSameCheckpoint(pathA, pathP);

    // Counters that differ: one step_param ahead, then steps. Equals the
    // host optimizer stepping the same tensors with the same t.
    {
      Model mx = base.clone(), my = base.clone();
      AbiOpt x(spec, mx);
      std::unique_ptr<CpuOptimizer> hy = hostOpt(spec, my);
      mx.fillGrads(1);
      my.fillGrads(1);
      REQUIRE(flashopt_step_param(x.opt, 2) == FLASHOPT_OK);
      REQUIRE(hy->step_tensors({2}, 1).ok());
      mx.fillGrads(2);
      my.fillGrads(2);
      stepOk(x.opt); // tensor 2 at t = 2, the others at t = 1
      REQUIRE(hy->step_tensors({0, 1, 3, 4}, 1).ok());
      REQUIRE(hy->step_tensors({2}, 2).ok());
      REQUIRE(flashopt_get_step(x.opt, 2, &t) == FLASHOPT_OK);
      CHECK(t == 2);
      REQUIRE(flashopt_get_step(x.opt, 3, &t) == FLASHOPT_OK);
      CHECK(t == 1);
      checkSameAsHost(x.opt, mx, *hy, my, spec + "-mixed");
      // Independently of step_tensors: one host optimizer per tensor, each
      // stepped with plain step() as often as its counter says.
      Model mz = base.clone();
      std::vector<std::unique_ptr<CpuOptimizer>> singles;
      for (size_t i = 0; i < kSizes.size(); ++i)
        singles.push_back(hostOpt(spec, mz, int(i)));
      mz.fillGrads(1);
      REQUIRE(singles[2]->step().ok());
      mz.fillGrads(2);
      for (auto &o : singles)
        REQUIRE(o->step().ok());
      checkSameAsSingles(x.opt, mx, singles, mz, spec + "-singles");
    }

    // Compressed round trip and exact resume: load into fresh memory,
    // then M more steps on both equal N + M steps.
    Model mr(m, 99); // other values: the load must overwrite them
    AbiOpt r(spec, mr);
    REQUIRE_MESSAGE(flashopt_load_checkpoint(r.opt, pathA.c_str()) ==
                        FLASHOPT_OK,
                    lastError());
    for (size_t i = 0; i < kSizes.size(); ++i)
      CHECK_MESSAGE(mr.params[i] == ma.params[i], "loaded param " << i);
    REQUIRE(flashopt_get_step(r.opt, -1, &t) == FLASHOPT_OK);
    CHECK(t == N);
    std::string pathR = savePath(spec + "-r");
    saveOk(r.opt, pathR);
    checkSameCheckpoint(pathA, pathR);
    for (int s = N + 1; s <= N + M; ++s) {
      ma.fillGrads(s);
      mr.fillGrads(s);
      stepOk(a.opt);
      stepOk(r.opt);
    }
    for (size_t i = 0; i < kSizes.size(); ++i)
      CHECK_MESSAGE(mr.params[i] == ma.params[i], "resumed param " << i);
    saveOk(a.opt, pathA);
    saveOk(r.opt, pathR);
    checkSameCheckpoint(pathA, pathR);

    // F32 form: masters and dequantized states; loading it restores the
    // master weights bit for bit and states that dequantize to the same
    // values.
    std::string pathF = savePath(spec + "-f32");
    saveOk(a.opt, pathF, FLASHOPT_CHECKPOINT_F32);
    {
      Expected<safetensors::File> f = safetensors::File::read(pathF);
      REQUIRE_MESSAGE(f.ok(), f.error());
      CHECK(f->metadata().at("checkpoint") == "f32");
      for (auto &kv : f->tensors())
        CHECK_MESSAGE(kv.second.dtype == DType::F32, kv.first);
    }
    Model mf(m, 5);
    AbiOpt fo(spec, mf);
    REQUIRE_MESSAGE(flashopt_load_checkpoint(fo.opt, pathF.c_str()) ==
                        FLASHOPT_OK,
                    lastError());
    std::string pathF2 = savePath(spec + "-f32b");
    saveOk(fo.opt, pathF2, FLASHOPT_CHECKPOINT_F32);
    {
      // States: the same f32 values; masters: as sameMaster says.
      auto ta = tensorsOf(pathF), tb = tensorsOf(pathF2);
      REQUIRE(ta.size() == tb.size());
      for (auto &kv : ta) {
        std::vector<float> x(kv.second.size() / 4), y(x.size());
        REQUIRE(tb[kv.first].size() == kv.second.size());
        std::memcpy(x.data(), kv.second.data(), kv.second.size());
        std::memcpy(y.data(), tb[kv.first].data(), kv.second.size());
        std::string why;
        bool isMaster = kv.first.size() >= 2 &&
                        kv.first.compare(kv.first.size() - 2, 2, ".w") == 0;
        if (isMaster)
          CHECK_MESSAGE(sameMaster(x, y, m, &why), kv.first << ": " << why);
        else
          CHECK_MESSAGE(kv.second == tb[kv.first], kv.first << " differs");
      }
    }

    // Master export / import round trip into a fresh optimizer.
    Model mi(m, 11);
    AbiOpt im(spec, mi);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      std::vector<float> w(size_t(kSizes[i])), back(size_t(kSizes[i]));
      REQUIRE(flashopt_export_master_f32(a.opt, int64_t(i), w.data(),
                                         kSizes[i]) == FLASHOPT_OK);
      REQUIRE(flashopt_import_master_f32(im.opt, int64_t(i), w.data(),
                                         kSizes[i]) == FLASHOPT_OK);
      REQUIRE(flashopt_export_master_f32(im.opt, int64_t(i), back.data(),
                                         kSizes[i]) == FLASHOPT_OK);
      std::string why;
      CHECK_MESSAGE(sameMaster(w, back, m, &why),
                    "master round trip " << i << ": " << why);
      // The parameter is the RTNE narrowing of the imported master.
      Buf narrow(mi.params[i].bytes);
      storeAs(w, m.param, narrow.data());
      CHECK_MESSAGE(mi.params[i] == narrow, "imported param " << i);
    }

    // States one at a time: export == the f32 checkpoint's tensor, and
    // import then export gives the same values (decoded values re-encode
    // to themselves) without touching the parameter or the other states.
    std::map<std::string, std::vector<uint8_t>> f32 = tensorsOf(pathF);
    int32_t stored = 0;
    for (const StateSpec &s : m.states)
      stored += !flashopt::abi::state_buffers(s).empty();
    CHECK(info.num_states == stored);
    for (int32_t k = 0; k < info.num_states; ++k) {
      const char *state = nullptr;
      REQUIRE(flashopt_state_name(a.opt, k, &state) == FLASHOPT_OK);
      for (size_t i = 0; i < kSizes.size(); ++i) {
        flashopt_param_info pi{};
        REQUIRE(flashopt_get_param_info(a.opt, int64_t(i), &pi) ==
                FLASHOPT_OK);
        const std::string key = std::string(pi.name) + "." + state;
        std::vector<float> v(static_cast<size_t>(kSizes[i])), back(v.size());
        REQUIRE_MESSAGE(flashopt_export_state_f32(a.opt, int64_t(i), state,
                                                  v.data(), kSizes[i]) ==
                            FLASHOPT_OK,
                        lastError());
        REQUIRE(f32.count(key));
        CHECK_MESSAGE(std::memcmp(f32[key].data(), v.data(),
                                  v.size() * 4) == 0,
                      key << ": export_state differs from the f32 form");
        Buf paramBefore = mi.params[i];
        REQUIRE_MESSAGE(flashopt_import_state_f32(im.opt, int64_t(i), state,
                                                  v.data(), kSizes[i]) ==
                            FLASHOPT_OK,
                        lastError());
        REQUIRE(flashopt_export_state_f32(im.opt, int64_t(i), state,
                                          back.data(),
                                          kSizes[i]) == FLASHOPT_OK);
        CHECK_MESSAGE(std::memcmp(back.data(), v.data(), v.size() * 4) == 0,
                      key << ": import then export changed it");
        CHECK_MESSAGE(mi.params[i] == paramBefore, key << ": param moved");
      }
    }
    const char *none = nullptr;
    CHECK(flashopt_state_name(a.opt, info.num_states, &none) ==
          FLASHOPT_ERROR_INVALID_ARGUMENT);
    std::vector<float> w0(static_cast<size_t>(kSizes[0]));
    CHECK(flashopt_export_state_f32(a.opt, 0, "no_such_state", w0.data(),
                                    kSizes[0]) ==
          FLASHOPT_ERROR_INVALID_ARGUMENT);
    CHECK(contains(flashopt_last_error(), "'no_such_state'"));
    if (info.num_states > 0) {
      const char *s0 = nullptr;
      REQUIRE(flashopt_state_name(a.opt, 0, &s0) == FLASHOPT_OK);
      CHECK(flashopt_import_state_f32(a.opt, 0, s0, w0.data(),
                                      kSizes[0] + 1) == FLASHOPT_ERROR_SIZE);
    }
  }
}


//===----------------------------------------------------------------------===//
// Python interoperability (run by its own ctest entry)
//===----------------------------------------------------------------------===//

TEST_CASE("python interop: safetensors.torch reads a checkpoint" *
          doctest::skip()) {
  std::string python = sourceDir() + "/.venv/bin/python";
  REQUIRE_MESSAGE(fs::exists(python),
                  python << " is missing: run scripts/setup.sh to create the "
                            "virtual environment with safetensors");
  Single s(1000);
  REQUIRE(flashopt_step(s.opt) == FLASHOPT_OK);
  std::string path = savePath("python");
  saveOk(s.opt, path);
  std::string out = (scratch() / "python.txt").string();
  std::string script = "import sys\n"
                       "from safetensors.torch import load_file\n"
                       "from safetensors import safe_open\n"
                       "t = load_file(sys.argv[1])\n"
                       "with open(sys.argv[2], 'w') as f:\n"
                       "    for k in sorted(t):\n"
                       "        f.write('%s %s %s\\n' % (k, str(t[k].dtype), "
                       "list(t[k].shape)))\n"
                       "    with safe_open(sys.argv[1], 'pt') as h:\n"
                       "        m = h.metadata()\n"
                       "        f.write('meta %s %s %s\\n' % (m['format'], "
                       "m['spec'], m['step']))\n";
  std::string scriptPath = (scratch() / "read.py").string();
  std::ofstream(scriptPath) << script;
  std::string cmd = python + " " + scriptPath + " " + path + " " + out;
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, cmd);
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  MESSAGE(text);
  CHECK(contains(text, "w torch.bfloat16 [1000]\n"));
  CHECK(contains(text, "w.correction torch.int8 [1000]\n"));
  CHECK(contains(text, "w.exp_avg.codes torch.int8 [1000]\n"));
  CHECK(contains(text, "w.exp_avg.scales torch.bfloat16 [32]\n"));
  CHECK(contains(text, "w.exp_avg_sq.codes torch.uint8 [1000]\n"));
  CHECK(contains(text, "w.exp_avg_sq.scales torch.bfloat16 [32]\n"));
  CHECK(contains(text, "meta flashopt.checkpoint adamw_bf16_m24 1\n"));
}
