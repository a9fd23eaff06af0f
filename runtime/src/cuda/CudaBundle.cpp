//===- CudaBundle.cpp -----------------------------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Kernel selection, launch geometry, module loading (cubin, PTX fallback).
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/CudaBundle.h"
#include "flashopt/abi/Files.h"
#include "flashopt/host/CpuBundle.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <sstream>
#include <sys/stat.h>

namespace flashopt::host {

using namespace cu;

bool parse_sm_target(std::string_view target, int *chip, bool *arch_specific) {
  if (target.size() < 4 || target.substr(0, 3) != "sm_")
    return false;
  std::string_view rest = target.substr(3);
  bool suffix = false;
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) {
    suffix = true;
    rest.remove_suffix(1);
  }
  if (rest.empty() || rest.size() > 4)
    return false;
  int v = 0;
  for (char c : rest) {
    if (c < '0' || c > '9')
      return false;
    v = v * 10 + (c - '0');
  }
  if (chip)
    *chip = v;
  if (arch_specific)
    *arch_specific = suffix;
  return true;
}

Expected<GpuKernelChoice>
select_gpu_kernel(const Manifest &m, int cc_major, int cc_minor,
                  const std::function<bool(const std::string &)> &file_exists) {
  const int device = cc_major * 10 + cc_minor;
  const std::string sm = "sm_" + std::to_string(device);
  const std::string where = (m.path.empty() ? m.name : m.path);
  auto exists = [&](const std::string &f) {
    return !f.empty() && (!file_exists || file_exists(f));
  };
  std::string targets;
  std::optional<size_t> exact, bestPtx;
  int bestChip = -1;
  for (size_t i = 0; i < m.kernels.size(); ++i) {
    const KernelEntry &k = m.kernels[i];
    if (k.kind != abi::KernelKind::Step)
      continue; // the other kinds come with the step's target
    int chip = 0;
    bool specific = false;
    if (!parse_sm_target(k.target, &chip, &specific))
      continue;
    targets += (targets.empty() ? "" : ", ") + k.target;
    if (chip == device && !exact && exists(k.cubin))
      exact = i;
    bool runs = specific ? chip == device : chip <= device;
    // Prefer the plain target over an arch-specific one of the same chip.
    if (runs && exists(k.file) &&
        (chip > bestChip || (chip == bestChip && !specific)))
      bestPtx = i, bestChip = chip;
  }

  GpuKernelChoice c;
  if (exact) {
    const KernelEntry &k = m.kernels[*exact];
    c.kernel_index = *exact;
    c.use_cubin = true;
    c.image = k.cubin;
    if (exists(k.file))
      c.ptx_fallback = k.file;
    c.reason = k.target + " cubin for " + sm;
  } else if (bestPtx) {
    const KernelEntry &k = m.kernels[*bestPtx];
    c.kernel_index = *bestPtx;
    c.use_cubin = false;
    c.image = k.file;
    c.reason = k.target + " PTX, JIT-compiled for " + sm +
               (bestChip == device ? " (no cubin for this chip)" : "");
  } else {
    return Status::error(
        Code::Unsupported,
        where + ": no GPU kernel for " + sm + " (compute capability " +
        std::to_string(cc_major) + "." + std::to_string(cc_minor) + "): " +
        (targets.empty() ? std::string("the bundle has no GPU kernels")
                         : "the bundle has " + targets +
                               "; a PTX kernel runs only on its own chip or a "
                               "newer one, a cubin only on its own chip"));
  }
  const KernelEntry &k = m.kernels[c.kernel_index];
  c.target = k.target;
  parse_sm_target(k.target, &c.chip, nullptr);
  c.symbol = k.symbol;
  if (c.symbol.empty())
    return Status::error(Code::Format,
                         where + ": the " + k.target + " kernel has no symbol");
  c.threads_per_block = k.threads_per_block > 0 ? k.threads_per_block : 256;
  if (c.threads_per_block != 256)
    return Status::error(
        Code::Format, where + ": the " + k.target + " kernel was built for " +
                          std::to_string(c.threads_per_block) +
                          " threads per block; this runtime launches 256");
  c.elements_per_thread = k.elements_per_thread;
  return c;
}

int64_t gpu_grid_size(int64_t total_groups, int64_t group_size,
                      int elements_per_thread, int threads_per_block,
                      int sm_count, int blocks_per_sm) {
  if (total_groups <= 0)
    return 0;
  const int64_t warp = 32;
  int64_t G = std::max<int64_t>(1, group_size);
  int64_t width = elements_per_thread > 0 ? elements_per_thread : 4;
  width = std::max<int64_t>(1, std::min<int64_t>(width, G));
  int64_t lanesPerGroup =
      std::max<int64_t>(1, std::min<int64_t>(warp, G / width));
  int64_t groupsPerWarp = warp / lanesPerGroup;
  int64_t warps = (total_groups + groupsPerWarp - 1) / groupsPerWarp;
  int64_t tpb = std::max<int64_t>(warp, threads_per_block);
  int64_t blocks = (warps * warp + tpb - 1) / tpb;
  int64_t cap = int64_t(std::max(1, sm_count)) * std::max(1, blocks_per_sm);
  return std::max<int64_t>(1, std::min(blocks, cap));
}

//===----------------------------------------------------------------------===//
// CudaBundle
//===----------------------------------------------------------------------===//

namespace {

bool fileExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string joinPath(const std::string &dir, const std::string &file) {
  return (!file.empty() && file[0] == '/') ? file : dir + "/" + file;
}

Expected<std::string> readFile(const std::string &path) {
  // PTX and cubins are a few MiB; 1 GiB bounds a mistaken or endless file.
  std::string text, reason;
  abi::FileError e =
      abi::read_regular_file(path, uint64_t(1) << 30, text, reason);
  if (e != abi::FileError::None)
    return Status::error(e == abi::FileError::TooLarge ? Code::Format
                                                       : Code::Io,
                         path + ": " + reason);
  return text;
}

std::string trimLog(const char *log) {
  std::string s(log);
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\0' || s.back() == ' '))
    s.pop_back();
  return s;
}

} // namespace

Expected<std::shared_ptr<CudaBundle>>
CudaBundle::load(std::shared_ptr<CudaContext> ctx, const std::string &dir) {
  if (!ctx)
    return Status::error(Code::InvalidArgument,
                         "CudaBundle::load: null context");
  try {
    Expected<Manifest> m = load_manifest(dir + "/manifest.json");
    if (!m)
      return m.status();
    const CudaDeviceInfo &info = ctx->info();
    Expected<GpuKernelChoice> choice = select_gpu_kernel(
        *m, info.cc_major, info.cc_minor,
        [&](const std::string &f) { return fileExists(joinPath(dir, f)); });
    if (!choice)
      return choice.status();

    std::shared_ptr<CudaBundle> b(new CudaBundle());
    b->ctx_ = ctx;
    b->dir_ = dir;
    b->manifest_ = std::move(m.value());
    b->choice_ = std::move(choice.value());
    const CudaDriver &d = ctx->driver();
    CudaContext::Scope scope(*ctx);
    if (!scope.ok())
      return scope.status();

    // Loads one image into *mod; a PTX image gets a NUL terminator and JIT
    // logs.
    auto loadImage = [&](const std::string &file, bool ptx, std::string *log,
                         CUmodule *out) -> Status {
      std::string path = joinPath(dir, file);
      Expected<std::string> bytes = readFile(path);
      if (!bytes)
        return bytes.status();
      // The image carries the ABI description of the manifest it was
      // compiled for (a PTX global, kept in the cubin): a manifest that
      // disagrees with it is refused before anything is loaded or run.
      std::optional<std::string> have = abi::find_kernel_abi_description(*bytes);
      if (!have)
        return Status::error(
            Code::Format, dir + "/manifest.json: kernel \"" + file +
                              "\" has no ABI description; rebuild the bundle "
                              "with this flashopt-gen");
      std::string expected = abi::kernel_abi_description(b->manifest_);
      if (*have != expected)
        return Status::error(Code::Format,
                             dir +
                                 "/manifest.json: the manifest disagrees "
                                 "with kernel \"" +
                                 file + "\": the kernel was compiled for \"" +
                                 *have + "\" but the manifest describes \"" +
                                 expected + "\"");
      if (ptx)
        bytes->push_back('\0');
      static constexpr size_t kLog = 16384;
      std::vector<char> info(kLog, 0), error(kLog, 0);
      int opts[4] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                     CU_JIT_ERROR_LOG_BUFFER,
                     CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
      void *vals[4] = {
          info.data(), reinterpret_cast<void *>(uintptr_t(kLog - 1)),
          error.data(), reinterpret_cast<void *>(uintptr_t(kLog - 1))};
      CUmodule mod = nullptr;
      CUresult r = d.cuModuleLoadDataEx(&mod, bytes->data(), 4, opts, vals);
      if (r != CUDA_SUCCESS) {
        std::string msg = path + ": cuModuleLoadDataEx: " + d.describe(r);
        std::string elog = trimLog(error.data());
        if (!elog.empty())
          msg += "\n" + elog;
        if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
          msg += " (the driver, CUDA " + cuda_version_string(d.version()) +
                 ", is older than the PTX ISA this kernel was written in)";
        return Status::error(Code::Cuda, msg);
      }
      *out = mod;
      *log = trimLog(info.data());
      return Status::success();
    };

    // Loads kernel `k` (the cubin when the choice is a cubin and `k` has
    // one, its PTX if that does not load) as kind `kind`.
    const GpuKernelChoice &c = b->choice_;
    auto loadKernel = [&](const KernelEntry &k, abi::KernelKind kind,
                          std::string *what) -> Status {
      Loaded &L = b->kinds_[size_t(kind)];
      const bool cubin = c.use_cubin && !k.cubin.empty() &&
                         fileExists(joinPath(dir, k.cubin));
      std::string log, file = cubin ? k.cubin : k.file;
      Status s = loadImage(file, !cubin, &log, &L.module);
      if (s) {
        *what = c.target + (cubin ? " cubin" : " PTX (JIT)");
      } else if (cubin && !k.file.empty()) {
        Status p = loadImage(k.file, true, &log, &L.module);
        // A driver failure of either load is a CUDA error.
        if (!p)
          return Status::error(s.code() == Code::Cuda ? s.code() : p.code(),
                               "cannot load the " + c.target + " " +
                               abi::kernel_kind_name(kind) + " kernel: " +
                               s.message() + "\nand its PTX: " + p.message());
        *what = c.target + " PTX (JIT; the cubin did not load: " +
                s.message() + ")";
        file = k.file;
      } else {
        return s;
      }
      if (!log.empty())
        *what += "\n" + log;
      s = d.check(d.cuModuleGetFunction(&L.fn, L.module, k.symbol.c_str()),
                  joinPath(dir, file) + ": cuModuleGetFunction(\"" +
                      k.symbol + "\")");
      if (!s)
        return s;
      int regs = -1;
      if (d.cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, L.fn) ==
          CUDA_SUCCESS)
        L.registers = regs;
      L.elements_per_thread = k.elements_per_thread;
      return Status::success();
    };

    const Manifest &man = b->manifest_;
    if (Status s = loadKernel(man.kernels[c.kernel_index],
                              abi::KernelKind::Step, &b->loaded_);
        !s)
      return s;
    // With an accumulator: the other kinds of the same target.
    if (man.accumulator) {
      for (abi::KernelKind kind : abi::kKernelKinds) {
        if (kind == abi::KernelKind::Step)
          continue;
        const KernelEntry *e = man.find_kernel(kind, c.target);
        if (!e)
          return Status::error(Code::Format,
                               dir + "/manifest.json: field 'kernels': no " +
                                   std::string(abi::kernel_kind_name(kind)) +
                                   " kernel for " + c.target +
                                   " (a bundle with an accumulator has one per "
                                   "target)");
        if (e->symbol.empty())
          return Status::error(Code::Format, dir + "/manifest.json: the " +
                                                 c.target + " " +
                                                 abi::kernel_kind_name(kind) +
                                                 " kernel has no symbol");
        std::string what;
        if (Status s = loadKernel(*e, kind, &what); !s)
          return s;
      }
    }
    return Expected<std::shared_ptr<CudaBundle>>(std::move(b));
  } catch (const std::exception &e) {
    return Status::from_exception(e, dir + ": ");
  }
}

CudaBundle::~CudaBundle() {
  if (!ctx_)
    return;
  CudaContext::Scope scope(*ctx_);
  if (!scope.ok())
    return;
  for (const Loaded &L : kinds_)
    if (L.module)
      ctx_->driver().cuModuleUnload(L.module);
}

} // namespace flashopt::host
