//===- CudaTest.cpp - CUDA runtime tests
//-------------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Tests of the CUDA side of the runtime that need no GPU: kernel selection
/// from a manifest for a compute capability, launch geometry, splitting of
/// tensors too large for one table record, the hyper table's change
/// tracking, and the driver loader's error when libcuda.so.1 is absent. On
/// a machine with the NVIDIA driver the loader test checks that a device is
/// found instead, and one step of a shipped bundle (when FLASHOPT_KERNELS_DIR
/// or FLASHOPT_BINARY_DIR/kernels holds one) is compared with the CPU.
///
//===----------------------------------------------------------------------===//

#include "flashopt/abi/Manifest.h"
#include "flashopt/host/CudaOptimizer.h"
#include "flashopt/host/CpuOptimizer.h"

#ifdef FLASHOPT_TEST_HAVE_CUDA_H
// After our header, so cuda.h's renaming macros do not touch its classes.
#include <cuda.h>
#endif

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

using namespace flashopt::host;

namespace {

KernelEntry gpuEntry(const std::string &target, bool cubin = true,
                     int threads = 256, int ept = 4) {
  KernelEntry k;
  k.target = target;
  k.file = "k." + target + ".ptx";
  if (cubin)
    k.cubin = "k." + target + ".cubin";
  k.symbol = "k";
  k.threads_per_block = threads;
  k.elements_per_thread = ept;
  return k;
}

/// A manifest with a CPU kernel and sm_80/sm_90/sm_100 kernels (PTX and
/// cubin each), as flashopt-gen writes them.
Manifest gpuManifest() {
  Manifest m;
  m.path = "/bundles/k/manifest.json";
  m.name = "k";
  KernelEntry cpu;
  cpu.target = "cpu";
  cpu.cpu = "x86-64";
  cpu.file = "k.x86-64.so";
  cpu.symbol = "k";
  m.kernels = {cpu, gpuEntry("sm_80"), gpuEntry("sm_90"), gpuEntry("sm_100")};
  return m;
}

bool contains(const std::string &s, const std::string &needle) {
  return s.find(needle) != std::string::npos;
}

/// An AdamW-shaped manifest (G = 32, i8 correction, i8/ui8 codes, f16
/// scales), built directly: table records need only buffers and G.
Manifest adamwShape() {
  Manifest m;
  m.name = "adamw_shape";
  m.group_size = 32;
  m.buffers = {
      {"param", DType::BF16, Per::Element, true, BufferRole::Param},
      {"correction", DType::I8, Per::Element, true, BufferRole::Correction},
      {"grad", DType::BF16, Per::Element, false, BufferRole::Grad},
      {"exp_avg.codes", DType::I8, Per::Element, true, BufferRole::State},
      {"exp_avg.scales", DType::F16, Per::Group, true, BufferRole::State},
      {"exp_avg_sq.codes", DType::U8, Per::Element, true, BufferRole::State},
      {"exp_avg_sq.scales", DType::F16, Per::Group, true, BufferRole::State}};
  m.record_words = 4 + int64_t(m.buffers.size());
  return m;
}

/// Whether the NVIDIA driver library can be loaded on this machine.
bool driverLoadable() {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    dlerror();
    return false;
  }
  dlclose(h);
  return true;
}

std::string kernelsDir() {
  if (const char *k = std::getenv("FLASHOPT_KERNELS_DIR"))
    return k;
  if (const char *b = std::getenv("FLASHOPT_BINARY_DIR"))
    return std::string(b) + "/kernels";
  return "";
}

bool isFile(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

} // namespace

//===----------------------------------------------------------------------===//
// Kernel selection
//===----------------------------------------------------------------------===//

TEST_CASE("sm_ targets parse into chip numbers") {
  int chip = 0;
  bool specific = true;
  CHECK(parse_sm_target("sm_90", &chip, &specific));
  CHECK(chip == 90);
  CHECK_FALSE(specific);
  CHECK(parse_sm_target("sm_100", &chip, &specific));
  CHECK(chip == 100);
  CHECK(parse_sm_target("sm_90a", &chip, &specific));
  CHECK(chip == 90);
  CHECK(specific);
  CHECK_FALSE(parse_sm_target("cpu", &chip, &specific));
  CHECK_FALSE(parse_sm_target("sm_", &chip, &specific));
  CHECK_FALSE(parse_sm_target("sm_9x", &chip, &specific));
}

TEST_CASE("kernel selection: exact cubin, else the highest PTX at or below") {
  Manifest m = gpuManifest();

  // sm_90 device: the sm_90 cubin, with the sm_90 PTX as its fallback.
  auto c = select_gpu_kernel(m, 9, 0);
  REQUIRE_MESSAGE(c.ok(), c.error());
  CHECK(c->target == "sm_90");
  CHECK(c->chip == 90);
  CHECK(c->kernel_index == 2);
  CHECK(c->use_cubin);
  CHECK(c->image == "k.sm_90.cubin");
  CHECK(c->ptx_fallback == "k.sm_90.ptx");
  CHECK(c->symbol == "k");
  CHECK(c->threads_per_block == 256);
  CHECK(c->elements_per_thread == 4);

  // sm_89 (Ada): no cubin of its own; the sm_80 PTX, JIT-compiled.
  c = select_gpu_kernel(m, 8, 9);
  REQUIRE_MESSAGE(c.ok(), c.error());
  CHECK(c->target == "sm_80");
  CHECK_FALSE(c->use_cubin);
  CHECK(c->image == "k.sm_80.ptx");
  CHECK(contains(c->reason, "JIT"));

  // sm_100 picks its cubin; sm_120 the sm_100 PTX.
  c = select_gpu_kernel(m, 10, 0);
  REQUIRE(c.ok());
  CHECK(c->use_cubin);
  CHECK(c->image == "k.sm_100.cubin");
  c = select_gpu_kernel(m, 12, 0);
  REQUIRE(c.ok());
  CHECK_FALSE(c->use_cubin);
  CHECK(c->image == "k.sm_100.ptx");

  // sm_75 (Turing): nothing fits, and the error says what there is.
  c = select_gpu_kernel(m, 7, 5);
  REQUIRE_FALSE(c.ok());
  CHECK(contains(c.error(), "/bundles/k/manifest.json"));
  CHECK(
      contains(c.error(), "no GPU kernel for sm_75 (compute capability 7.5)"));
  CHECK(contains(c.error(), "sm_80, sm_90, sm_100"));

  // A CPU-only manifest.
  Manifest cpuOnly = m;
  cpuOnly.kernels.resize(1);
  c = select_gpu_kernel(cpuOnly, 9, 0);
  REQUIRE_FALSE(c.ok());
  CHECK(contains(c.error(), "the bundle has no GPU kernels"));
}

TEST_CASE("kernel selection: a missing cubin falls back to that chip's PTX") {
  // The manifest lists no cubin for sm_90 (no ptxas when it was built).
  Manifest m = gpuManifest();
  m.kernels[2].cubin.clear();
  auto c = select_gpu_kernel(m, 9, 0);
  REQUIRE_MESSAGE(c.ok(), c.error());
  CHECK(c->target == "sm_90");
  CHECK_FALSE(c->use_cubin);
  CHECK(c->image == "k.sm_90.ptx");
  CHECK(contains(c->reason, "no cubin for this chip"));

  // The manifest lists it but the file is not there.
  Manifest full = gpuManifest();
  auto noCubins = [](const std::string &f) {
    return f.find(".cubin") == std::string::npos;
  };
  c = select_gpu_kernel(full, 9, 0, noCubins);
  REQUIRE(c.ok());
  CHECK_FALSE(c->use_cubin);
  CHECK(c->image == "k.sm_90.ptx");

  // Neither the sm_90 cubin nor its PTX on disk: the sm_80 PTX.
  auto onlySm80 = [](const std::string &f) { return f == "k.sm_80.ptx"; };
  c = select_gpu_kernel(full, 9, 0, onlySm80);
  REQUIRE(c.ok());
  CHECK(c->image == "k.sm_80.ptx");
}

TEST_CASE("kernel selection: arch-specific targets and block sizes") {
  Manifest m;
  m.name = "k";
  m.kernels = {gpuEntry("sm_90a")};
  auto c = select_gpu_kernel(m, 9, 0);
  REQUIRE(c.ok());
  CHECK(c->use_cubin);
  // sm_90a code runs on sm_90 only, not on newer chips.
  c = select_gpu_kernel(m, 10, 0);
  REQUIRE_FALSE(c.ok());
  CHECK(contains(c.error(), "no GPU kernel for sm_100"));

  // A block size other than 256 is refused; a missing one means 256.
  m.kernels = {gpuEntry("sm_80", false, 128)};
  c = select_gpu_kernel(m, 8, 0);
  REQUIRE_FALSE(c.ok());
  CHECK(contains(c.error(), "128 threads per block"));
  m.kernels = {gpuEntry("sm_80", false, 0, 0)};
  c = select_gpu_kernel(m, 8, 0);
  REQUIRE(c.ok());
  CHECK(c->threads_per_block == 256);
  CHECK(c->elements_per_thread == 0);
}

TEST_CASE("GPU kernel entries keep cubin, block size and ptxas figures") {
  const char *json = R"({
    "format": "flashopt-manifest", "format_version": 1,
    "generator": "test", "name": "g", "spec_hash": "h", "rule": "sgd",
    "group_size": 32,
    "param": {"dtype": "f32", "correction": "none"}, "grad": "f32",
    "hypers": [{"name": "lr", "default": 0.1}],
    "states": [],
    "buffers": [
      {"name": "param", "dtype": "f32", "per": "element", "access": "readwrite"},
      {"name": "grad", "dtype": "f32", "per": "element", "access": "read"}],
    "table": {"header_words": 4, "record_words": 6},
    "bytes_per_param": {"param": 4, "correction": 0, "grad": 4, "states": 0,
                        "total": 8, "total_with_grad_release": 4},
    "kernels": [{"target": "sm_90", "threads_per_block": 256,
                 "elements_per_thread": 8, "registers": 40,
                 "spill_stores": 0, "spill_loads": 0,
                 "cubin": "g.sm_90.cubin", "file": "g.sm_90.ptx",
                 "symbol": "g"}]})";
  auto m = parse_manifest(json, "g");
  REQUIRE_MESSAGE(m.ok(), m.error());
  const KernelEntry &k = m->kernels[0];
  CHECK(k.cubin == "g.sm_90.cubin");
  CHECK(k.file == "g.sm_90.ptx");
  CHECK(k.threads_per_block == 256);
  CHECK(k.elements_per_thread == 8);
  CHECK(k.registers == 40);
  CHECK(k.spill_stores == 0);
  CHECK(k.spill_loads == 0);
}

//===----------------------------------------------------------------------===//
// Launch geometry
//===----------------------------------------------------------------------===//

TEST_CASE("grid size: one pass of threads, capped at 8 blocks per SM") {
  // G = 32 at 4 elements per thread: 8 lanes a group, 4 groups a warp.
  CHECK(gpu_grid_size(0, 32, 4, 256, 132) == 0);
  CHECK(gpu_grid_size(1, 32, 4, 256, 132) == 1);
  CHECK(gpu_grid_size(32, 32, 4, 256, 132) == 1); // 8 warps = 1 block
  CHECK(gpu_grid_size(33, 32, 4, 256, 132) == 2);
  CHECK(gpu_grid_size(1000, 32, 4, 256, 132) == 32); // 250 warps
  // Unknown elements per thread assumes the fewest (4): never too few.
  CHECK(gpu_grid_size(1000, 32, 0, 256, 132) == 32);
  // 8 and 16 elements per thread: 8 and 16 groups a warp.
  CHECK(gpu_grid_size(1000, 32, 8, 256, 132) == 16);
  CHECK(gpu_grid_size(1000, 32, 16, 256, 132) == 8);
  // Capped at 8 * SMs (H200: 132 SMs), or another multiple.
  const int64_t groups = int64_t(1e9) / 32;
  CHECK(gpu_grid_size(groups, 32, 4, 256, 132) == 8 * 132);
  CHECK(gpu_grid_size(groups, 32, 4, 256, 132, 4) == 4 * 132);
  CHECK(gpu_grid_size(groups, 32, 4, 256, 108) == 8 * 108);
  // A group narrower than a thread's width: one lane a group.
  CHECK(gpu_grid_size(64, 4, 8, 256, 10) == 1);
  CHECK(gpu_grid_size(257, 1, 4, 256, 10) == 2);
}

//===----------------------------------------------------------------------===//
// Table records
//===----------------------------------------------------------------------===//

TEST_CASE("records: a tensor over 2^31 - 1 elements is split at 64 groups") {
  const int64_t G = 32;
  const int64_t max = gpu_max_record_elements(G);
  CHECK(max == (int64_t(1) << 31) - 2048);
  CHECK(max <= std::numeric_limits<int32_t>::max());
  CHECK(max % (64 * G) == 0);

  // Small tensors: one record, untouched.
  auto one = split_records(65543, G, max);
  REQUIRE(one.size() == 1);
  CHECK(one[0].offset == 0);
  CHECK(one[0].numel == 65543);
  CHECK(split_records(max, G, max).size() == 1);
  CHECK(split_records(max + 1, G, max).size() == 2);

  // 5e9 elements (no memory is touched).
  const int64_t n = 5000000001;
  auto pieces = split_records(n, G, max);
  REQUIRE(pieces.size() == 3);
  int64_t next = 0;
  for (const RecordSlice &r : pieces) {
    CHECK(r.offset == next);
    CHECK(r.offset % (64 * G) == 0);
    CHECK(r.numel > 0);
    CHECK(r.numel <= std::numeric_limits<int32_t>::max());
    next += r.numel;
  }
  CHECK(next == n);

  // The records of that tensor: contiguous groups, advanced addresses.
  Manifest m = adamwShape();
  TensorInfo t;
  t.numel = n;
  t.first_group = 1000; // tensors before it
  t.num_groups = (n + G - 1) / G;
  t.param_group = 1;
  std::vector<int64_t> base = {0x10000000000, 0x20000000000, 0x30000000000,
                               0x40000000000, 0x50000000000, 0x60000000000,
                               0x70000000000};
  std::vector<int64_t> table(11, -1); // an earlier record stays as it was
  int64_t added = append_table_records(m, t, base, max, table);
  REQUIRE(added == 3);
  REQUIRE(table.size() == 11 * 4);
  CHECK(table[0] == -1);
  int64_t groups = 0;
  for (size_t i = 0; i < 3; ++i) {
    const int64_t *rec = table.data() + 11 * (i + 1);
    INFO("record " << i);
    CHECK(rec[0] == pieces[i].numel);
    CHECK(rec[1] == 1000 + pieces[i].offset / G);
    CHECK(rec[1] == 1000 + groups);
    CHECK(rec[2] == 1);
    int64_t off = pieces[i].offset;
    CHECK(rec[3] == off); // the element offset (the dither's index base)
    CHECK(rec[4] == base[0] + 2 * off);       // bf16 param
    CHECK(rec[5] == base[1] + off);           // i8 correction
    CHECK(rec[6] == base[2] + 2 * off);       // bf16 grad
    CHECK(rec[7] == base[3] + off);           // i8 codes
    CHECK(rec[8] == base[4] + 2 * (off / G)); // f16 scales (per group)
    CHECK(rec[9] == base[5] + off);
    CHECK(rec[10] == base[6] + 2 * (off / G));
    for (int w = 4; w < 11; ++w)
      CHECK(rec[w] % 16 == 0);
    groups += (pieces[i].numel + G - 1) / G;
  }
  CHECK(groups == t.num_groups); // only the last record ends in a partial group

  // A null grad stays null in every record.
  base[2] = 0;
  std::vector<int64_t> t2;
  append_table_records(m, t, base, max, t2);
  for (size_t i = 0; i < 3; ++i)
    CHECK(t2[11 * i + 6] == 0);

  // Small limits (as the GPU check uses to exercise splitting) round up to
  // whole 64-group units.
  auto small = split_records(10000, G, 3000);
  REQUIRE(small.size() == 5); // 2048 * 4 + 1808
  CHECK(small[1].offset == 2048);
  CHECK(small[4].numel == 10000 - 4 * 2048);
  CHECK(split_records(10000, G, 100).size() == 5);
}

TEST_CASE("hyper table: validation and change tracking") {
  Manifest m;
  m.name = "h";
  m.hypers = {{"lr", 0.1f}, {"wd", std::nullopt}};
  HyperTable h(m);
  CHECK(h.num_slots() == 0);
  uint64_t g0 = h.generation();
  CHECK(h.add_slot() == 0);
  CHECK(h.generation() != g0);
  CHECK(h.values() == std::vector<float>{0.1f, 0.0f});
  Status s = h.check_complete();
  REQUIRE_FALSE(s.ok());
  CHECK(contains(s.message(), "\"wd\" has no default"));
  REQUIRE(h.set(0, "wd", 0.5f).ok());
  CHECK(h.check_complete().ok());
  uint64_t g1 = h.generation();
  REQUIRE(h.set(0, "wd", 0.5f).ok()); // the same value: no change
  CHECK(h.generation() == g1);
  REQUIRE(h.set(0, "lr", 0.2f).ok());
  CHECK(h.generation() != g1);
  CHECK_FALSE(h.set(1, "lr", 0.2f).ok());
  CHECK_FALSE(h.set(0, "nope", 0.2f).ok());
  CHECK_FALSE(h.set(0, "lr", std::numeric_limits<float>::infinity()).ok());
  CHECK(*h.get(0, "lr") == 0.2f);
}

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

TEST_CASE("the driver loader names the library and dlerror") {
  auto d = CudaDriver::load("/nonexistent/libcuda.so.1");
  REQUIRE_FALSE(d.ok());
  CHECK(contains(d.error(), "CUDA was requested but the NVIDIA driver library "
                            "/nonexistent/libcuda.so.1 could not be loaded: "));
  CHECK(contains(d.error(), "/nonexistent/libcuda.so.1:")); // dlerror's text
  CHECK(cuda_version_string(12040) == "12.4");
  CHECK(cuda_version_string(13000) == "13.0");
}

TEST_CASE("CudaContext: a clear error without a driver, a device with one") {
  auto ctx = CudaContext::create(0);
  if (!driverLoadable()) {
    REQUIRE_FALSE(ctx.ok());
    const std::string prefix = "CUDA was requested but the NVIDIA driver "
                               "library libcuda.so.1 could not be loaded: ";
    CHECK(ctx.error().rfind(prefix, 0) == 0);
    CHECK(ctx.error().size() > prefix.size()); // dlerror's reason follows
    // The same answer every time (the load is attempted once).
    auto again = CudaContext::create(1);
    REQUIRE_FALSE(again.ok());
    CHECK(again.error() == ctx.error());
    MESSAGE("no NVIDIA driver here: " << ctx.error());
    return;
  }
  REQUIRE_MESSAGE(ctx.ok(), ctx.error());
  const CudaDeviceInfo &info = (*ctx)->info();
  MESSAGE("device 0: " << info.name << ", sm_" << info.chip() << ", "
                       << info.sm_count << " SMs, driver CUDA "
                       << cuda_version_string(info.driver_version));
  CHECK_FALSE(info.name.empty());
  CHECK(info.cc_major >= 5);
  CHECK(info.sm_count > 0);
  CHECK(info.total_memory > 0);
  auto bad = CudaContext::create(1 << 20);
  REQUIRE_FALSE(bad.ok());
  CHECK(contains(bad.error(), "does not exist"));
}

TEST_CASE("GPU: one step of a shipped bundle matches the CPU (GPU only)") {
  const std::string dir = kernelsDir() + "/sgd_f32";
  if (kernelsDir().empty() || !isFile(dir + "/manifest.json") ||
      !driverLoadable()) {
    MESSAGE("skipped: needs the NVIDIA driver and " << dir);
    return;
  }
  auto ctx = CudaContext::create(0);
  REQUIRE_MESSAGE(ctx.ok(), ctx.error());
  auto gpu = CudaOptimizer::create(*ctx, dir);
  REQUIRE_MESSAGE(gpu.ok(), gpu.error());
  CpuLoadOptions lo;
  lo.use_env = false;
  auto cpu = CpuOptimizer::create(dir, lo);
  REQUIRE_MESSAGE(cpu.ok(), cpu.error());

  const int64_t n = 1000;
  std::vector<float> p(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    p[size_t(i)] = float(i % 17) * 0.25f - 2.0f;
    g[size_t(i)] = float(i % 13) * 0.125f - 0.75f;
  }
  auto dp = DeviceBuffer::allocate(*ctx, n * 4);
  auto dg = DeviceBuffer::allocate(*ctx, n * 4);
  REQUIRE(dp.ok());
  REQUIRE(dg.ok());
  REQUIRE(dp->upload(p.data(), n * 4).ok());
  REQUIRE(dg->upload(g.data(), n * 4).ok());
  REQUIRE((*gpu)->add_param(0, dp->ptr(), n, dg->ptr()).ok());
  REQUIRE((*cpu)->add_param(0, p.data(), n, g.data()).ok());
  for (int s = 0; s < 3; ++s) {
    Status gs = (*gpu)->step();
    REQUIRE_MESSAGE(gs.ok(), gs.message());
    REQUIRE((*cpu)->step().ok());
  }
  CHECK((*gpu)->table_uploads() == 1);
  CHECK((*gpu)->hyper_uploads() == 1);
  REQUIRE((*gpu)->synchronize().ok());
  for (const BufferSpec &b : (*gpu)->manifest().buffers) {
    auto got = (*gpu)->read_buffer(0, b.name);
    REQUIRE_MESSAGE(got.ok(), got.error());
    auto want = (*cpu)->buffer(0, b.name);
    REQUIRE(want.ok());
    REQUIRE(int64_t(got->size()) == want->bytes);
    CHECK_MESSAGE(std::memcmp(got->data(), want->data, got->size()) == 0,
                  b.name);
  }
}

//===----------------------------------------------------------------------===//
// CudaOptimizer over a stand-in driver (Inputs/mock_cuda.cpp)
//===----------------------------------------------------------------------===//

#if defined(FLASHOPT_MOCK_CUDA) && defined(FLASHOPT_FAKE_SGD_BUNDLE)
namespace {

/// The stand-in driver: "device memory" is host memory, and a launch runs
/// the fake_sgd CPU kernel after checking the table as a GPU would need it.
const CudaDriver &mockDriver() {
  static std::unique_ptr<CudaDriver> d = [] {
    setenv("FLASHOPT_MOCK_CUDA_CC", "9.0", 1);
    setenv("FLASHOPT_MOCK_CUDA_KERNEL",
           FLASHOPT_FAKE_SGD_BUNDLE "/fake_sgd.x86-64.so", 1);
    auto r = CudaDriver::load(FLASHOPT_MOCK_CUDA);
    REQUIRE_MESSAGE(r.ok(), r.error());
    return std::move(r.value());
  }();
  return *d;
}

void mockStats(int64_t *launches, int64_t *allocations, int64_t *live) {
  void *h = dlopen(FLASHOPT_MOCK_CUDA, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(h);
  using Fn = void (*)(int64_t *, int64_t *, int64_t *);
  auto fn = reinterpret_cast<Fn>(dlsym(h, "mockcuda_stats"));
  bool found = fn != nullptr;
  REQUIRE(found);
  fn(launches, allocations, live);
  dlclose(h);
}

/// A scratch copy of the fake_sgd bundle with an sm_90 PTX (and, if asked,
/// a cubin) that the stand-in driver accepts.
/// This process's scratch directory, removed at exit.
std::filesystem::path scratchDir() {
  struct Scratch {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() /
        ("flashopt-cuda-test-" + std::to_string(getpid()));
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Scratch scratch;
  return scratch.path;
}

std::string mockBundle(const std::string &name, const std::string &cubin) {
  std::string dir = (scratchDir() / name).string();
  std::string cmd = "mkdir -p " + dir +
                    " && cp " FLASHOPT_FAKE_SGD_BUNDLE
                    "/manifest.json " FLASHOPT_FAKE_SGD_BUNDLE "/*.so " +
                    dir;
  REQUIRE(std::system(cmd.c_str()) == 0);
  // Every GPU image carries the ABI description of its manifest (the
  // runtime checks it before loading): a PTX global, raw bytes in a cubin.
  auto manifest = flashopt::abi::load_manifest(dir + "/manifest.json");
  REQUIRE_MESSAGE(manifest.ok(), manifest.error());
  const std::string abiText = flashopt::abi::kernel_abi_description(*manifest);
  {
    std::ofstream ptx(dir + "/fake_sgd.sm_90.ptx");
    ptx << ".version 7.8\n.target sm_90\n.address_size 64\n"
        << flashopt::abi::ptx_kernel_abi_global("fake_sgd_step", abiText)
        << ".visible .entry fake_sgd_step(\n)\n{\n}\n";
  }
  if (!cubin.empty()) {
    std::ifstream in(dir + "/manifest.json");
    std::string text((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    in.close();
    // Add "cubin" to the sm_90 entry.
    std::string key = "\"target\": \"sm_90\",";
    size_t at = text.find(key);
    REQUIRE(at != std::string::npos);
    text.insert(at + key.size(), " \"cubin\": \"fake_sgd.sm_90.cubin\",");
    std::ofstream(dir + "/manifest.json") << text;
    std::ofstream(dir + "/fake_sgd.sm_90.cubin", std::ios::binary)
        << cubin << abiText << '\0';
  }
  return dir;
}

std::shared_ptr<CudaContext> mockContext() {
  auto ctx = CudaContext::create(mockDriver(), 0);
  REQUIRE_MESSAGE(ctx.ok(), ctx.error());
  return *ctx;
}

} // namespace

TEST_CASE("mock driver: context, kernel loading, PTX fallback") {
  auto ctx = mockContext();
  CHECK(ctx->info().name == "Mock GPU (host memory)");
  CHECK(ctx->info().chip() == 90);
  CHECK(ctx->info().sm_count == 132);
  CHECK(ctx->info().driver_version == 13000);
  CHECK(CudaContext::create(mockDriver(), 3).error().find("does not exist") !=
        std::string::npos);

  // PTX only: JIT.
  auto b = CudaBundle::load(ctx, mockBundle("ptx", ""));
  REQUIRE_MESSAGE(b.ok(), b.error());
  CHECK((*b)->loaded() == "sm_90 PTX (JIT)");
  CHECK((*b)->registers() == 42);
  CHECK((*b)->function() != nullptr);
  // A cubin: loaded as is.
  b = CudaBundle::load(ctx, mockBundle("cubin", std::string("\x7f"
                                                            "ELF....",
                                                            8)));
  REQUIRE_MESSAGE(b.ok(), b.error());
  CHECK((*b)->loaded() == "sm_90 cubin");
  // A cubin the driver refuses: the same chip's PTX instead, saying why.
  b = CudaBundle::load(ctx, mockBundle("badcubin", "not an ELF file"));
  REQUIRE_MESSAGE(b.ok(), b.error());
  CHECK(contains((*b)->loaded(), "sm_90 PTX (JIT; the cubin did not load"));
  // A device older than every kernel.
  setenv("FLASHOPT_MOCK_CUDA_CC", "8.0", 1);
  auto old = CudaContext::create(mockDriver(), 0);
  setenv("FLASHOPT_MOCK_CUDA_CC", "9.0", 1);
  REQUIRE(old.ok());
  b = CudaBundle::load(*old, mockBundle("ptx", ""));
  REQUIRE_FALSE(b.ok());
  CHECK(contains(b.error(), "no GPU kernel for sm_80"));
}

TEST_CASE(
    "mock driver: CudaOptimizer == Optimizer, tables uploaded on change") {
  auto ctx = mockContext();
  std::string dir = mockBundle("ptx", "");
  auto bundle = CudaBundle::load(ctx, dir);
  REQUIRE_MESSAGE(bundle.ok(), bundle.error());
  // Records capped at 64 groups: the larger tensors are split.
  CudaOptimizerOptions so;
  so.max_record_elements = 64 * 32;
  auto gpuOr = CudaOptimizer::create(*bundle, so);
  REQUIRE_MESSAGE(gpuOr.ok(), gpuOr.error());
  CudaOptimizer &gpu = **gpuOr;
  CpuLoadOptions lo;
  lo.use_env = false;
  auto cpuOr = CpuOptimizer::create(dir, lo);
  REQUIRE(cpuOr.ok());
  Optimizer &cpu = **cpuOr;
  CHECK(gpu.add_param_group() == 1);
  CHECK(cpu.add_param_group() == 1);
  REQUIRE(gpu.set_hyper(1, "lr", 0.05f).ok());
  REQUIRE(cpu.set_hyper(1, "lr", 0.05f).ok());
  CHECK_FALSE(gpu.set_hyper(2, "lr", 0.05f).ok()); // shared validation
  CHECK_FALSE(gpu.set_hyper(0, "lr", NAN).ok());

  const std::vector<int64_t> sizes = {1, 31, 33, 1000, 4097, 65543};
  std::vector<std::vector<float>> hp, hg;
  std::vector<DeviceBuffer> dp, dg;
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t n = sizes[i];
    hp.emplace_back(size_t(n));
    hg.emplace_back(size_t(n));
    for (int64_t k = 0; k < n; ++k) {
      hp[i][size_t(k)] = float((k * 7 + int64_t(i)) % 23) * 0.125f - 1.0f;
      hg[i][size_t(k)] = float((k * 5 + 3) % 19) * 0.0625f - 0.5f;
    }
    auto p = DeviceBuffer::allocate(ctx, n * 4);
    auto g = DeviceBuffer::allocate(ctx, n * 4);
    REQUIRE(p.ok());
    REQUIRE(g.ok());
    REQUIRE(p->upload(hp[i].data(), n * 4).ok());
    REQUIRE(g->upload(hg[i].data(), n * 4).ok());
    auto a = gpu.add_param(int(i % 2), p->ptr(), n, g->ptr());
    REQUIRE_MESSAGE(a.ok(), a.error());
    REQUIRE(cpu.add_param(int(i % 2), hp[i].data(), n, hg[i].data()).ok());
    dp.push_back(std::move(*p));
    dg.push_back(std::move(*g));
  }
  // Misaligned and bad registrations.
  auto bad = gpu.add_param(0, dp[0].ptr() + 4, 8, dg[0].ptr());
  REQUIRE_FALSE(bad.ok());
  CHECK(contains(bad.error(), "not 16-byte aligned"));
  CHECK_FALSE(gpu.add_param(0, dp[0].ptr(), 8, dg[0].ptr() + 8).ok());
  CHECK_FALSE(gpu.add_param(5, dp[0].ptr(), 8, dg[0].ptr()).ok());
  CHECK(gpu.num_tensors() == 6);
  CHECK(gpu.total_groups() == cpu.total_groups());

  int64_t launches0 = 0;
  mockStats(&launches0, nullptr, nullptr);
  for (int s = 0; s < 3; ++s) {
    Status st = gpu.step();
    REQUIRE_MESSAGE(st.ok(), st.message());
    REQUIRE(cpu.step().ok());
  }
  int64_t launches1 = 0;
  mockStats(&launches1, nullptr, nullptr);
  CHECK(launches1 - launches0 == 3); // one launch per step
  CHECK(gpu.table_uploads() == 1);   // not re-uploaded by plain steps
  CHECK(gpu.hyper_uploads() == 1);
  CHECK(gpu.num_records() > 6); // split
  CHECK(gpu.launch_config().block == 256);
  CHECK(gpu.launch_config().grid ==
        gpu_grid_size(gpu.total_groups(), 32, 0, 256, 132));

  // Re-pointing to the same grad changes nothing; a new lr is one upload.
  REQUIRE(gpu.set_grad(2, dg[2].ptr()).ok());
  REQUIRE(gpu.set_hyper(0, "lr", 0.02f).ok());
  REQUIRE(cpu.set_hyper(0, "lr", 0.02f).ok());
  REQUIRE(gpu.step().ok());
  REQUIRE(cpu.step().ok());
  CHECK(gpu.table_uploads() == 1);
  CHECK(gpu.hyper_uploads() == 2);
  CHECK(gpu.step_count() == 4);

  auto compareAll = [&](size_t count) {
    REQUIRE(gpu.synchronize().ok());
    for (size_t i = 0; i < count; ++i)
      for (const char *name : {"param", "grad", "momentum_buffer"}) {
        auto got = gpu.read_buffer(int64_t(i), name);
        REQUIRE_MESSAGE(got.ok(), got.error());
        auto want = cpu.buffer(int64_t(i), name);
        REQUIRE(want.ok());
        REQUIRE(int64_t(got->size()) == want->bytes);
        INFO("tensor " << i << " " << name);
        CHECK(std::memcmp(got->data(), want->data, got->size()) == 0);
      }
  };
  compareAll(sizes.size());

  // A tensor added after steps grows the state arena: earlier states are
  // kept, the new one starts at zero (the stand-in fills fresh memory with
  // 0xCD), and the table is uploaded again.
  std::vector<float> np(100000, 0.5f), ng(100000, 0.25f);
  auto p = DeviceBuffer::allocate(ctx, 400000);
  auto g = DeviceBuffer::allocate(ctx, 400000);
  REQUIRE(p.ok());
  REQUIRE(g.ok());
  REQUIRE(p->upload(np.data(), 400000).ok());
  REQUIRE(g->upload(ng.data(), 400000).ok());
  REQUIRE(gpu.add_param(0, p->ptr(), 100000, 0).ok());
  REQUIRE(cpu.add_param(0, np.data(), 100000, nullptr).ok());
  Status noGrad = gpu.step();
  REQUIRE_FALSE(noGrad.ok());
  CHECK(contains(noGrad.message(), "tensor 6 (numel 100000) has no gradient"));
  CHECK(gpu.step_count() == 4);
  auto fresh = gpu.read_buffer(6, "momentum_buffer");
  REQUIRE(fresh.ok());
  CHECK(std::all_of(fresh->begin(), fresh->end(),
                    [](uint8_t b) { return b == 0; }));
  compareAll(sizes.size());
  REQUIRE(gpu.set_grad(6, g->ptr()).ok());
  REQUIRE(cpu.set_grad(6, ng.data()).ok());
  REQUIRE(gpu.step().ok());
  REQUIRE(cpu.step().ok());
  CHECK(gpu.table_uploads() == 2);
  compareAll(sizes.size() + 1);

  // Buffer views and the bytes report.
  auto v = gpu.buffer(3, "momentum_buffer");
  REQUIRE(v.ok());
  CHECK(v->runtime_owned);
  CHECK(v->count == 1000);
  CHECK(reinterpret_cast<uintptr_t>(v->data) % 256 == 0); // 64 f32 entries
  auto pv = gpu.buffer(3, "param");
  REQUIRE(pv.ok());
  CHECK(reinterpret_cast<uintptr_t>(pv->data) == dp[3].ptr());
  CHECK_FALSE(gpu.buffer(3, "nope").ok());
  BytesReport r = gpu.bytes(), c = cpu.bytes();
  CHECK(r.total == c.total);
  CHECK(r.states == c.states);
  CHECK(r.runtime_allocated >= r.states);
}

TEST_CASE("mock driver: every device allocation is freed") {
  int64_t live0 = 0, live1 = 0;
  {
    auto ctx = mockContext();
    mockStats(nullptr, nullptr, &live0);
    auto gpu = CudaOptimizer::create(ctx, mockBundle("ptx", ""));
    REQUIRE(gpu.ok());
    auto p = DeviceBuffer::allocate(ctx, 4096);
    auto g = DeviceBuffer::allocate(ctx, 4096);
    REQUIRE((*gpu)->add_param(0, p->ptr(), 1024, g->ptr()).ok());
    REQUIRE((*gpu)->step().ok());
  }
  mockStats(nullptr, nullptr, &live1);
  CHECK(live1 == live0);
}
#endif

#ifdef FLASHOPT_TEST_HAVE_CUDA_H
TEST_CASE("our driver declarations agree with the toolkit's cuda.h") {
  CHECK(cu::CUDA_SUCCESS == ::CUDA_SUCCESS);
  CHECK(cu::CUDA_ERROR_OUT_OF_MEMORY == ::CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(cu::CUDA_ERROR_NOT_INITIALIZED == ::CUDA_ERROR_NOT_INITIALIZED);
  CHECK(cu::CUDA_ERROR_STUB_LIBRARY == ::CUDA_ERROR_STUB_LIBRARY);
  CHECK(cu::CUDA_ERROR_NO_DEVICE == ::CUDA_ERROR_NO_DEVICE);
  CHECK(cu::CUDA_ERROR_NO_BINARY_FOR_GPU == ::CUDA_ERROR_NO_BINARY_FOR_GPU);
  CHECK(cu::CUDA_ERROR_INVALID_PTX == ::CUDA_ERROR_INVALID_PTX);
  CHECK(cu::CUDA_ERROR_UNSUPPORTED_PTX_VERSION ==
        ::CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
  CHECK(cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ==
        ::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  CHECK(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ==
        ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  CHECK(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ==
        ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  CHECK(cu::CU_FUNC_ATTRIBUTE_NUM_REGS == ::CU_FUNC_ATTRIBUTE_NUM_REGS);
  CHECK(cu::CU_JIT_INFO_LOG_BUFFER == ::CU_JIT_INFO_LOG_BUFFER);
  CHECK(cu::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ==
        ::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
  CHECK(cu::CU_JIT_ERROR_LOG_BUFFER == ::CU_JIT_ERROR_LOG_BUFFER);
  CHECK(cu::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES ==
        ::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
  CHECK(sizeof(cu::CUdeviceptr) == sizeof(::CUdeviceptr));
  CHECK(sizeof(cu::CUresult) == sizeof(::CUresult));
  CHECK(sizeof(cu::CUdevice) == sizeof(::CUdevice));
}
#endif
