//===- CApiStatusCodesTest.cpp - Every failure's status, entry by entry ---===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The public entry points' failures, provoked through the C ABI only, and
/// the exact flashopt_status of each: one row per entry point and failure.
/// A failure's code is set where it happens (abi/Status.h) and no entry
/// point re-labels it, so the same failure has the same status whichever
/// entry point meets it (a missing or malformed file, a driver, a
/// collective). Every message names its entry point and says why. The walk
/// produces every status but INTERNAL (a bug, which nothing provokes).
///
//===----------------------------------------------------------------------===//

#include "CApiTestSupport.h"

#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sys/stat.h>

using namespace capitest;

namespace {

/// One failure: the entry point, what is wrong, the status it must give.
struct Row {
  const char *fn;
  const char *what;
  flashopt_status want;
  std::function<flashopt_status()> call;
};

std::string slurp(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}
void spill(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

/// A copy of bundle `spec` under the scratch directory, as `tag`.
std::string copyOf(const std::string &spec, const std::string &tag) {
  fs::path dst = scratch() / "status-codes" / tag;
  fs::remove_all(dst);
  fs::create_directories(dst.parent_path());
  fs::copy(bundleDir(spec), dst, fs::copy_options::recursive);
  return dst.string();
}

/// Removes the files of `dir` whose extension is one of `exts`.
void removeFiles(const std::string &dir, const std::set<std::string> &exts) {
  for (const auto &e : fs::directory_iterator(dir))
    if (exts.count(e.path().extension().string()))
      fs::remove(e.path());
}

/// Replaces every file of `dir` with extension `ext` by bytes that are not
/// a shared object.
void garble(const std::string &dir, const std::string &ext) {
  for (const auto &e : fs::directory_iterator(dir))
    if (e.path().extension() == ext)
      spill(e.path().string(), "not an ELF file\n");
}

/// A world of two ranks seen from rank 0, in this process: rank 1 sends
/// what rank 0 sends (its layout differs by a byte with `mismatch`), and
/// with `fail` every collective fails.
struct FakeWorld {
  bool fail = false;
  bool mismatch = false;
};

int fakeAllGather(void *self, const void *send, void *recv, size_t bytes) {
  auto *w = static_cast<FakeWorld *>(self);
  if (w->fail)
    return 7;
  for (size_t r = 0; r < 2; ++r)
    std::memcpy(static_cast<char *>(recv) + r * bytes, send, bytes);
  if (w->mismatch && bytes > 16) // the layout text, not its length
    static_cast<char *>(recv)[bytes + 5] ^= 1;
  return 0;
}
int fakeAllToAll(void *self, const void *send, void *recv, size_t bytes) {
  if (static_cast<FakeWorld *>(self)->fail)
    return 7;
  for (size_t r = 0; r < 2; ++r)
    std::memcpy(static_cast<char *>(recv) + r * bytes, send, bytes);
  return 0;
}
int fakeBroadcast(void *self, void *, size_t, int32_t) {
  return static_cast<FakeWorld *>(self)->fail ? 7 : 0;
}
const char *fakeError(void *, int) { return "injected failure"; }

flashopt_comm_backend fakeBackend(FakeWorld *w) {
  flashopt_comm_backend b{};
  b.abi_version = FLASHOPT_ABI_VERSION;
  b.name = "fake";
  b.rank = 0;
  b.size = 2;
  b.self = w;
  b.all_gather = fakeAllGather;
  b.all_to_all = fakeAllToAll;
  b.broadcast = fakeBroadcast;
  b.error_string = fakeError;
  return b;
}

/// `bytes` of the stand-in driver's device memory (host memory it tracks),
/// released with the returned pointer.
std::shared_ptr<void> mockDeviceMemory(size_t bytes) {
  static void *lib = dlopen(FLASHOPT_MOCK_CUDA, RTLD_NOW);
  REQUIRE(lib);
  using Alloc = int (*)(unsigned long long *, size_t);
  using Free = int (*)(unsigned long long);
  static auto alloc = reinterpret_cast<Alloc>(dlsym(lib, "cuMemAlloc_v2"));
  static auto release = reinterpret_cast<Free>(dlsym(lib, "cuMemFree_v2"));
  const bool found = alloc && release;
  REQUIRE(found);
  unsigned long long p = 0;
  REQUIRE(alloc(&p, bytes) == 0);
  std::memset(reinterpret_cast<void *>(uintptr_t(p)), 0, bytes);
  return std::shared_ptr<void>(
      reinterpret_cast<void *>(uintptr_t(p)), [](void *q) {
        release(
            static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(q)));
      });
}

} // namespace

TEST_CASE("every failure of the public entry points has its status") {
  const std::string kernels = binaryDir() + "/kernels";

  // ---- fixtures ------------------------------------------------------------
  Single s(64); // adamw_bf16_m24, parameter "w" with a gradient
  flashopt_context ctx = s.ctx;
  flashopt_optimizer opt = s.opt;
  Buf p(64 * 2), g(64 * 2);

  // An optimizer whose parameter has no gradient.
  flashopt_optimizer noGrad = nullptr;
  REQUIRE(flashopt_optimizer_create(ctx, bundleDir(kSpec).c_str(), &noGrad) ==
          FLASHOPT_OK);
  int64_t idx = -1;
  REQUIRE(flashopt_add_param(noGrad, 0, "w", p.data(), FLASHOPT_BF16, 64,
                             nullptr, FLASHOPT_BF16, &idx) == FLASHOPT_OK);

  // An optimizer with an accumulator and a micro-batch pending.
  const std::string accDir =
      binaryDir() + "/kernels-accumulate/adamw_m24_acc_f32";
  flashopt_optimizer acc = nullptr;
  REQUIRE_MESSAGE(flashopt_optimizer_create(ctx, accDir.c_str(), &acc) ==
                      FLASHOPT_OK,
                  lastError());
  REQUIRE(flashopt_add_param(acc, 0, "w", p.data(), FLASHOPT_BF16, 64, g.data(),
                             FLASHOPT_BF16, &idx) == FLASHOPT_OK);
  REQUIRE_MESSAGE(flashopt_accumulate(acc) == FLASHOPT_OK, lastError());

  // Handles that were destroyed.
  flashopt_context deadCtx = nullptr;
  REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &deadCtx) ==
          FLASHOPT_OK);
  flashopt_optimizer deadOpt = nullptr;
  REQUIRE(flashopt_optimizer_create(deadCtx, bundleDir(kSpec).c_str(),
                                    &deadOpt) == FLASHOPT_OK);
  REQUIRE(flashopt_optimizer_destroy(deadOpt) == FLASHOPT_OK);
  REQUIRE(flashopt_context_destroy(deadCtx) == FLASHOPT_OK);

  // Bundles: missing, without manifest, malformed, not loadable here.
  const fs::path dir = scratch() / "status-codes";
  fs::create_directories(dir);
  const std::string noBundle = (dir / "no-such-bundle").string();
  const std::string noManifest = (dir / "no-manifest").string();
  fs::create_directories(noManifest);
  const std::string badJson = copyOf(kSpec, "bad-json");
  spill(badJson + "/manifest.json", "{\"format\": \"flashopt-manifest\",");
  const std::string badField = copyOf(kSpec, "bad-field");
  {
    auto m = nlohmann::json::parse(slurp(badField + "/manifest.json"));
    m["group_size"] = "thirty-two";
    spill(badField + "/manifest.json", m.dump(2));
  }
  const std::string hugeManifest = copyOf(kSpec, "huge-manifest");
  {
    std::string text = slurp(hugeManifest + "/manifest.json");
    text.append(size_t(flashopt::abi::kMaxManifestBytes) + 1 - text.size(),
                ' ');
    spill(hugeManifest + "/manifest.json", text);
  }
  const std::string fifoManifest = copyOf(kSpec, "fifo-manifest");
  fs::remove(fifoManifest + "/manifest.json");
  REQUIRE(mkfifo((fifoManifest + "/manifest.json").c_str(), 0600) == 0);
  const std::string gpuOnly = copyOf(kSpec, "gpu-only");
  {
    auto m = nlohmann::json::parse(slurp(gpuOnly + "/manifest.json"));
    nlohmann::json k = nlohmann::json::array();
    for (const auto &e : m["kernels"])
      if (e["target"] != "cpu")
        k.push_back(e);
    m["kernels"] = k;
    spill(gpuOnly + "/manifest.json", m.dump(2));
  }
  const std::string noKernelFile = copyOf(kSpec, "no-kernel-file");
  removeFiles(noKernelFile, {".so"});
  const std::string garbledKernel = copyOf(kSpec, "garbled-kernel");
  garble(garbledKernel, ".so");
  // A GPU kernel beyond the 1 GiB a PTX may have (sparse: no disk used).
  const std::string hugePtx = copyOf(kSpec, "huge-ptx");
  removeFiles(hugePtx, {".cubin"});
  fs::resize_file(hugePtx + "/" + kSpec + ".sm_90.ptx",
                  (uint64_t(1) << 30) + 1);

  // Embedded bundles: of another ABI version, leaving their directory.
  const std::string manifestText = slurp(bundleDir(kSpec) + "/manifest.json");
  flashopt_bundle_file files[1] = {
      {"manifest.json", manifestText.data(), manifestText.size()}};
  flashopt_embedded_bundle oldAbi{FLASHOPT_ABI_VERSION + 1, "old", 1, files};
  flashopt_bundle_file escaping[1] = {{"../manifest.json", "{}", 2}};
  flashopt_embedded_bundle escapes{FLASHOPT_ABI_VERSION, "escapes", 1,
                                   escaping};

  // Checkpoints: good, of another spec, truncated, garbage, a directory, a
  // FIFO.
  const std::string good = (dir / "good.safetensors").string();
  REQUIRE(flashopt_save_checkpoint(opt, good.c_str(),
                                   FLASHOPT_CHECKPOINT_COMPRESSED) ==
          FLASHOPT_OK);
  const std::string goodBytes = slurp(good);
  Single other(64, 1.0f, 0.01f, "sgd_bf16");
  const std::string otherSpec = (dir / "other-spec.safetensors").string();
  REQUIRE(flashopt_save_checkpoint(other.opt, otherSpec.c_str(),
                                   FLASHOPT_CHECKPOINT_COMPRESSED) ==
          FLASHOPT_OK);
  const std::string truncated = (dir / "truncated.safetensors").string();
  spill(truncated, goodBytes.substr(0, goodBytes.size() / 2));
  const std::string garbage = (dir / "garbage.safetensors").string();
  spill(garbage, std::string(64, 'x'));
  const std::string aDirectory = (dir / "a-directory").string();
  fs::create_directories(aDirectory);
  const std::string fifo = (dir / "ckpt.fifo").string();
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const std::string noParent = (dir / "no-such-dir" / "x.safetensors").string();

  // Communicators over an in-process world of two ranks.
  FakeWorld okWorld, badWorld, mismatched;
  badWorld.fail = true;
  mismatched.mismatch = true;
  flashopt_comm okComm = nullptr, badComm = nullptr, mismatchComm = nullptr;
  flashopt_comm_backend okB = fakeBackend(&okWorld),
                        badB = fakeBackend(&badWorld),
                        misB = fakeBackend(&mismatched);
  REQUIRE(flashopt_comm_create(&okB, &okComm) == FLASHOPT_OK);
  REQUIRE(flashopt_comm_create(&badB, &badComm) == FLASHOPT_OK);
  REQUIRE(flashopt_comm_create(&misB, &mismatchComm) == FLASHOPT_OK);
  flashopt_comm_backend wrongRank = fakeBackend(&okWorld);
  wrongRank.rank = 2;
  flashopt_comm_backend newerAbi = fakeBackend(&okWorld);
  newerAbi.abi_version = FLASHOPT_ABI_VERSION + 1;
  // Optimizers to attach them to (the same layout as `opt`).
  auto single = [&](const char *spec) {
    flashopt_optimizer o = nullptr;
    REQUIRE(flashopt_optimizer_create(ctx, bundleDir(spec).c_str(), &o) ==
            FLASHOPT_OK);
    int64_t i = -1;
    REQUIRE(flashopt_add_param(o, 0, "w", p.data(), FLASHOPT_BF16, 64, g.data(),
                               FLASHOPT_BF16, &i) == FLASHOPT_OK);
    return o;
  };
  flashopt_optimizer dp = single(kSpec), dpFailing = single(kSpec),
                     dpMismatch = single(kSpec), dpFast = single(kSpec),
                     dpLater = single(kSpec);
  REQUIRE(flashopt_optimizer_attach_comm(
              dp, okComm, FLASHOPT_REDUCE_DETERMINISTIC, 0) == FLASHOPT_OK);
  // Attached while its world works; every collective fails afterwards.
  FakeWorld laterWorld;
  flashopt_comm_backend laterB = fakeBackend(&laterWorld);
  flashopt_comm laterComm = nullptr;
  REQUIRE(flashopt_comm_create(&laterB, &laterComm) == FLASHOPT_OK);
  REQUIRE(flashopt_optimizer_attach_comm(dpLater, laterComm,
                                         FLASHOPT_REDUCE_DETERMINISTIC,
                                         0) == FLASHOPT_OK);
  laterWorld.fail = true;
  // Externally reduced data parallelism (FSDP2's): over the echoing world,
  // and over one whose collectives fail after the attach.
  flashopt_optimizer ext = single(kSpec), extLater = single(kSpec);
  REQUIRE(flashopt_optimizer_attach_comm_external(ext, okComm) == FLASHOPT_OK);
  FakeWorld extWorld;
  flashopt_comm_backend extB = fakeBackend(&extWorld);
  flashopt_comm extComm = nullptr;
  REQUIRE(flashopt_comm_create(&extB, &extComm) == FLASHOPT_OK);
  REQUIRE(flashopt_optimizer_attach_comm_external(extLater, extComm) ==
          FLASHOPT_OK);
  extWorld.fail = true;
  const int64_t someParams[1] = {0};

  // CUDA over the stand-in driver (device memory is host memory).
  flashopt_context gctx = mockCudaContext();
  flashopt_optimizer gopt = nullptr;
  REQUIRE_MESSAGE(flashopt_optimizer_create(gctx, bundleDir(kSpec).c_str(),
                                            &gopt) == FLASHOPT_OK,
                  lastError());
  std::shared_ptr<void> dParam = mockDeviceMemory(1 << 20),
                        dGrad = mockDeviceMemory(1 << 20);
  REQUIRE_MESSAGE(flashopt_add_param(gopt, 0, "w", dParam.get(), FLASHOPT_BF16,
                                     1 << 19, dGrad.get(), FLASHOPT_BF16,
                                     &idx) == FLASHOPT_OK,
                  lastError());

  double v = 0;
  flashopt_optimizer created = nullptr;
  flashopt_context createdCtx = nullptr;
  flashopt_numerics_report report{};
  std::vector<float> tooBig(64, 3.4e38f); // finite, beyond bf16's 3.39e38
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const DLTensor onCuda = [&] {
    static int64_t shape[1] = {64};
    DLTensor t{};
    t.data = p.data();
    t.device = {kDLCUDA, 0};
    t.ndim = 1;
    t.dtype = {kDLBfloat, 16, 1};
    t.shape = shape;
    return t;
  }();

  size_t bytes = 0; // flashopt_buffer_size's out

  // ---- the walk ------------------------------------------------------------
  const std::vector<Row> rows = {
      // Contexts.
      {"flashopt_context_create", "a CPU device other than 0",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] {
         return flashopt_context_create(FLASHOPT_DEVICE_CPU, 1, &createdCtx);
       }},
      {"flashopt_context_create", "an unknown device type",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] {
         return flashopt_context_create(flashopt_device_type(7), 0,
                                        &createdCtx);
       }},
      {"flashopt_context_create", "no CUDA driver", FLASHOPT_ERROR_DEVICE,
       [&] {
         setenv("FLASHOPT_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
         flashopt_status st =
             flashopt_context_create(FLASHOPT_DEVICE_CUDA, 0, &createdCtx);
         setenv("FLASHOPT_CUDA_DRIVER", FLASHOPT_MOCK_CUDA, 1);
         return st;
       }},
      {"flashopt_context_create", "a CUDA device that does not exist",
       FLASHOPT_ERROR_DEVICE,
       [&] {
         return flashopt_context_create(FLASHOPT_DEVICE_CUDA, 1, &createdCtx);
       }},
      {"flashopt_context_set_threads", "too many threads",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_context_set_threads(ctx, 2000); }},
      {"flashopt_context_set_threads", "a CUDA context",
       FLASHOPT_ERROR_UNSUPPORTED,
       [&] { return flashopt_context_set_threads(gctx, 2); }},
      {"flashopt_context_set_threads", "a destroyed context",
       FLASHOPT_ERROR_INVALID_HANDLE,
       [&] { return flashopt_context_set_threads(deadCtx, 2); }},

      // Bundles.
      {"flashopt_optimizer_create", "a NULL directory",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_optimizer_create(ctx, nullptr, &created); }},
      {"flashopt_optimizer_create", "a destroyed context",
       FLASHOPT_ERROR_INVALID_HANDLE,
       [&] {
         return flashopt_optimizer_create(deadCtx, bundleDir(kSpec).c_str(),
                                          &created);
       }},
      {"flashopt_optimizer_create", "a directory that does not exist",
       FLASHOPT_ERROR_NOT_FOUND,
       [&] {
         return flashopt_optimizer_create(ctx, noBundle.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "no manifest.json",
       FLASHOPT_ERROR_NOT_FOUND,
       [&] {
         return flashopt_optimizer_create(ctx, noManifest.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "a manifest that is not JSON",
       FLASHOPT_ERROR_FORMAT,
       [&] {
         return flashopt_optimizer_create(ctx, badJson.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "a manifest field of the wrong type",
       FLASHOPT_ERROR_FORMAT,
       [&] {
         return flashopt_optimizer_create(ctx, badField.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "a manifest above the size limit",
       FLASHOPT_ERROR_FORMAT,
       [&] {
         return flashopt_optimizer_create(ctx, hugeManifest.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "a manifest that is a FIFO",
       FLASHOPT_ERROR_IO,
       [&] {
         return flashopt_optimizer_create(ctx, fifoManifest.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "no CPU kernel in the bundle",
       FLASHOPT_ERROR_UNSUPPORTED,
       [&] {
         return flashopt_optimizer_create(ctx, gpuOnly.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "the CPU kernel file is missing",
       FLASHOPT_ERROR_IO,
       [&] {
         return flashopt_optimizer_create(ctx, noKernelFile.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "the CPU kernel is not a shared object",
       FLASHOPT_ERROR_FORMAT,
       [&] {
         return flashopt_optimizer_create(ctx, garbledKernel.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "a GPU kernel above the size limit",
       FLASHOPT_ERROR_FORMAT,
       [&] {
         return flashopt_optimizer_create(gctx, hugePtx.c_str(), &created);
       }},
      {"flashopt_optimizer_create", "the driver cannot load the GPU kernel",
       FLASHOPT_ERROR_CUDA,
       [&] {
         // The stand-in runs a kernel only from a CPU library it is given.
         unsetenv("FLASHOPT_MOCK_CUDA_KERNELS");
         flashopt_status st = flashopt_optimizer_create(
             gctx, bundleDir(kSpec).c_str(), &created);
         setenv("FLASHOPT_MOCK_CUDA_KERNELS", kernels.c_str(), 1);
         return st;
       }},
      {"flashopt_optimizer_create_embedded", "another ABI version",
       FLASHOPT_ERROR_UNSUPPORTED,
       [&] {
         return flashopt_optimizer_create_embedded(ctx, &oldAbi, &created);
       }},
      {"flashopt_optimizer_create_embedded", "a file leaving the bundle",
       FLASHOPT_ERROR_FORMAT,
       [&] {
         return flashopt_optimizer_create_embedded(ctx, &escapes, &created);
       }},
      {"flashopt_describe_bundle", "a directory that does not exist",
       FLASHOPT_ERROR_NOT_FOUND,
       [&] {
         flashopt_bundle_desc d{};
         return flashopt_describe_bundle(noBundle.c_str(), &d);
       }},
      {"flashopt_describe_bundle", "a manifest that is not JSON",
       FLASHOPT_ERROR_FORMAT,
       [&] {
         flashopt_bundle_desc d{};
         return flashopt_describe_bundle(badJson.c_str(), &d);
       }},

      // Hyper-parameters.
      {"flashopt_set_hyper", "an unknown name", FLASHOPT_ERROR_NOT_FOUND,
       [&] { return flashopt_set_hyper(opt, 0, "nope", 1.0); }},
      {"flashopt_set_hyper", "a NaN", FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_set_hyper(opt, 0, "lr", double(nan)); }},
      {"flashopt_set_hyper", "a param group that does not exist",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_set_hyper(opt, 5, "lr", 1e-3); }},
      {"flashopt_get_hyper", "an unknown name", FLASHOPT_ERROR_NOT_FOUND,
       [&] { return flashopt_get_hyper(opt, 0, "nope", &v); }},

      // Parameters.
      {"flashopt_add_param", "a NULL index pointer",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] {
         return flashopt_add_param(opt, 0, "x", p.data(), FLASHOPT_BF16, 64,
                                   g.data(), FLASHOPT_BF16, nullptr);
       }},
      {"flashopt_add_param", "a parameter of the wrong dtype",
       FLASHOPT_ERROR_DTYPE,
       [&] {
         return flashopt_add_param(opt, 0, "x", p.data(), FLASHOPT_F32, 32,
                                   g.data(), FLASHOPT_BF16, &idx);
       }},
      {"flashopt_add_param", "no elements", FLASHOPT_ERROR_SIZE,
       [&] {
         return flashopt_add_param(opt, 0, "x", p.data(), FLASHOPT_BF16, 0,
                                   g.data(), FLASHOPT_BF16, &idx);
       }},
      {"flashopt_add_param", "a name registered twice",
       FLASHOPT_ERROR_ALREADY_EXISTS,
       [&] {
         Buf q(128);
         return flashopt_add_param(opt, 0, "w", q.data(), FLASHOPT_BF16, 64,
                                   nullptr, FLASHOPT_BF16, &idx);
       }},
      {"flashopt_add_param", "state too large to allocate",
       FLASHOPT_ERROR_OUT_OF_MEMORY,
       [&] {
         // 2^55 elements at an address above "w" (so that they overlap
         // no registered memory): the state allocation fails, the memory is
         // never touched.
         void *high = reinterpret_cast<void *>(
             (uintptr_t(s.param.data()) + (uintptr_t(1) << 32)) &
             ~uintptr_t(0xFFFF));
         return flashopt_add_param(opt, 0, "huge", high, FLASHOPT_BF16,
                                   int64_t(1) << 55, nullptr, FLASHOPT_BF16,
                                   &idx);
       }},

      {"flashopt_add_param_dlpack", "a CUDA tensor on a CPU context",
       FLASHOPT_ERROR_DEVICE,
       [&] {
         return flashopt_add_param_dlpack(opt, 0, "x", &onCuda, nullptr, &idx);
       }},
      {"flashopt_set_grad", "a gradient of the wrong size", FLASHOPT_ERROR_SIZE,
       [&] { return flashopt_set_grad(opt, 0, g.data(), FLASHOPT_BF16, 65); }},
      {"flashopt_set_grad", "a parameter that does not exist",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_set_grad(opt, 9, g.data(), FLASHOPT_BF16, 64); }},
      {"flashopt_find_param", "an unknown name", FLASHOPT_ERROR_NOT_FOUND,
       [&] { return flashopt_find_param(opt, "nope", &idx); }},
      {"flashopt_import_master_f32", "a master beyond the bf16 range",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_import_master_f32(opt, 0, tooBig.data(), 64); }},

      // Buffer sizes.
      {"flashopt_buffer_size", "a destroyed optimizer",
       FLASHOPT_ERROR_INVALID_HANDLE,
       [&] { return flashopt_buffer_size(deadOpt, 0, "exp_avg.codes", &bytes); }},
      {"flashopt_buffer_size", "a NULL buffer name",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_buffer_size(opt, 0, nullptr, &bytes); }},
      {"flashopt_buffer_size", "a NULL out", FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_buffer_size(opt, 0, "exp_avg.codes", nullptr); }},
      {"flashopt_buffer_size", "a parameter that does not exist",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_buffer_size(opt, 99, "exp_avg.codes", &bytes); }},
      {"flashopt_buffer_size", "a buffer the bundle does not have",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_buffer_size(opt, 0, "exp_avg.nope", &bytes); }},

      // Steps, accumulation, policies.
      {"flashopt_step", "a destroyed optimizer", FLASHOPT_ERROR_INVALID_HANDLE,
       [&] { return flashopt_step(deadOpt); }},
      {"flashopt_step", "a parameter without a gradient", FLASHOPT_ERROR_STATE,
       [&] { return flashopt_step(noGrad); }},
      {"flashopt_step_param", "a parameter that does not exist",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_step_param(opt, 99); }},
      {"flashopt_step_param", "micro-batches pending", FLASHOPT_ERROR_STATE,
       [&] { return flashopt_step_param(acc, 0); }},
      {"flashopt_accumulate", "a bundle without an accumulator",
       FLASHOPT_ERROR_UNSUPPORTED, [&] { return flashopt_accumulate(opt); }},
      {"flashopt_set_max_grad_norm", "a negative norm",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_set_max_grad_norm(opt, -1.0); }},
      {"flashopt_step", "device memory too small for the state",
       FLASHOPT_ERROR_OUT_OF_MEMORY,
       [&] {
         // The CUDA optimizer allocates its state at the first step.
         setenv("FLASHOPT_MOCK_CUDA_MEMORY", "1", 1);
         flashopt_status st = flashopt_step(gopt);
         unsetenv("FLASHOPT_MOCK_CUDA_MEMORY");
         return st;
       }},
      {"flashopt_set_nonfinite_policy", "SKIP on a CUDA context",
       FLASHOPT_ERROR_UNSUPPORTED,
       [&] {
         return flashopt_set_nonfinite_policy(gopt, FLASHOPT_NONFINITE_SKIP);
       }},
      {"flashopt_check_numerics", "an lr too small to move the weights",
       FLASHOPT_ERROR_NUMERICS,
       [&] {
         REQUIRE(flashopt_set_hyper(opt, 0, "lr", 1e-9) == FLASHOPT_OK);
         return flashopt_check_numerics(opt, &report);
       }},
      {"flashopt_reduce_bucket", "no communicator attached",
       FLASHOPT_ERROR_STATE, [&] { return flashopt_reduce_bucket(opt, 0); }},

      // Checkpoints.
      {"flashopt_load_checkpoint", "a file that does not exist",
       FLASHOPT_ERROR_NOT_FOUND,
       [&] {
         return flashopt_load_checkpoint(opt, (dir / "none").string().c_str());
       }},
      {"flashopt_load_checkpoint", "a truncated file", FLASHOPT_ERROR_FORMAT,
       [&] { return flashopt_load_checkpoint(opt, truncated.c_str()); }},
      {"flashopt_load_checkpoint", "not a safetensors file",
       FLASHOPT_ERROR_FORMAT,
       [&] { return flashopt_load_checkpoint(opt, garbage.c_str()); }},
      {"flashopt_load_checkpoint", "a checkpoint of another spec",
       FLASHOPT_ERROR_MISMATCH,
       [&] { return flashopt_load_checkpoint(opt, otherSpec.c_str()); }},
      {"flashopt_load_checkpoint", "a directory", FLASHOPT_ERROR_IO,
       [&] { return flashopt_load_checkpoint(opt, aDirectory.c_str()); }},
      {"flashopt_load_checkpoint", "a FIFO", FLASHOPT_ERROR_IO,
       [&] { return flashopt_load_checkpoint(opt, fifo.c_str()); }},
      {"flashopt_load_checkpoint_buffer", "truncated bytes",
       FLASHOPT_ERROR_FORMAT,
       [&] {
         return flashopt_load_checkpoint_buffer(opt, goodBytes.data(),
                                                goodBytes.size() / 2);
       }},
      {"flashopt_save_checkpoint", "an empty path",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] {
         return flashopt_save_checkpoint(opt, "",
                                         FLASHOPT_CHECKPOINT_COMPRESSED);
       }},
      {"flashopt_save_checkpoint", "a directory that does not exist",
       FLASHOPT_ERROR_IO,
       [&] {
         return flashopt_save_checkpoint(opt, noParent.c_str(),
                                         FLASHOPT_CHECKPOINT_COMPRESSED);
       }},
      {"flashopt_save_checkpoint", "a FIFO", FLASHOPT_ERROR_IO,
       [&] {
         return flashopt_save_checkpoint(opt, fifo.c_str(),
                                         FLASHOPT_CHECKPOINT_COMPRESSED);
       }},

      // Communicators and data parallelism.
      {"flashopt_comm_create", "a rank outside the world",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] {
         flashopt_comm c = nullptr;
         return flashopt_comm_create(&wrongRank, &c);
       }},
      {"flashopt_comm_create", "a backend of another ABI version",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] {
         flashopt_comm c = nullptr;
         return flashopt_comm_create(&newerAbi, &c);
       }},
      {"flashopt_optimizer_attach_comm", "a collective fails",
       FLASHOPT_ERROR_COMM,
       [&] {
         return flashopt_optimizer_attach_comm(
             dpFailing, badComm, FLASHOPT_REDUCE_DETERMINISTIC, 0);
       }},
      {"flashopt_optimizer_attach_comm", "the ranks' layouts differ",
       FLASHOPT_ERROR_MISMATCH,
       [&] {
         return flashopt_optimizer_attach_comm(
             dpMismatch, mismatchComm, FLASHOPT_REDUCE_DETERMINISTIC, 0);
       }},
      {"flashopt_optimizer_attach_comm", "FAST without a reduce-scatter",
       FLASHOPT_ERROR_UNSUPPORTED,
       [&] {
         return flashopt_optimizer_attach_comm(dpFast, okComm,
                                               FLASHOPT_REDUCE_FAST, 0);
       }},
      {"flashopt_optimizer_attach_comm", "attached twice", FLASHOPT_ERROR_STATE,
       [&] {
         return flashopt_optimizer_attach_comm(
             dp, okComm, FLASHOPT_REDUCE_DETERMINISTIC, 0);
       }},
      {"flashopt_optimizer_attach_comm", "an unknown reduce mode",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] {
         return flashopt_optimizer_attach_comm(dpFast, okComm,
                                               flashopt_reduce_mode(9), 0);
       }},
      {"flashopt_reduce_bucket", "a bucket that does not exist",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_reduce_bucket(dp, 99); }},
      {"flashopt_reduce_bucket", "a collective fails", FLASHOPT_ERROR_COMM,
       [&] { return flashopt_reduce_bucket(dpLater, 0); }},
      {"flashopt_step", "a collective fails", FLASHOPT_ERROR_COMM,
       [&] { return flashopt_step(dpLater); }},
      {"flashopt_optimizer_attach_comm_external", "a communicator attached",
       FLASHOPT_ERROR_STATE,
       [&] { return flashopt_optimizer_attach_comm_external(dp, okComm); }},
      {"flashopt_step_external", "no externally reduced mode attached",
       FLASHOPT_ERROR_STATE,
       [&] {
         return flashopt_step_external(opt, nullptr, 0, someParams, 1, 0,
                                       FLASHOPT_OK, nullptr, nullptr);
       }},
      {"flashopt_step_external", "a negative count",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] {
         return flashopt_step_external(ext, someParams, -1, someParams, 1, 0,
                                       FLASHOPT_OK, nullptr, nullptr);
       }},
      {"flashopt_step_external", "a rank that cannot step (its own status)",
       FLASHOPT_ERROR_DTYPE,
       [&] {
         return flashopt_step_external(ext, nullptr, 0, someParams, 1, 0,
                                       FLASHOPT_ERROR_DTYPE,
                                       "the gradient is f16", nullptr);
       }},
      {"flashopt_step_external", "a collective fails", FLASHOPT_ERROR_COMM,
       [&] {
         return flashopt_step_external(extLater, nullptr, 0, someParams, 1, 0,
                                       FLASHOPT_OK, nullptr, nullptr);
       }},
      {"flashopt_step", "externally reduced data parallelism attached",
       FLASHOPT_ERROR_STATE, [&] { return flashopt_step(ext); }},
      {"flashopt_set_external_step", "a negative step",
       FLASHOPT_ERROR_INVALID_ARGUMENT,
       [&] { return flashopt_set_external_step(ext, 0, -1); }},
  };

  std::set<int> seen;
  for (const Row &r : rows) {
    const std::string fn = r.fn, what = r.what;
    CAPTURE(fn);
    CAPTURE(what);
    created = nullptr;
    createdCtx = nullptr;
    flashopt_status got = r.call();
    const std::string msg = lastError();
    const std::string why = std::string(flashopt_status_name(got)) +
                            " instead of " + flashopt_status_name(r.want) +
                            ": " + msg;
    CHECK_MESSAGE(got == r.want, why);
    // The message names the entry point, then says why.
    CHECK(msg.rfind(std::string(r.fn) + ": ", 0) == 0);
    CHECK(msg.size() > std::strlen(r.fn) + 2);
    // A failed create hands out nothing.
    CHECK(created == nullptr);
    CHECK(createdCtx == nullptr);
    seen.insert(int(got));
  }
  // Every status but INTERNAL (a bug) was produced.
  for (int st = FLASHOPT_ERROR_INVALID_ARGUMENT; st <= FLASHOPT_ERROR_COMM;
       ++st) {
    const std::string name = flashopt_status_name(flashopt_status(st));
    CAPTURE(name);
    CHECK(seen.count(st) == (st == FLASHOPT_ERROR_INTERNAL ? 0u : 1u));
  }

  for (flashopt_optimizer o :
       {noGrad, acc, dp, dpFailing, dpMismatch, dpFast, dpLater, ext, extLater,
        gopt})
    CHECK(flashopt_optimizer_destroy(o) == FLASHOPT_OK);
  for (flashopt_comm c : {okComm, badComm, mismatchComm, laterComm, extComm})
    CHECK(flashopt_comm_destroy(c) == FLASHOPT_OK);
  CHECK(flashopt_context_destroy(gctx) == FLASHOPT_OK);
  unsetenv("FLASHOPT_CUDA_DRIVER");
  unsetenv("FLASHOPT_MOCK_CUDA_CC");
  unsetenv("FLASHOPT_MOCK_CUDA_KERNELS");
}
