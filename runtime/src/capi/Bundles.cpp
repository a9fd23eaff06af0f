//===- Bundles.cpp - Optimizers from bundle directories and embedded ones -===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Creating the optimizer of a context from a bundle directory (CPU or CUDA
/// backend), and unpacking an embedded bundle (flashopt_add_kernels EMBED)
/// into a private temporary directory first.
///
//===----------------------------------------------------------------------===//

#include "Bundles.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace flashopt::capi {

std::vector<const flashopt::abi::BufferSpec *> ownedBuffers(const Manifest &m) {
  std::vector<const flashopt::abi::BufferSpec *> out;
  for (const flashopt::abi::BufferSpec &b : m.buffers)
    if (b.role == flashopt::abi::BufferRole::Correction ||
        b.role == flashopt::abi::BufferRole::State)
      out.push_back(&b);
  return out;
}

/// Maps a bundle load failure to a status.
void bundleFailure(const std::string &dir, const Status &s) {
  int err = 0;
  if (!fileExists(dir, &err))
    fail(FLASHOPT_ERROR_NOT_FOUND,
         "bundle directory " + quote(dir) + ": " + std::strerror(err));
  if (!fileExists(dir + "/manifest.json", &err))
    fail(FLASHOPT_ERROR_NOT_FOUND, "bundle " + quote(dir) +
                                       " has no manifest.json (" +
                                       std::strerror(err) + ")");
  fail(s);
}

std::shared_ptr<OptObj> createOptimizer(const std::shared_ptr<ContextObj> &ctx,
                                        const std::string &dir) {
  auto o = std::make_shared<OptObj>();
  o->ctx = ctx;
  if (ctx->type == FLASHOPT_DEVICE_CPU) {
    CpuOptimizerOptions opts;
    {
      std::lock_guard<std::mutex> lock(ctx->mu);
      opts.threads = ctx->threads;
    }
    Expected<std::unique_ptr<CpuOptimizer>> cpu =
        CpuOptimizer::create(dir, {}, opts);
    if (!cpu)
      bundleFailure(dir, cpu.status());
    o->cpu = cpu.value().get();
    o->opt = std::move(cpu.value());
  } else {
    Expected<std::unique_ptr<CudaOptimizer>> gpu =
        CudaOptimizer::create(ctx->cuda, dir);
    if (!gpu)
      bundleFailure(dir, gpu.status());
    o->opt = std::move(gpu.value());
  }
  o->m = &o->opt->manifest();
  OptObj *self = o.get(); // owns the stepper
  o->stepper = std::make_unique<flashopt::train::Stepper>(
      *o->opt, [self](int64_t i) { return self->describe(i); });
  return o;
}

namespace {
/// A private temporary directory, removed with the object.
struct TempDir {
  std::string path;
  TempDir() {
    std::string base = std::filesystem::temp_directory_path().string();
    std::vector<char> tmpl(base.begin(), base.end());
    const char *suffix = "/flashopt-bundle-XXXXXX";
    tmpl.insert(tmpl.end(), suffix, suffix + std::strlen(suffix) + 1);
    if (!mkdtemp(tmpl.data())) {
      int err = errno;
      fail(FLASHOPT_ERROR_IO, std::string("cannot create a temporary "
                                          "directory in ") +
                                  base + ": " + std::strerror(err));
    }
    path = tmpl.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
} // namespace

std::shared_ptr<OptObj>
createEmbeddedOptimizer(const std::shared_ptr<ContextObj> &c,
                        const flashopt_embedded_bundle *bundle) {
  std::string name = bundle->name ? bundle->name : "(unnamed)";
  std::string who = "embedded bundle " + quote(name);
  if (bundle->abi_version != FLASHOPT_ABI_VERSION)
    fail(FLASHOPT_ERROR_UNSUPPORTED, who + " was built for ABI version " +
                                         std::to_string(bundle->abi_version) +
                                         ", this library is " +
                                         std::to_string(FLASHOPT_ABI_VERSION));
  if (bundle->num_files > 0 && !bundle->files)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT, who + ": files is NULL");
  TempDir tmp;
  bool manifest = false;
  for (size_t i = 0; i < bundle->num_files; ++i) {
    const flashopt_bundle_file &f = bundle->files[i];
    if (!f.path || !*f.path || (f.size > 0 && !f.data))
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           who + ": file " + std::to_string(i) + " has no path or data");
    std::filesystem::path rel(f.path);
    bool bad = rel.is_absolute();
    for (const auto &part : rel)
      if (part == "..")
        bad = true;
    if (bad)
      fail(FLASHOPT_ERROR_FORMAT,
           who + ": file path " + quote(f.path) + " leaves the bundle");
    if (rel == "manifest.json")
      manifest = true;
    std::filesystem::path full = std::filesystem::path(tmp.path) / rel;
    std::error_code ec;
    std::filesystem::create_directories(full.parent_path(), ec);
    std::ofstream os(full, std::ios::binary);
    os.write(static_cast<const char *>(f.data), std::streamsize(f.size));
    os.close();
    if (!os)
      fail(FLASHOPT_ERROR_IO, who + ": cannot write " + full.string());
  }
  if (!manifest)
    fail(FLASHOPT_ERROR_FORMAT, who + " has no manifest.json");
  return createOptimizer(c, tmp.path);
}

} // namespace flashopt::capi
