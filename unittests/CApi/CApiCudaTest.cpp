//===- CApiCudaTest.cpp - The CUDA branch of the C ABI
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// CUDA contexts: without a driver, on a GPU (skipped without one), and over
/// the stand-in driver of unittests/Runtime (step == CPU step).
///
//===----------------------------------------------------------------------===//

#include "CApiTestSupport.h"

using namespace capitest;

//===----------------------------------------------------------------------===//
// CUDA contexts
//===----------------------------------------------------------------------===//

TEST_CASE("CUDA context without a driver") {
  setenv("FLASHOPT_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  flashopt_context ctx = nullptr;
  CHECK(flashopt_context_create(FLASHOPT_DEVICE_CUDA, 0, &ctx) ==
        FLASHOPT_ERROR_DEVICE);
  CHECK(contains(lastError(), "flashopt_context_create"));
  CHECK(contains(lastError(), "CUDA device 0"));
  CHECK(contains(lastError(), "NVIDIA driver"));
  unsetenv("FLASHOPT_CUDA_DRIVER");
  CHECK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 1, &ctx) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "device_id"));
}

namespace {
/// The C ABI on CUDA device 0 (the driver CudaDriver::get() loads) against
/// the CPU, for each of `modes`: 0 steps with flashopt_step, 1 with
/// step_param over every parameter, 2 with one step_param ahead on
/// parameter 2 (counters that differ: partial launches).
void gpuVsCpu(const std::vector<int> &modes) {
  Expected<std::shared_ptr<CudaContext>> cc = CudaContext::create(0);
  REQUIRE_MESSAGE(cc.ok(), cc.error());
  std::shared_ptr<CudaContext> dev = *cc;
  Manifest m = *load_manifest(bundleDir(kSpec) + "/manifest.json");
  Model base(m, 31);

  for (int mode : modes) {
    CAPTURE(mode);
    Model mc = base.clone();
    AbiOpt cpu(kSpec, mc);
    std::vector<DeviceBuffer> dparams, dgrads;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      auto p = DeviceBuffer::allocate(dev, int64_t(base.params[i].bytes));
      auto g = DeviceBuffer::allocate(dev, int64_t(base.grads[i].bytes));
      REQUIRE(p.ok());
      REQUIRE(g.ok());
      REQUIRE(p->upload(base.params[i].data(), p->bytes()).ok());
      dparams.push_back(std::move(p.value()));
      dgrads.push_back(std::move(g.value()));
    }
    flashopt_context gctx = nullptr;
    flashopt_optimizer gopt = nullptr;
    REQUIRE_MESSAGE(flashopt_context_create(FLASHOPT_DEVICE_CUDA, 0, &gctx) ==
                        FLASHOPT_OK,
                    lastError());
    REQUIRE_MESSAGE(flashopt_optimizer_create(gctx, bundleDir(kSpec).c_str(),
                                              &gopt) == FLASHOPT_OK,
                    lastError());
    int32_t grp = -1;
    REQUIRE(flashopt_add_param_group(gopt, &grp) == FLASHOPT_OK);
    for (int g = 0; g < 2; ++g)
      for (auto &kv : groupHypers(m, g))
        REQUIRE(flashopt_set_hyper(gopt, g, kv.first.c_str(), kv.second) ==
                FLASHOPT_OK);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      int64_t idx = -1;
      std::string name = "layer" + std::to_string(i) + ".w";
      REQUIRE_MESSAGE(flashopt_add_param(
                          gopt, int32_t(i % 2), name.c_str(),
                          reinterpret_cast<void *>(uintptr_t(dparams[i].ptr())),
                          FLASHOPT_BF16, kSizes[i],
                          reinterpret_cast<void *>(uintptr_t(dgrads[i].ptr())),
                          FLASHOPT_BF16, &idx) == FLASHOPT_OK,
                      lastError());
    }
    auto uploadGrads = [&] {
      REQUIRE(flashopt_synchronize(gopt) == FLASHOPT_OK);
      for (size_t i = 0; i < kSizes.size(); ++i)
        REQUIRE(dgrads[i].upload(mc.grads[i].data(), dgrads[i].bytes()).ok());
    };
    for (int s = 1; s <= 3; ++s) {
      mc.fillGrads(s);
      uploadGrads();
      if (mode == 2 && s == 1) {
        REQUIRE(flashopt_step_param(gopt, 2) == FLASHOPT_OK);
        REQUIRE(flashopt_step_param(cpu.opt, 2) == FLASHOPT_OK);
        continue;
      }
      if (mode == 1) {
        for (int64_t i = int64_t(kSizes.size()) - 1; i >= 0; --i) {
          REQUIRE_MESSAGE(flashopt_step_param(gopt, i) == FLASHOPT_OK,
                          lastError());
          REQUIRE(flashopt_step_param(cpu.opt, i) == FLASHOPT_OK);
        }
      } else {
        REQUIRE_MESSAGE(flashopt_step(gopt) == FLASHOPT_OK, lastError());
        stepOk(cpu.opt);
      }
    }
    REQUIRE(flashopt_synchronize(gopt) == FLASHOPT_OK);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      Buf got(base.params[i].bytes);
      REQUIRE(dparams[i].download(got.data(), int64_t(got.bytes)).ok());
      CHECK_MESSAGE(got == mc.params[i], "param " << i);
    }
    std::string pg = savePath("gpu-g"), pc = savePath("gpu-c");
    saveOk(gopt, pg);
    saveOk(cpu.opt, pc);
    checkSameCheckpoint(pg, pc);
    REQUIRE(flashopt_optimizer_destroy(gopt) == FLASHOPT_OK);
    REQUIRE(flashopt_context_destroy(gctx) == FLASHOPT_OK);
  }
}
} // namespace

TEST_CASE("GPU: C ABI step, step_param and mixed counters match the CPU "
          "(GPU only)") {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    MESSAGE("skipped: needs the NVIDIA driver");
    return;
  }
  dlclose(lib);
  unsetenv("FLASHOPT_CUDA_DRIVER");
  gpuVsCpu({0, 1, 2});
}

#ifdef FLASHOPT_MOCK_CUDA
namespace {
/// A copy of `host` in the stand-in driver's "device" memory (host memory
/// it tracks; freed through it when the buffer goes).
Buf mockDeviceCopy(const Buf &host) {
  static void *lib = dlopen(FLASHOPT_MOCK_CUDA, RTLD_NOW);
  REQUIRE(lib);
  using Alloc = int (*)(unsigned long long *, size_t);
  auto alloc = reinterpret_cast<Alloc>(dlsym(lib, "cuMemAlloc_v2"));
  bool found = alloc != nullptr;
  REQUIRE(found);
  unsigned long long p = 0;
  REQUIRE(alloc(&p, host.bytes) == 0);
  REQUIRE(p % 16 == 0);
  Buf b;
  b.bytes = host.bytes;
  using Free = int (*)(unsigned long long);
  static Free release = reinterpret_cast<Free>(dlsym(lib, "cuMemFree_v2"));
  bool haveFree = release != nullptr;
  REQUIRE(haveFree);
  b.mem.reset(reinterpret_cast<uint8_t *>(uintptr_t(p)), [](uint8_t *q) {
    release(static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(q)));
  });
  std::memcpy(b.data(), host.data(), host.bytes);
  return b;
}
} // namespace

TEST_CASE("CUDA context over a stand-in driver: step == CPU step") {
  flashopt_context gctx = mockCudaContext();
  flashopt_optimizer gopt = nullptr;
  REQUIRE_MESSAGE(flashopt_optimizer_create(gctx, bundleDir(kSpec).c_str(),
                                            &gopt) == FLASHOPT_OK,
                  lastError());
  flashopt_optimizer_info info{};
  REQUIRE(flashopt_optimizer_get_info(gopt, &info) == FLASHOPT_OK);
  CHECK(info.device_type == FLASHOPT_DEVICE_CUDA);
  Model base(*load_manifest(bundleDir(kSpec) + "/manifest.json"), 21);
  Model mg = base.clone(), mc = base.clone();
  for (Buf &b : mg.params)
    b = mockDeviceCopy(b);
  for (Buf &b : mg.grads)
    b = mockDeviceCopy(b);
  AbiOpt cpu(kSpec, mc);
  int32_t grp = -1;
  REQUIRE(flashopt_add_param_group(gopt, &grp) == FLASHOPT_OK);
  for (int g = 0; g < 2; ++g)
    for (auto &kv :
         groupHypers(*load_manifest(bundleDir(kSpec) + "/manifest.json"), g))
      REQUIRE(flashopt_set_hyper(gopt, g, kv.first.c_str(), kv.second) ==
              FLASHOPT_OK);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    // "Device" memory of the stand-in is host memory: DLPack kDLCUDA.
    DLTensor p{}, gr{};
    p.data = mg.params[i].data();
    p.device = {kDLCUDA, 0};
    p.ndim = 1;
    p.dtype = {kDLBfloat, 16, 1};
    int64_t n = kSizes[i];
    p.shape = &n;
    gr = p;
    gr.data = mg.grads[i].data();
    int64_t idx = -1;
    std::string name = "layer" + std::to_string(i) + ".w";
    REQUIRE_MESSAGE(flashopt_add_param_dlpack(gopt, int32_t(i % 2),
                                              name.c_str(), &p, &gr,
                                              &idx) == FLASHOPT_OK,
                    lastError());
  }
  // A CPU tensor on a CUDA context is a device error.
  DLTensor hostT{};
  int64_t n1 = 1;
  hostT.data = mg.params[0].data();
  hostT.device = {kDLCPU, 0};
  hostT.ndim = 1;
  hostT.dtype = {kDLBfloat, 16, 1};
  hostT.shape = &n1;
  int64_t idx = -1;
  CHECK(flashopt_add_param_dlpack(gopt, 0, "host", &hostT, nullptr, &idx) ==
        FLASHOPT_ERROR_DEVICE);
  CHECK(contains(lastError(), "CUDA context"));
  CHECK(flashopt_set_nonfinite_policy(gopt, FLASHOPT_NONFINITE_SKIP) ==
        FLASHOPT_ERROR_UNSUPPORTED);
  for (int s = 1; s <= 3; ++s) {
    mg.fillGrads(s);
    mc.fillGrads(s);
    REQUIRE_MESSAGE(flashopt_step(gopt) == FLASHOPT_OK, lastError());
    stepOk(cpu.opt);
  }
  REQUIRE(flashopt_synchronize(gopt) == FLASHOPT_OK);
  for (size_t i = 0; i < kSizes.size(); ++i)
    CHECK_MESSAGE(mg.params[i] == mc.params[i], "param " << i);
  std::string pg = savePath("cuda-g"), pc = savePath("cuda-c");
  saveOk(gopt, pg);
  saveOk(cpu.opt, pc);
  checkSameCheckpoint(pg, pc);
  // Master export and checkpoint load on the device path.
  std::vector<float> wg(static_cast<size_t>(kSizes[2])), wc(wg.size());
  REQUIRE(flashopt_export_master_f32(gopt, 2, wg.data(), kSizes[2]) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_export_master_f32(cpu.opt, 2, wc.data(), kSizes[2]) ==
          FLASHOPT_OK);
  CHECK(std::memcmp(wg.data(), wc.data(), wg.size() * 4) == 0);
  REQUIRE_MESSAGE(flashopt_load_checkpoint(gopt, pc.c_str()) == FLASHOPT_OK,
                  lastError());
  flashopt_memory_report r{};
  REQUIRE(flashopt_memory_report_get(gopt, &r) == FLASHOPT_OK);
  CHECK(r.numel == 1 + 33 + 4097 + 300 + 64);
  CHECK(flashopt_optimizer_destroy(gopt) == FLASHOPT_OK);
  CHECK(flashopt_context_destroy(gctx) == FLASHOPT_OK);
  // The GPU-only test's plumbing, with full-table launches (the stand-in
  // checks that a launch covers the whole table, so no step_param here).
  gpuVsCpu({0});
  unsetenv("FLASHOPT_CUDA_DRIVER");
}
#endif
