//===- CApiErrorsTest.cpp - One test per C ABI error
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Every error of the C ABI: dtypes, devices, sizes, use after destroy,
/// registration and names, checkpoints.
///
//===----------------------------------------------------------------------===//

#include "CApiTestSupport.h"

using namespace capitest;

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

TEST_CASE("errors: dtype, device, size") {
  Single s(64);
  Buf p(128 * 4), g(128 * 4);
  int64_t idx = -1;
  // Wrong param dtype.
  CHECK(flashopt_add_param(s.opt, 0, "f32w", p.data(), FLASHOPT_F32, 64,
                           g.data(), FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "flashopt_add_param"));
  CHECK(contains(lastError(), "'f32w'"));
  CHECK(contains(lastError(), "f32"));
  CHECK(contains(lastError(), "bf16"));
  // Wrong grad dtype.
  CHECK(flashopt_add_param(s.opt, 0, "g16", p.data(), FLASHOPT_BF16, 64,
                           g.data(), FLASHOPT_F16,
                           &idx) == FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "'g16'"));
  CHECK(contains(lastError(), "grad dtype is f16"));
  CHECK(flashopt_set_grad(s.opt, 0, g.data(), FLASHOPT_F32, 64) ==
        FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "'w'"));
  // Wrong size.
  CHECK(flashopt_set_grad(s.opt, 0, g.data(), FLASHOPT_BF16, 65) ==
        FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "flashopt_set_grad"));
  CHECK(contains(lastError(), "65"));
  CHECK(contains(lastError(), "'w'"));
  std::vector<float> w(10);
  CHECK(flashopt_export_master_f32(s.opt, 0, w.data(), 10) ==
        FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "'w'"));
  CHECK(flashopt_add_param(s.opt, 0, "empty", p.data(), FLASHOPT_BF16, 0,
                           nullptr, FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "'empty'"));

  // DLPack: a kDLCUDA tensor on a CPU context.
  int64_t shape[2] = {4, 16};
  DLTensor t{};
  t.data = p.data();
  t.device = {kDLCUDA, 0};
  t.ndim = 2;
  t.dtype = {kDLBfloat, 16, 1};
  t.shape = shape;
  CHECK(flashopt_add_param_dlpack(s.opt, 0, "cuda_w", &t, nullptr, &idx) ==
        FLASHOPT_ERROR_DEVICE);
  CHECK(contains(lastError(), "'cuda_w'"));
  CHECK(contains(lastError(), "kDLCUDA"));
  CHECK(contains(lastError(), "CPU context"));
  // DLPack: a wrong dtype, lanes, strides.
  t.device = {kDLCPU, 0};
  t.dtype = {kDLFloat, 64, 1};
  CHECK(flashopt_add_param_dlpack(s.opt, 0, "f64", &t, nullptr, &idx) ==
        FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "'f64'"));
  t.dtype = {kDLBfloat, 16, 2};
  CHECK(flashopt_add_param_dlpack(s.opt, 0, "lanes", &t, nullptr, &idx) ==
        FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "lanes"));
  t.dtype = {kDLBfloat, 16, 1};
  int64_t strides[2] = {1, 4}; // column-major
  t.strides = strides;
  CHECK(flashopt_add_param_dlpack(s.opt, 0, "colmajor", &t, nullptr, &idx) ==
        FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "row-major"));
  // A good one: compact strides, byte_offset honoured, shape kept.
  int64_t good[2] = {16, 1};
  t.strides = good;
  t.data = p.data() - 64;
  t.byte_offset = 64;
  DLTensor gt = t;
  gt.data = g.data();
  gt.byte_offset = 0;
  REQUIRE_MESSAGE(flashopt_add_param_dlpack(s.opt, 1 - 1, "dl", &t, &gt,
                                            &idx) == FLASHOPT_OK,
                  lastError());
  flashopt_param_info pi{};
  REQUIRE(flashopt_get_param_info(s.opt, idx, &pi) == FLASHOPT_OK);
  CHECK(pi.ndim == 2);
  CHECK(pi.shape[0] == 4);
  CHECK(pi.shape[1] == 16);
  CHECK(pi.numel == 64);
  CHECK(std::string(pi.name) == "dl");
  // set_grad_dlpack with the wrong size.
  int64_t small[1] = {10};
  DLTensor st{};
  st.data = g.data();
  st.device = {kDLCPU, 0};
  st.ndim = 1;
  st.dtype = {kDLBfloat, 16, 1};
  st.shape = small;
  CHECK(flashopt_set_grad_dlpack(s.opt, idx, &st) == FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "'dl'"));
}

TEST_CASE("errors: use after destroy") {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) == FLASHOPT_OK);
  REQUIRE(flashopt_optimizer_create(ctx, bundleDir(kSpec).c_str(), &opt) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_optimizer_destroy(opt) == FLASHOPT_OK);
  CHECK(flashopt_step(opt) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(contains(lastError(), "flashopt_step"));
  CHECK(contains(lastError(), "not a live optimizer"));
  int64_t n = 0;
  CHECK(flashopt_num_params(opt, &n) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(flashopt_optimizer_destroy(opt) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(contains(lastError(), "flashopt_optimizer_destroy"));
  // An optimizer handle is not a context handle and vice versa.
  CHECK(flashopt_context_set_threads(reinterpret_cast<flashopt_context>(opt),
                                     1) == FLASHOPT_ERROR_INVALID_HANDLE);
  // An optimizer keeps working after its context handle is destroyed.
  REQUIRE(flashopt_optimizer_create(ctx, bundleDir(kSpec).c_str(), &opt) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_context_destroy(ctx) == FLASHOPT_OK);
  CHECK(flashopt_num_params(opt, &n) == FLASHOPT_OK);
  CHECK(flashopt_context_destroy(ctx) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(contains(lastError(), "flashopt_context_destroy"));
  CHECK(contains(lastError(), "not a live context"));
  flashopt_optimizer other = nullptr;
  CHECK(flashopt_optimizer_create(ctx, bundleDir(kSpec).c_str(), &other) ==
        FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(contains(lastError(), "flashopt_optimizer_create"));
  CHECK(flashopt_optimizer_destroy(opt) == FLASHOPT_OK);
  // Handles are never reused.
  flashopt_optimizer again = nullptr;
  flashopt_context ctx2 = nullptr;
  REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx2) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_optimizer_create(ctx2, bundleDir(kSpec).c_str(), &again) ==
          FLASHOPT_OK);
  CHECK(again != opt);
  CHECK(reinterpret_cast<void *>(ctx2) != reinterpret_cast<void *>(ctx));
  CHECK(flashopt_step(opt) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(flashopt_optimizer_destroy(again) == FLASHOPT_OK);
  CHECK(flashopt_context_destroy(ctx2) == FLASHOPT_OK);
  // A handle never created, and NULL.
  CHECK(flashopt_step(reinterpret_cast<flashopt_optimizer>(
            uintptr_t(0xdead))) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(flashopt_step(nullptr) == FLASHOPT_ERROR_INVALID_HANDLE);
  // A success clears the last error.
  CHECK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) == FLASHOPT_OK);
  CHECK(lastError().empty());
  CHECK(flashopt_context_destroy(ctx) == FLASHOPT_OK);
}

TEST_CASE("errors: double registration, unknown names, missing gradient") {
  Single s(64);
  Buf p(256), g(256);
  int64_t idx = -1;
  // The same param memory under another name.
  CHECK(flashopt_add_param(s.opt, 0, "again", s.param.data(), FLASHOPT_BF16, 64,
                           g.data(), FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
  CHECK(contains(lastError(), "'again'"));
  CHECK(contains(lastError(), "'w'"));
  // Overlapping memory.
  CHECK(flashopt_add_param(s.opt, 0, "overlap", s.param.data() + 32,
                           FLASHOPT_BF16, 64, g.data(), FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
  CHECK(contains(lastError(), "overlaps"));
  // The same name.
  CHECK(flashopt_add_param(s.opt, 0, "w", p.data(), FLASHOPT_BF16, 64, g.data(),
                           FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
  CHECK(contains(lastError(), "'w'"));
  CHECK(contains(lastError(), "already registered"));
  // A name that clashes with a checkpoint tensor of another parameter.
  CHECK(flashopt_add_param(s.opt, 0, "w.correction", p.data(), FLASHOPT_BF16,
                           64, g.data(), FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
  CHECK(contains(lastError(), "'w.correction'"));
  // Unknown hyper-parameter.
  CHECK(flashopt_set_hyper(s.opt, 0, "momentum", 0.9) ==
        FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "flashopt_set_hyper"));
  CHECK(contains(lastError(), "'momentum'"));
  CHECK(contains(lastError(), "adamw_bf16_m24"));
  double v = 0;
  CHECK(flashopt_get_hyper(s.opt, 0, "nope", &v) == FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "'nope'"));
  CHECK(flashopt_set_hyper(s.opt, 0, "lr", NAN) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "'lr'"));
  CHECK(flashopt_set_hyper(s.opt, 5, "lr", 1e-3) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "param group 5"));
  // Unknown parameter and index.
  CHECK(flashopt_find_param(s.opt, "nope", &idx) == FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "'nope'"));
  CHECK(flashopt_step_param(s.opt, 7) == FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "index 7"));
  // A parameter without gradient: STATE, nothing changed.
  REQUIRE(flashopt_add_param(s.opt, 0, "nograd", p.data(), FLASHOPT_BF16, 64,
                             nullptr, FLASHOPT_BF16, &idx) == FLASHOPT_OK);
  Buf before = s.param.clone();
  CHECK(flashopt_step(s.opt) == FLASHOPT_ERROR_STATE);
  CHECK(contains(lastError(), "'nograd'"));
  CHECK(contains(lastError(), "no gradient"));
  CHECK(s.param == before);
  int64_t t = -1;
  REQUIRE(flashopt_get_step(s.opt, 0, &t) == FLASHOPT_OK);
  CHECK(t == 0);
  REQUIRE(flashopt_set_grad(s.opt, idx, g.data(), FLASHOPT_BF16, 64) ==
          FLASHOPT_OK);
  CHECK(flashopt_step(s.opt) == FLASHOPT_OK);
  // Unknown bundle directory.
  flashopt_optimizer o2 = nullptr;
  CHECK(flashopt_optimizer_create(s.ctx, "/nonexistent/bundle", &o2) ==
        FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "/nonexistent/bundle"));
}

TEST_CASE("errors: checkpoints") {
  Single s(100);
  REQUIRE(flashopt_step(s.opt) == FLASHOPT_OK);
  std::string good = savePath("err-good");
  saveOk(s.opt, good);
  Buf before = s.param.clone();

  // Unknown file.
  std::string missing = (scratch() / "missing.safetensors").string();
  CHECK(flashopt_load_checkpoint(s.opt, missing.c_str()) ==
        FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "missing.safetensors"));
  CHECK(contains(lastError(), "flashopt_load_checkpoint"));

  // Truncated and corrupted files.
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  std::string truncated = savePath("err-truncated");
  std::ofstream(truncated, std::ios::binary)
      << bytes.substr(0, bytes.size() - 10);
  CHECK(flashopt_load_checkpoint(s.opt, truncated.c_str()) ==
        FLASHOPT_ERROR_FORMAT);
  CHECK(contains(lastError(), "err-truncated"));
  std::string corrupt = savePath("err-corrupt");
  std::string c = bytes;
  c[12] = '#'; // inside the JSON header
  std::ofstream(corrupt, std::ios::binary) << c;
  CHECK(flashopt_load_checkpoint(s.opt, corrupt.c_str()) ==
        FLASHOPT_ERROR_FORMAT);
  CHECK(contains(lastError(), "err-corrupt"));
  std::string shortFile = savePath("err-short");
  std::ofstream(shortFile, std::ios::binary) << "abc";
  CHECK(flashopt_load_checkpoint(s.opt, shortFile.c_str()) ==
        FLASHOPT_ERROR_FORMAT);
  CHECK(contains(lastError(), "err-short"));
  CHECK(s.param == before);

  // A checkpoint of another spec.
  {
    flashopt_optimizer other = nullptr;
    REQUIRE(flashopt_optimizer_create(s.ctx,
                                      bundleDir("adamw_bf16_m32").c_str(),
                                      &other) == FLASHOPT_OK);
    Buf p(200), g(200), corr(400);
    int64_t idx = -1;
    REQUIRE(flashopt_add_param(other, 0, "w", p.data(), FLASHOPT_BF16, 100,
                               g.data(), FLASHOPT_BF16, &idx) == FLASHOPT_OK);
    std::string path = savePath("err-otherspec");
    saveOk(other, path);
    CHECK(flashopt_load_checkpoint(s.opt, path.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "adamw_bf16_m32"));
    CHECK(contains(lastError(), "adamw_bf16_m24"));
    flashopt_optimizer_destroy(other);
  }
  // A checkpoint of the same rule in the other numerics (docs/NUMERICS.md
  // §8): refused by name before anything else, nothing loaded.
  {
    flashopt_optimizer other = nullptr;
    REQUIRE(flashopt_optimizer_create(
                s.ctx, bundleDir(std::string(kSpec) + "_flashoptim").c_str(),
                &other) == FLASHOPT_OK);
    Buf p(200), g(200);
    int64_t idx = -1;
    REQUIRE(flashopt_add_param(other, 0, "w", p.data(), FLASHOPT_BF16, 100,
                               g.data(), FLASHOPT_BF16, &idx) == FLASHOPT_OK);
    std::string path = savePath("err-othernumerics");
    saveOk(other, path);
    CHECK(flashopt_load_checkpoint(s.opt, path.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "written with the 'flashoptim' numerics"));
    CHECK(contains(lastError(), "runs the 'bounded' numerics"));
    CHECK(contains(lastError(), "nothing was loaded"));
    // And the other way round.
    CHECK(flashopt_load_checkpoint(other, good.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "written with the 'bounded' numerics"));
    CHECK(p == Buf(200));
    flashopt_optimizer_destroy(other);
  }
  // A checkpoint with another shape (same numel) and another size.
  {
    flashopt_optimizer other = nullptr;
    REQUIRE(flashopt_optimizer_create(s.ctx, bundleDir(kSpec).c_str(),
                                      &other) == FLASHOPT_OK);
    Buf p(256), g(256);
    int64_t shape[2] = {10, 10};
    DLTensor t{};
    t.data = p.data();
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = {kDLBfloat, 16, 1};
    t.shape = shape;
    int64_t idx = -1;
    REQUIRE(flashopt_add_param_dlpack(other, 0, "w", &t, nullptr, &idx) ==
            FLASHOPT_OK);
    std::string path = savePath("err-shape");
    saveOk(other, path);
    CHECK(flashopt_load_checkpoint(s.opt, path.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "[10, 10]"));
    CHECK(contains(lastError(), "[100]"));
    CHECK(contains(lastError(), "'w'"));
    flashopt_optimizer_destroy(other);
  }
  {
    flashopt_optimizer other = nullptr;
    REQUIRE(flashopt_optimizer_create(s.ctx, bundleDir(kSpec).c_str(),
                                      &other) == FLASHOPT_OK);
    Buf p(256), g(256);
    int64_t idx = -1;
    REQUIRE(flashopt_add_param(other, 0, "v", p.data(), FLASHOPT_BF16, 100,
                               g.data(), FLASHOPT_BF16, &idx) == FLASHOPT_OK);
    std::string path = savePath("err-names");
    saveOk(other, path);
    CHECK(flashopt_load_checkpoint(s.opt, path.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "'v'"));
    flashopt_optimizer_destroy(other);
  }
  CHECK(s.param == before);
  // The good one still loads; saving is atomic (a failed save keeps it).
  CHECK(flashopt_load_checkpoint(s.opt, good.c_str()) == FLASHOPT_OK);
  std::string dirPath = (scratch() / "no-such-dir" / "x.safetensors").string();
  CHECK(flashopt_save_checkpoint(s.opt, dirPath.c_str(),
                                 FLASHOPT_CHECKPOINT_COMPRESSED) ==
        FLASHOPT_ERROR_IO);
  CHECK(contains(lastError(), "no-such-dir"));
}
