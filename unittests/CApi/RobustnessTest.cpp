//===- RobustnessTest.cpp - Bad input and faults through the C ABI --------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The regressions of issue 12 (docs/ERRORS.md links here): a manifest that
/// disagrees with its kernel, non-regular files read or written, a bounded
/// thread count, stale temporaries of killed saves, unsavable names, the
/// checkpoint's parameter list and checksums, out-of-range master weights
/// and hyper-parameters, a wrapping DLPack byte_offset; then the fault
/// tests: a save failing at every stage, writers killed with SIGKILL at
/// random moments, corrupted checkpoints rejected changing nothing, and the
/// NaN/Inf policies.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "safetensors/Safetensors.h"
#include "flashopt/host/Float16.h"
#include "flashopt/abi/Manifest.h"

#include <dlpack/dlpack.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using namespace flashopt::host;
namespace st = flashopt::host::safetensors;

namespace {

std::string binDir() {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return b ? b : FLASHOPT_TEST_BINARY_DIR;
}
std::string bundle(const std::string &spec) {
  return binDir() + "/kernels/" + spec;
}
bool has(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}
std::string err() { return flashopt_last_error(); }

fs::path scratchDir() {
  struct Scratch {
    fs::path path = fs::temp_directory_path() /
                    ("flashopt-robust-test-" + std::to_string(getpid()));
    Scratch() { fs::create_directories(path); }
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static Scratch s;
  return s.path;
}

std::string readAll(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}
void writeAll(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// 64-byte aligned bytes.
struct Mem {
  std::vector<uint8_t> raw;
  uint8_t *p = nullptr;
  size_t n = 0;
  explicit Mem(size_t bytes) : raw(bytes + 64), n(bytes) {
    p = raw.data() + (64 - uintptr_t(raw.data()) % 64) % 64;
  }
  std::vector<uint8_t> copy() const { return std::vector<uint8_t>(p, p + n); }
};

/// One adamw_bf16_m24 (bf16 params, i8 correction) optimizer with one
/// parameter "w" of `n` elements, stepped `steps` times.
struct Opt {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  int64_t n;
  Mem param, grad;
  explicit Opt(int64_t numel = 100, int steps = 2,
               const std::string &spec = "adamw_bf16_m24")
      : n(numel), param(size_t(numel) * 2), grad(size_t(numel) * 2) {
    auto *w = reinterpret_cast<uint16_t *>(param.p);
    auto *g = reinterpret_cast<uint16_t *>(grad.p);
    for (int64_t i = 0; i < n; ++i) {
      w[i] = f32_to_bf16(0.5f + float(i % 13) / 16.0f);
      g[i] = f32_to_bf16(float(i % 5) / 100.0f - 0.02f);
    }
    REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) ==
            FLASHOPT_OK);
    REQUIRE_MESSAGE(flashopt_optimizer_create(ctx, bundle(spec).c_str(),
                                              &opt) == FLASHOPT_OK,
                    err());
    int64_t idx = -1;
    REQUIRE_MESSAGE(flashopt_add_param(opt, 0, "w", param.p, FLASHOPT_BF16, n,
                                       grad.p, FLASHOPT_BF16,
                                       &idx) == FLASHOPT_OK,
                    err());
    for (int s = 0; s < steps; ++s)
      REQUIRE_MESSAGE(flashopt_step(opt) == FLASHOPT_OK, err());
  }
  ~Opt() {
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
  }
  void save(const std::string &path) {
    REQUIRE_MESSAGE(flashopt_save_checkpoint(opt, path.c_str(),
                                             FLASHOPT_CHECKPOINT_COMPRESSED) ==
                        FLASHOPT_OK,
                    err());
  }
  /// Everything a step or a load could change: the checkpoint tensors
  /// (params, corrections, states, scales), step counters and hypers.
  std::map<std::string, std::string> snapshot() {
    static int counter = 0;
    std::string path =
        (scratchDir() / ("snap-" + std::to_string(counter++))).string();
    save(path);
    Expected<st::File> f = st::File::read(path);
    REQUIRE(f.ok());
    std::map<std::string, std::string> out;
    for (const auto &kv : f->tensors())
      out[kv.first] = std::string(
          reinterpret_cast<const char *>(kv.second.data), size_t(kv.second.bytes));
    for (const char *k : {"step", "skipped_steps", "params", "param_groups"})
      out[std::string("meta:") + k] = f->metadata().at(k);
    fs::remove(path);
    return out;
  }
};

/// A copy of a shipped bundle in the scratch directory.
std::string copyBundle(const std::string &spec, const std::string &tag) {
  fs::path dst = scratchDir() / tag;
  fs::remove_all(dst);
  fs::copy(bundle(spec), dst, fs::copy_options::recursive);
  return dst.string();
}

/// Replaces the first `from` in a file by `to`.
void editFile(const std::string &path, const std::string &from,
              const std::string &to) {
  std::string s = readAll(path);
  size_t at = s.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, from);
  s.replace(at, from.size(), to);
  writeAll(path, s);
}

/// The "hypers": [...] array of a manifest text, replaced by `with`.
void replaceHypers(const std::string &manifest, const std::string &with) {
  std::string s = readAll(manifest);
  size_t a = s.find("\"hypers\": [");
  REQUIRE(a != std::string::npos);
  size_t b = s.find("\n  ],", a);
  REQUIRE(b != std::string::npos);
  s.replace(a, b + 4 - a, "\"hypers\": " + with);
  writeAll(manifest, s);
}

/// Rewrites checkpoint `in` to `out` with `edit` applied to its metadata
/// (tensors kept byte for byte), as a tool that edits the metadata does: it
/// drops the metadata checksum (which `edit` may put back) so the checks
/// behind it are what a test sees.
template <typename Edit>
void rewriteCheckpoint(const std::string &in, const std::string &out,
                       Edit edit) {
  Expected<st::File> f = st::File::read(in);
  REQUIRE(f.ok());
  std::map<std::string, std::string> meta = f->metadata();
  REQUIRE(meta.count("metadata_checksum"));
  meta.erase("metadata_checksum");
  edit(meta);
  std::vector<std::vector<uint8_t>> data;
  std::vector<st::TensorRef> refs;
  data.reserve(f->tensors().size());
  for (const auto &kv : f->tensors()) {
    data.emplace_back(kv.second.data, kv.second.data + kv.second.bytes);
    st::TensorRef r;
    r.name = kv.first;
    r.dtype = kv.second.dtype;
    r.shape = kv.second.shape;
    r.data = data.back().data();
    refs.push_back(r);
  }
  Status s = st::write_file(out, refs, meta);
  REQUIRE_MESSAGE(s.ok(), s.message());
}

std::string replaceFirst(std::string s, const std::string &from,
                         const std::string &to) {
  size_t at = s.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, from << " in " << s);
  return s.replace(at, from.size(), to);
}

/// The names of the temporaries of `target` in its directory.
std::vector<std::string> temporariesOf(const fs::path &target) {
  std::vector<std::string> out;
  std::string prefix = "." + target.filename().string() + ".tmp-";
  for (auto &e : fs::directory_iterator(target.parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0)
      out.push_back(e.path().filename().string());
  return out;
}

/// A pid that is certainly not running: a child that has exited and been
/// reaped.
pid_t deadPid() {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0)
    _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

} // namespace

//===----------------------------------------------------------------------===//
// A manifest that disagrees with its kernel
//===----------------------------------------------------------------------===//

TEST_CASE("robustness: a manifest that disagrees with its kernel is refused") {
  flashopt_context ctx = nullptr;
  REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) == FLASHOPT_OK);
  // The shipped bundle loads, and its CPU kernels carry their description.
  {
    flashopt_optimizer opt = nullptr;
    REQUIRE(flashopt_optimizer_create(ctx, bundle("adamw_bf16_m24").c_str(),
                                      &opt) == FLASHOPT_OK);
    flashopt_optimizer_destroy(opt);
  }
  SUBCASE("\"hypers\": [] (the kernel reads 7 per group)") {
    std::string dir = copyBundle("adamw_bf16_m24", "nohypers");
    replaceHypers(dir + "/manifest.json", "[]");
    // The manifest alone is well-formed ...
    REQUIRE(load_manifest(dir + "/manifest.json").ok());
    // ... but not what the kernel was compiled for.
    flashopt_optimizer opt = nullptr;
    CHECK(flashopt_optimizer_create(ctx, dir.c_str(), &opt) ==
          FLASHOPT_ERROR_FORMAT);
    CHECK(opt == nullptr);
    CHECK(has(err(), "disagrees with kernel"));
    CHECK(has(err(), "hypers lr,beta1,beta2"));
  }
  SUBCASE("hyper-parameters in another order") {
    std::string dir = copyBundle("adamw_bf16_m24", "swapped");
    editFile(dir + "/manifest.json", "\"name\": \"beta1\"", "\"name\": \"tmp\"");
    editFile(dir + "/manifest.json", "\"name\": \"beta2\"", "\"name\": \"beta1\"");
    editFile(dir + "/manifest.json", "\"name\": \"tmp\"", "\"name\": \"beta2\"");
    REQUIRE(load_manifest(dir + "/manifest.json").ok());
    flashopt_optimizer opt = nullptr;
    CHECK(flashopt_optimizer_create(ctx, dir.c_str(), &opt) ==
          FLASHOPT_ERROR_FORMAT);
    CHECK(has(err(), "disagrees with kernel"));
  }
  SUBCASE("the kernel files of another bundle") {
    std::string dir = copyBundle("adamw_bf16_m24", "noabi");
    // The sgd kernels in place of the adamw ones: refused at load.
    // Every CPU flavour the bundle has (the host picks the best one).
    for (const char *cpu : {"x86-64-v4", "x86-64-v3", "x86-64"})
      if (fs::exists(bundle("sgd_bf16") + "/sgd_bf16." + cpu + ".so"))
        fs::copy_file(bundle("sgd_bf16") + "/sgd_bf16." + cpu + ".so",
                      dir + "/adamw_bf16_m24." + cpu + ".so",
                      fs::copy_options::overwrite_existing);
    flashopt_optimizer opt = nullptr;
    CHECK(flashopt_optimizer_create(ctx, dir.c_str(), &opt) ==
          FLASHOPT_ERROR_FORMAT);
    CHECK(opt == nullptr);
  }
  flashopt_context_destroy(ctx);
}

TEST_CASE("robustness: a CUDA optimizer checks the manifest against the "
          "GPU kernel it loads, with or without a CPU kernel in the bundle") {
  // Over the stand-in driver of unittests/Runtime (no GPU needed).
  setenv("FLASHOPT_CUDA_DRIVER", FLASHOPT_MOCK_CUDA, 1);
  setenv("FLASHOPT_MOCK_CUDA_CC", "9.0", 1);
  std::string kernels = binDir() + "/kernels";
  setenv("FLASHOPT_MOCK_CUDA_KERNELS", kernels.c_str(), 1);
  flashopt_context gctx = nullptr;
  REQUIRE_MESSAGE(flashopt_context_create(FLASHOPT_DEVICE_CUDA, 0, &gctx) ==
                      FLASHOPT_OK,
                  err());
  flashopt_optimizer opt = nullptr;
  REQUIRE_MESSAGE(flashopt_optimizer_create(gctx, bundle("adamw_bf16_m24").c_str(),
                                            &opt) == FLASHOPT_OK,
                  err());
  flashopt_optimizer_destroy(opt);
  opt = nullptr;
  // A GPU-only bundle (no CPU kernel file to compare with: the check reads
  // the sm_90 cubin itself), then one with its PTX only (the JIT path).
  for (bool ptxOnly : {false, true}) {
    CAPTURE(ptxOnly);
    std::string dir = copyBundle("adamw_bf16_m24", "cuda-nohypers");
    for (const auto &e : fs::directory_iterator(dir)) {
      std::string ext = e.path().extension().string();
      if (ext == ".so" || (ptxOnly && ext == ".cubin"))
        fs::remove(e.path());
    }
    // Unchanged, it loads.
    REQUIRE_MESSAGE(flashopt_optimizer_create(gctx, dir.c_str(), &opt) ==
                        FLASHOPT_OK,
                    err());
    flashopt_optimizer_destroy(opt);
    opt = nullptr;
    replaceHypers(dir + "/manifest.json", "[]");
    CHECK(flashopt_optimizer_create(gctx, dir.c_str(), &opt) ==
          FLASHOPT_ERROR_FORMAT);
    CHECK(opt == nullptr);
    CHECK(has(err(), "disagrees with kernel"));
    CHECK(has(err(), ptxOnly ? ".sm_90.ptx" : ".sm_90.cubin"));
  }
  // A PTX without the description (an old or a foreign kernel) is refused.
  std::string dir = copyBundle("adamw_bf16_m24", "cuda-noabi");
  for (const auto &e : fs::directory_iterator(dir))
    if (e.path().extension() == ".cubin")
      fs::remove(e.path());
  std::string ptx = dir + "/adamw_bf16_m24.sm_90.ptx";
  editFile(ptx, ".visible .global", "// .visible .global");
  CHECK(flashopt_optimizer_create(gctx, dir.c_str(), &opt) ==
        FLASHOPT_ERROR_FORMAT);
  CHECK(opt == nullptr);
  CHECK(has(err(), "has no ABI description"));
  flashopt_context_destroy(gctx);
  unsetenv("FLASHOPT_CUDA_DRIVER");
}

//===----------------------------------------------------------------------===//
// Files that are not regular files
//===----------------------------------------------------------------------===//

TEST_CASE("robustness: a save onto a FIFO, a device or a dangling link is "
          "refused, a link to a file is followed") {
  Opt o;
  fs::path dir = scratchDir() / "targets";
  fs::create_directories(dir);
  SUBCASE("FIFO") {
    std::string fifo = (dir / "ckpt.fifo").string();
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    CHECK(flashopt_save_checkpoint(o.opt, fifo.c_str(),
                                   FLASHOPT_CHECKPOINT_COMPRESSED) ==
          FLASHOPT_ERROR_IO);
    CHECK(has(err(), "a FIFO"));
    struct stat sb;
    REQUIRE(lstat(fifo.c_str(), &sb) == 0);
    CHECK(S_ISFIFO(sb.st_mode)); // still the FIFO
    CHECK(temporariesOf(fifo).empty());
    // Loading from it neither blocks nor succeeds.
    CHECK(flashopt_load_checkpoint(o.opt, fifo.c_str()) != FLASHOPT_OK);
    CHECK(has(err(), "FIFO"));
  }
  SUBCASE("a link to a character device") {
    std::string link = (dir / "null.link").string();
    fs::create_symlink("/dev/null", link);
    CHECK(flashopt_save_checkpoint(o.opt, link.c_str(),
                                   FLASHOPT_CHECKPOINT_COMPRESSED) ==
          FLASHOPT_ERROR_IO);
    CHECK(has(err(), "character device"));
    CHECK(fs::is_symlink(link));
    struct stat sb;
    REQUIRE(stat("/dev/null", &sb) == 0);
    CHECK(S_ISCHR(sb.st_mode));
  }
  SUBCASE("a dangling link") {
    std::string link = (dir / "dangling.link").string();
    fs::create_symlink(dir / "nowhere", link);
    CHECK(flashopt_save_checkpoint(o.opt, link.c_str(),
                                   FLASHOPT_CHECKPOINT_COMPRESSED) ==
          FLASHOPT_ERROR_IO);
    CHECK(has(err(), "symbolic link"));
    CHECK(!fs::exists(dir / "nowhere"));
  }
  SUBCASE("a link to a regular file: the target is replaced, the link kept") {
    std::string real = (dir / "real.safetensors").string();
    writeAll(real, "old");
    std::string link = (dir / "latest.link").string();
    fs::create_symlink(real, link);
    o.save(link);
    CHECK(fs::is_symlink(link));
    CHECK(fs::read_symlink(link) == fs::path(real));
    CHECK(readAll(real).size() > 100);
    CHECK(flashopt_load_checkpoint(o.opt, real.c_str()) == FLASHOPT_OK);
  }
}

TEST_CASE("robustness: FIFOs and endless files as manifests and "
          "checkpoints fail at once") {
  flashopt_context ctx = nullptr;
  REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) == FLASHOPT_OK);
  auto t0 = std::chrono::steady_clock::now();
  SUBCASE("manifest.json -> /dev/zero") {
    std::string dir = copyBundle("adamw_bf16_m24", "zero-manifest");
    fs::remove(dir + "/manifest.json");
    fs::create_symlink("/dev/zero", dir + "/manifest.json");
    flashopt_optimizer opt = nullptr;
    CHECK(flashopt_optimizer_create(ctx, dir.c_str(), &opt) != FLASHOPT_OK);
    CHECK(has(err(), "character device"));
  }
  SUBCASE("manifest.json is a FIFO") {
    std::string dir = copyBundle("adamw_bf16_m24", "fifo-manifest");
    fs::remove(dir + "/manifest.json");
    REQUIRE(mkfifo((dir + "/manifest.json").c_str(), 0600) == 0);
    flashopt_optimizer opt = nullptr;
    CHECK(flashopt_optimizer_create(ctx, dir.c_str(), &opt) != FLASHOPT_OK);
    CHECK(has(err(), "FIFO"));
  }
  SUBCASE("an oversized manifest") {
    std::string dir = copyBundle("adamw_bf16_m24", "big-manifest");
    std::string s = readAll(dir + "/manifest.json");
    s.append(size_t(flashopt::abi::kMaxManifestBytes) + 1 - s.size(), ' ');
    writeAll(dir + "/manifest.json", s);
    flashopt_optimizer opt = nullptr;
    CHECK(flashopt_optimizer_create(ctx, dir.c_str(), &opt) != FLASHOPT_OK);
    CHECK(has(err(), "more than the limit"));
  }
  // Each answer is immediate (no blocking open, no endless read).
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  flashopt_context_destroy(ctx);
}

//===----------------------------------------------------------------------===//
// Bounds on arguments
//===----------------------------------------------------------------------===//

TEST_CASE("robustness: set_threads is bounded") {
  flashopt_context ctx = nullptr;
  REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) == FLASHOPT_OK);
  auto t0 = std::chrono::steady_clock::now();
  for (int n : {100000, 1025, 1 << 30}) {
    CHECK(flashopt_context_set_threads(ctx, n) ==
          FLASHOPT_ERROR_INVALID_ARGUMENT);
    CHECK(has(err(), "[0, 1024]"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(flashopt_context_set_threads(ctx, 2) == FLASHOPT_OK);
  flashopt_context_destroy(ctx);
}

TEST_CASE("robustness: names that cannot be saved are refused at "
          "registration") {
  Opt o(64, 0);
  Mem p(128), g(128);
  int64_t idx = -1, count = 0;
  for (const char *bad : {"\xff\xfe", "w\xc3", "\xed\xa0\x80", "__metadata__"}) {
    CHECK(flashopt_add_param(o.opt, 0, bad, p.p, FLASHOPT_BF16, 64, g.p,
                             FLASHOPT_BF16, &idx) ==
          FLASHOPT_ERROR_INVALID_ARGUMENT);
    CHECK((has(err(), "UTF-8") || has(err(), "reserved")));
  }
  REQUIRE(flashopt_num_params(o.opt, &count) == FLASHOPT_OK);
  CHECK(count == 1); // nothing half-registered
  CHECK(flashopt_add_param(o.opt, 0, "caf\xc3\xa9", p.p, FLASHOPT_BF16, 64,
                           g.p, FLASHOPT_BF16, &idx) == FLASHOPT_OK);
  std::string path = (scratchDir() / "utf8.safetensors").string();
  o.save(path);
  CHECK(flashopt_load_checkpoint(o.opt, path.c_str()) == FLASHOPT_OK);
}

TEST_CASE("robustness: a finite master beyond the bf16 range is an error") {
  Opt o(64, 1);
  auto before = o.snapshot();
  std::vector<float> m(64, 1.0f);
  m[17] = 3.4e38f; // finite f32, rounds to +Inf in bf16
  CHECK(flashopt_import_master_f32(o.opt, 0, m.data(), 64) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(has(err(), "element 17"));
  CHECK(has(err(), "range"));
  CHECK(o.snapshot() == before);
  // The largest bf16 and infinities themselves are accepted.
  m[17] = 3.3895314e38f;
  CHECK(flashopt_import_master_f32(o.opt, 0, m.data(), 64) == FLASHOPT_OK);
  m[17] = INFINITY;
  CHECK(flashopt_import_master_f32(o.opt, 0, m.data(), 64) == FLASHOPT_OK);
}

TEST_CASE("robustness: a hyper-parameter that underflows to 0 is an error") {
  Opt o(64, 0);
  double lr = 0;
  REQUIRE(flashopt_get_hyper(o.opt, 0, "lr", &lr) == FLASHOPT_OK);
  CHECK(flashopt_set_hyper(o.opt, 0, "lr", 1e-46) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(has(err(), "underflows"));
  double now = 0;
  REQUIRE(flashopt_get_hyper(o.opt, 0, "lr", &now) == FLASHOPT_OK);
  CHECK(now == lr);
  CHECK(flashopt_set_hyper(o.opt, 0, "lr", 0.0) == FLASHOPT_OK);
  CHECK(flashopt_set_hyper(o.opt, 0, "lr", 1e-44) == FLASHOPT_OK); // denormal
}

TEST_CASE("robustness: a DLPack byte_offset that wraps the pointer is an "
          "error") {
  Opt o(64, 0);
  Mem p(128);
  int64_t shape[1] = {64};
  DLTensor t{};
  t.data = p.p;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLBfloat, 16, 1};
  t.shape = shape;
  int64_t idx = -1;
  for (uint64_t off : {uint64_t(1) << 63, ~uint64_t(0) - 15}) {
    t.byte_offset = off;
    CHECK(flashopt_add_param_dlpack(o.opt, 0, "v", &t, nullptr, &idx) ==
          FLASHOPT_ERROR_INVALID_ARGUMENT);
    CHECK(has(err(), "byte_offset"));
  }
  int64_t count = 0;
  REQUIRE(flashopt_num_params(o.opt, &count) == FLASHOPT_OK);
  CHECK(count == 1);
}

//===----------------------------------------------------------------------===//
// Checkpoint contents
//===----------------------------------------------------------------------===//

TEST_CASE("robustness: the checkpoint's parameter list is cross-checked") {
  Opt o(100, 2);
  std::string good = (scratchDir() / "list-good.safetensors").string();
  o.save(good);
  auto before = o.snapshot();
  struct Case {
    const char *what;
    std::string from, to;
    flashopt_status code;
    const char *says;
  };
  std::string params = st::File::read(good)->metadata().at("params");
  std::vector<Case> cases = {
      {"numel", "\"numel\":100", "\"numel\":99", FLASHOPT_ERROR_MISMATCH,
       "numel 99"},
      {"shape", "\"shape\":[100]", "\"shape\":[10,10]", FLASHOPT_ERROR_MISMATCH,
       "shape [10, 10]"},
      {"no numel", "\"numel\":100,", "", FLASHOPT_ERROR_FORMAT, "'numel'"},
      {"duplicate", params.substr(1, params.size() - 2),
       params.substr(1, params.size() - 2) + "," +
           params.substr(1, params.size() - 2),
       FLASHOPT_ERROR_FORMAT, "more than once"},
  };
  for (const Case &c : cases) {
    CAPTURE(c.what);
    std::string bad = (scratchDir() / "list-bad.safetensors").string();
    rewriteCheckpoint(good, bad, [&](std::map<std::string, std::string> &m) {
      m["params"] = replaceFirst(m["params"], c.from, c.to);
    });
    CHECK(flashopt_load_checkpoint(o.opt, bad.c_str()) == c.code);
    CHECK(has(err(), c.says));
    CHECK(has(err(), "'w'"));
    CHECK(o.snapshot() == before);
  }
  CHECK(flashopt_load_checkpoint(o.opt, good.c_str()) == FLASHOPT_OK);
}

TEST_CASE("robustness: a flipped data bit is caught by the checksum") {
  Opt o(100, 2);
  std::string good = (scratchDir() / "sum-good.safetensors").string();
  o.save(good);
  auto before = o.snapshot();
  Expected<st::File> f = st::File::read(good);
  REQUIRE(f.ok());
  REQUIRE(f->metadata().count("checksums"));
  std::string bytes = readAll(good);
  uint64_t headerLen = 0;
  std::memcpy(&headerLen, bytes.data(), 8);
  // Every tensor: flip one bit in its data, expect its name in the error.
  for (const auto &kv : f->tensors()) {
    CAPTURE(kv.first);
    // Locate the tensor's bytes in the file: data pointer relative to the
    // file buffer start is 8 + headerLen + begin.
    std::string bad = bytes;
    size_t pos = 0;
    {
      // The reader's buffer is the whole file; recover the offset from it.
      Expected<st::File> g = st::File::read(good);
      const st::StoredTensor *t = g->find(kv.first);
      const uint8_t *base = g->tensors().begin()->second.data;
      // Smallest data pointer of the file = start of the data section.
      for (const auto &u : g->tensors())
        base = std::min(base, u.second.data);
      pos = size_t(8 + headerLen) + size_t(t->data - base);
    }
    REQUIRE(pos < bad.size());
    bad[pos] = char(bad[pos] ^ 0x10);
    std::string path = (scratchDir() / "sum-bad.safetensors").string();
    writeAll(path, bad);
    CHECK(flashopt_load_checkpoint(o.opt, path.c_str()) == FLASHOPT_ERROR_FORMAT);
    CHECK(has(err(), "'" + kv.first + "'"));
    CHECK(has(err(), "checksum"));
    CHECK(o.snapshot() == before);
  }
  // A checksum list that names a tensor the file lacks is refused too.
  std::string extra = (scratchDir() / "sum-extra.safetensors").string();
  rewriteCheckpoint(good, extra, [](std::map<std::string, std::string> &m) {
    m["checksums"] = replaceFirst(m["checksums"], "{", "{\"ghost\":\"crc32c:0\",");
  });
  CHECK(flashopt_load_checkpoint(o.opt, extra.c_str()) == FLASHOPT_ERROR_FORMAT);
  CHECK(o.snapshot() == before);
  // Checkpoints written before checksums existed still load.
  std::string old = (scratchDir() / "sum-old.safetensors").string();
  rewriteCheckpoint(good, old, [](std::map<std::string, std::string> &m) {
    m.erase("checksums");
  });
  CHECK(flashopt_load_checkpoint(o.opt, old.c_str()) == FLASHOPT_OK);
  CHECK(o.snapshot() == before);
  // A checkpoint of the bounded numerics' first revision (no
  // numerics_revision: FlashOptim's linear codes, dithered) holds other
  // codes than this library's minifloat ones: refused by name, nothing
  // loaded.
  std::string first = (scratchDir() / "revision-1.safetensors").string();
  rewriteCheckpoint(good, first, [](std::map<std::string, std::string> &m) {
    REQUIRE(m.at("numerics") == "bounded");
    REQUIRE(m.at("numerics_revision") == "2");
    m.erase("numerics_revision");
  });
  CHECK(flashopt_load_checkpoint(o.opt, first.c_str()) ==
        FLASHOPT_ERROR_MISMATCH);
  CHECK(has(err(), "revision '1' of the 'bounded' numerics"));
  CHECK(has(err(), "reads revision '2'"));
  CHECK(has(err(), "nothing was loaded"));
  CHECK(o.snapshot() == before);
}

TEST_CASE("robustness: a flipped bit in the metadata is caught by its "
          "checksum, a lying rule is a mismatch") {
  // Found by scripts/probe-inputs.py: a flipped digit of a hyper-parameter in
  // __metadata__ 'param_groups' loaded as the new value.
  Opt o(100, 2);
  std::string good = (scratchDir() / "meta-good.safetensors").string();
  o.save(good);
  auto before = o.snapshot();
  std::string bytes = readAll(good);
  for (const char *field : {"\"param_groups\"", "\"step\"", "\"params\""}) {
    CAPTURE(field);
    std::string bad = bytes;
    size_t at = bad.find(field);
    REQUIRE(at != std::string::npos);
    // The first digit of the value after the key.
    size_t digit = bad.find_first_of("0123456789", at + std::strlen(field));
    REQUIRE(digit != std::string::npos);
    bad[digit] = bad[digit] == '1' ? '2' : '1';
    std::string path = (scratchDir() / "meta-bad.safetensors").string();
    writeAll(path, bad);
    CHECK(flashopt_load_checkpoint(o.opt, path.c_str()) == FLASHOPT_ERROR_FORMAT);
    CHECK(has(err(), "__metadata__ checksum"));
    CHECK(has(err(), "corrupt or was edited"));
    CHECK(o.snapshot() == before);
  }
  // A checkpoint whose rule disagrees with its spec (an edited header
  // without the checksum) is a mismatch.
  std::string lying = (scratchDir() / "meta-rule.safetensors").string();
  rewriteCheckpoint(good, lying, [](std::map<std::string, std::string> &m) {
    m["rule"] = "lion";
  });
  CHECK(flashopt_load_checkpoint(o.opt, lying.c_str()) == FLASHOPT_ERROR_MISMATCH);
  CHECK(has(err(), "checkpoint of rule 'lion'"));
  CHECK(o.snapshot() == before);
  // Without the metadata checksum (another tool edited it) a file still loads.
  std::string edited = (scratchDir() / "meta-edited.safetensors").string();
  rewriteCheckpoint(good, edited, [](std::map<std::string, std::string> &) {});
  CHECK(flashopt_load_checkpoint(o.opt, edited.c_str()) == FLASHOPT_OK);
  CHECK(o.snapshot() == before);
}

TEST_CASE("robustness: CRC-32C check value") {
  CHECK(st::crc32c("123456789", 9) == 0xE3069283u);
  CHECK(st::crc32c("", 0) == 0u);
  // Split computation equals one pass.
  std::string s(1000, 'x');
  for (size_t i = 0; i < s.size(); ++i)
    s[i] = char(i * 7 + 3);
  CHECK(st::crc32c(s.data() + 13, s.size() - 13, st::crc32c(s.data(), 13)) ==
        st::crc32c(s.data(), s.size()));
}

TEST_CASE("robustness: an F32 checkpoint with a master beyond bf16 is "
          "refused, changing nothing") {
  Opt o(64, 1);
  std::string good = (scratchDir() / "f32-good.safetensors").string();
  REQUIRE(flashopt_save_checkpoint(o.opt, good.c_str(),
                                   FLASHOPT_CHECKPOINT_F32) == FLASHOPT_OK);
  auto before = o.snapshot();
  Expected<st::File> f = st::File::read(good);
  REQUIRE(f.ok());
  std::map<std::string, std::string> meta = f->metadata();
  std::vector<std::vector<uint8_t>> data;
  std::vector<st::TensorRef> refs;
  data.reserve(f->tensors().size());
  for (const auto &kv : f->tensors()) {
    data.emplace_back(kv.second.data, kv.second.data + kv.second.bytes);
    if (kv.first == "w") {
      float big = 3.4e38f;
      std::memcpy(data.back().data() + 4 * 5, &big, 4);
    }
    st::TensorRef r;
    r.name = kv.first;
    r.dtype = kv.second.dtype;
    r.shape = kv.second.shape;
    r.data = data.back().data();
    refs.push_back(r);
  }
  meta.erase("checksums"); // the data changed on purpose
  meta.erase("metadata_checksum"); // and so did the metadata
  std::string bad = (scratchDir() / "f32-bad.safetensors").string();
  REQUIRE(st::write_file(bad, refs, meta).ok());
  CHECK(flashopt_load_checkpoint(o.opt, bad.c_str()) == FLASHOPT_ERROR_FORMAT);
  CHECK(has(err(), "element 5"));
  CHECK(o.snapshot() == before);
}

//===----------------------------------------------------------------------===//
// Faults during a save
//===----------------------------------------------------------------------===//

TEST_CASE("robustness: stale temporaries of killed saves are removed, "
          "nothing else") {
  Opt o(64, 1);
  fs::path dir = scratchDir() / "stale";
  fs::create_directories(dir);
  fs::path target = dir / "ckpt.safetensors";
  std::string base = target.filename().string();
  pid_t dead = deadPid();
  std::vector<std::string> stale = {
      "." + base + ".tmp-" + std::to_string(dead) + "-0",
      "." + base + ".tmp-" + std::to_string(dead) + "-17"};
  std::vector<std::string> kept = {
      "." + base + ".tmp-1-3",                          // pid 1 is alive
      "." + base + ".tmp-" + std::to_string(dead) + "-x", // not our pattern
      ".other.safetensors.tmp-" + std::to_string(dead) + "-0", // other target
      base + ".tmp-" + std::to_string(dead) + "-0",      // no leading dot
  };
  for (const std::string &n : stale)
    writeAll((dir / n).string(), std::string(1000, 'z'));
  for (const std::string &n : kept)
    writeAll((dir / n).string(), "keep");
  o.save(target.string());
  for (const std::string &n : stale)
    CHECK_MESSAGE(!fs::exists(dir / n), n);
  for (const std::string &n : kept)
    CHECK_MESSAGE(fs::exists(dir / n), n);
  CHECK(flashopt_load_checkpoint(o.opt, target.c_str()) == FLASHOPT_OK);
}

TEST_CASE("robustness: a save failing at any stage keeps the previous "
          "checkpoint intact and loadable") {
  Opt o(300, 1);
  fs::path dir = scratchDir() / "faults";
  fs::create_directories(dir);
  std::string path = (dir / "ckpt.safetensors").string();
  o.save(path);
  const std::string old = readAll(path);
  auto atOld = o.snapshot();
  REQUIRE(flashopt_step(o.opt) == FLASHOPT_OK); // now differs from the file
  auto stepped = o.snapshot();
  REQUIRE(stepped != atOld);
  std::vector<st::WriteFault> faults;
  for (st::WriteStage s : {st::WriteStage::Open, st::WriteStage::Fsync,
                           st::WriteStage::Rename})
    faults.push_back({s, 0, 5});
  for (uint64_t at : {uint64_t(0), uint64_t(4), uint64_t(8), uint64_t(100),
                      uint64_t(old.size() / 2), uint64_t(old.size() - 1)})
    faults.push_back({st::WriteStage::Write, at, 28 /* ENOSPC */});
  for (const st::WriteFault &f : faults) {
    CAPTURE(int(f.stage));
    CAPTURE(f.at_byte);
    st::set_write_fault_for_testing(f);
    flashopt_status s = flashopt_save_checkpoint(
        o.opt, path.c_str(), FLASHOPT_CHECKPOINT_COMPRESSED);
    st::set_write_fault_for_testing(std::nullopt);
    CHECK(s == FLASHOPT_ERROR_IO);
    CHECK(readAll(path) == old);         // the previous file, byte for byte
    CHECK(temporariesOf(path).empty());  // nothing left behind
    CHECK(o.snapshot() == stepped);      // the optimizer is untouched
  }
  // The old checkpoint still loads and restores the old state.
  REQUIRE(flashopt_load_checkpoint(o.opt, path.c_str()) == FLASHOPT_OK);
  CHECK(o.snapshot() == atOld);
  // A read-only directory: the save fails, the file stays.
  if (geteuid() != 0) { // root ignores permissions
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
    CHECK(flashopt_save_checkpoint(o.opt, path.c_str(),
                                   FLASHOPT_CHECKPOINT_COMPRESSED) ==
          FLASHOPT_ERROR_IO);
    fs::permissions(dir, fs::perms::owner_all);
    CHECK(readAll(path) == old);
  }
}

TEST_CASE("robustness: writers killed at random moments never leave a "
          "partial file") {
  // Two complete checkpoints A and B of different sizes; a child rewrites the
  // path with A, B, A, ... until SIGKILL. The file at the path is always
  // exactly A or B.
  fs::path dir = scratchDir() / "kills";
  fs::create_directories(dir);
  std::string path = (dir / "ckpt.safetensors").string();
  std::vector<uint8_t> a(1 << 20), b(3 << 19);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = uint8_t(i * 31 + 7);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = uint8_t(i * 17 + 1);
  auto refsOf = [](const std::vector<uint8_t> &v) {
    st::TensorRef r;
    r.name = "t";
    r.dtype = DType::U8;
    r.shape = {int64_t(v.size())};
    r.data = v.data();
    return std::vector<st::TensorRef>{r};
  };
  REQUIRE(st::write_file(path, refsOf(a), {{"which", "a"}}).ok());
  std::string A = readAll(path);
  REQUIRE(st::write_file(path, refsOf(b), {{"which", "b"}}).ok());
  std::string B = readAll(path);
  std::mt19937 rng(12);
  int sawA = 0, sawB = 0;
  const int kills = 40;
  for (int k = 0; k < kills; ++k) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int i = 0;; ++i) {
        bool useA = i % 2 == 0;
        (void)st::write_file(path, refsOf(useA ? a : b),
                             {{"which", useA ? "a" : "b"}});
      }
    }
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, 30000)(rng)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    std::string now = readAll(path);
    bool isA = now == A, isB = now == B;
    CHECK_MESSAGE((isA || isB), "kill " << k << ": " << now.size() << " bytes");
    sawA += isA;
    sawB += isB;
  }
  MESSAGE("after " << kills << " kills: " << sawA << " x A, " << sawB << " x B");
  // The next save removes every temporary the killed writers left.
  REQUIRE(st::write_file(path, refsOf(a), {{"which", "a"}}).ok());
  CHECK(temporariesOf(path).empty());
}

//===----------------------------------------------------------------------===//
// NaN / Inf gradients under each policy
//===----------------------------------------------------------------------===//

TEST_CASE("robustness: SKIP leaves everything bit-identical on a NaN or Inf "
          "gradient, PROPAGATE steps") {
  for (const char *spec : {"adamw_bf16_m24", "sgd_bf16", "lion_bf16"}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      CAPTURE(spec);
      CAPTURE(bad);
      Opt o(100, 1, spec);
      auto before = o.snapshot();
      std::vector<uint8_t> param = o.param.copy();
      auto *g = reinterpret_cast<uint16_t *>(o.grad.p);
      g[42] = f32_to_bf16(bad);
      REQUIRE(flashopt_set_nonfinite_policy(o.opt, FLASHOPT_NONFINITE_SKIP) ==
              FLASHOPT_OK);
      CHECK(flashopt_step(o.opt) == FLASHOPT_OK);
      auto after = o.snapshot();
      CHECK(o.param.copy() == param);
      // Everything but the skip counter is unchanged.
      CHECK(after["meta:skipped_steps"] == "1");
      after["meta:skipped_steps"] = before["meta:skipped_steps"];
      CHECK(after == before);
      REQUIRE(flashopt_set_nonfinite_policy(o.opt,
                                            FLASHOPT_NONFINITE_PROPAGATE) ==
              FLASHOPT_OK);
      CHECK(flashopt_step(o.opt) == FLASHOPT_OK);
      CHECK(o.snapshot() != before); // the step ran
    }
  }
}

TEST_CASE("robustness: one NaN contract for every rule under PROPAGATE: the "
          "NaN element's weight goes NaN at once, its state group at the next "
          "step, and check_numerics reports it") {
  // Issue 12: Lion's sign(NaN) = 0 kept the weight finite while its 32-element
  // momentum group turned NaN for good (frozen weights, nothing reported).
  for (std::string spec : {"adamw_bf16_m24", "sgd_bf16", "sgd_bf16+momentum",
                           "lion_bf16", "lion_bf16_m24"}) {
    CAPTURE(spec);
    bool momentum = has(spec, "+momentum");
    bool stateless = spec == "sgd_bf16";
    Opt o(100, 1, spec.substr(0, spec.find('+')));
    if (momentum) // SGD's momentum buffer is what carries the NaN onwards
      REQUIRE(flashopt_set_hyper(o.opt, 0, "momentum", 0.9) == FLASHOPT_OK);
    auto *w = reinterpret_cast<uint16_t *>(o.param.p);
    auto *g = reinterpret_cast<uint16_t *>(o.grad.p);
    auto isNan = [](uint16_t b) { return (b & 0x7FFF) > 0x7F80; };
    auto nanCount = [&] {
      int64_t k = 0;
      for (int64_t i = 0; i < o.n; ++i)
        k += isNan(w[i]);
      return k;
    };
    g[42] = f32_to_bf16(NAN);
    REQUIRE(flashopt_set_nonfinite_policy(o.opt, FLASHOPT_NONFINITE_PROPAGATE) ==
            FLASHOPT_OK);
    REQUIRE_MESSAGE(flashopt_step(o.opt) == FLASHOPT_OK, err());
    // The weight of the NaN element is NaN (the canonical one), and only it.
    CHECK(w[42] == 0x7FFF);
    CHECK(nanCount() == 1);
    flashopt_numerics_report rep{};
    CHECK(flashopt_check_numerics(o.opt, &rep) == FLASHOPT_ERROR_NUMERICS);
    CHECK(rep.nonfinite_params == 1);
    // A finite gradient again: every weight sharing the NaN element's state
    // group (elements 32..63; SGD without momentum reads none) is NaN now,
    // and the others moved on finite.
    g[42] = f32_to_bf16(0.01f);
    REQUIRE_MESSAGE(flashopt_step(o.opt) == FLASHOPT_OK, err());
    for (int64_t i = 0; i < o.n; ++i) {
      bool inGroup = i / 32 == 42 / 32;
      CAPTURE(i);
      CHECK(isNan(w[i]) == (i == 42 || (inGroup && !stateless)));
    }
  }
}

TEST_CASE("robustness: a state allocation that fails is OUT_OF_MEMORY with "
          "nothing half-registered") {
  Opt o(64, 1);
  auto before = o.snapshot();
  // 2^55 elements: its i8 codes alone exceed any address space, so the
  // state allocation fails (a limit, not an injected fault). The param
  // memory is never touched at registration: an address above every
  // registered buffer, so that its 2^56-byte range overlaps none of them
  // (above "w" itself: malloc may hand the main thread memory of another
  // arena, mapped high, when the thread pools hold its own).
  void *high = reinterpret_cast<void *>(
      (uintptr_t(o.param.p) + (uintptr_t(1) << 32)) & ~uintptr_t(0xFFFF));
  int64_t idx = -1, count = 0;
  CHECK(flashopt_add_param(o.opt, 0, "huge", high, FLASHOPT_BF16,
                           int64_t(1) << 55, nullptr, FLASHOPT_BF16, &idx) ==
        FLASHOPT_ERROR_OUT_OF_MEMORY);
  CHECK(has(err(), "huge"));
  REQUIRE(flashopt_num_params(o.opt, &count) == FLASHOPT_OK);
  CHECK(count == 1);
  int64_t found = -1;
  CHECK(flashopt_find_param(o.opt, "huge", &found) == FLASHOPT_ERROR_NOT_FOUND);
  CHECK(o.snapshot() == before);
  // The optimizer keeps working, and the name is free again.
  Mem p2(128), g2(128);
  CHECK(flashopt_add_param(o.opt, 0, "huge", p2.p, FLASHOPT_BF16, 64, g2.p,
                           FLASHOPT_BF16, &idx) == FLASHOPT_OK);
  CHECK(flashopt_step(o.opt) == FLASHOPT_OK);
}

TEST_CASE("robustness: the C ABI works from static destructors at exit") {
  // Found by the checkpoint fuzzer (ASan: heap-use-after-free): the
  // thread-local last-error string of the main thread is destroyed before
  // the destructors of static objects run, and an optimizer destroyed there
  // wrote into it. Under the asan preset the old code aborts the child.
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    struct AtExit {
      flashopt_context ctx = nullptr;
      ~AtExit() {
        bool ok = flashopt_context_destroy(ctx) == FLASHOPT_OK;
        // An invalid handle: an error, with its message.
        int bad = 0;
        ok = ok && flashopt_context_destroy(reinterpret_cast<flashopt_context>(&bad)) ==
                       FLASHOPT_ERROR_INVALID_HANDLE;
        ok = ok && std::strstr(flashopt_last_error(), "flashopt_context_destroy");
        if (!ok)
          _exit(3);
      }
    };
    static AtExit late;
    if (flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &late.ctx) != FLASHOPT_OK)
      _exit(2);
    (void)flashopt_last_error(); // the thread-local message exists
    std::exit(0);                // TLS destructors, then `late`
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
