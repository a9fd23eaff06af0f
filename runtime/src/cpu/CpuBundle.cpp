//===- CpuBundle.cpp - Loading a bundle's CPU kernel ----------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// CPU feature detection (the features of abi/CpuFeatures.def), kernel
/// choice, dlopen and symbol lookup. See CpuBundle.h.
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/CpuBundle.h"
#include "flashopt/abi/Files.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <exception>
#include <filesystem>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define FLASHOPT_HOST_X86 1
#endif

namespace flashopt::host {

namespace {

#ifdef FLASHOPT_HOST_X86
/// CPUID.1:ECX bit `bit` (for features not every compiler's
/// __builtin_cpu_supports knows).
bool cpuid1Ecx(unsigned bit) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return false;
  return (c >> bit) & 1u;
}
bool cpuidExt1Ecx(unsigned bit) {
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000001u, &a, &b, &c, &d))
    return false;
  return (c >> bit) & 1u;
}
#endif

} // namespace

bool host_supports_feature(std::string_view f) {
#ifdef FLASHOPT_HOST_X86
  __builtin_cpu_init();
  // Features every compiler's __builtin_cpu_supports knows.
#define FLASHOPT_CPU_FEATURE_BUILTIN(name)                                     \
  if (f == name)                                                               \
    return __builtin_cpu_supports(name) != 0;
#include "flashopt/abi/CpuFeatures.def"
  // The others: ask CPUID. F16C instructions use the AVX register state, so
  // the OS must enable AVX too.
  if (f == "f16c")
    return cpuid1Ecx(29) && __builtin_cpu_supports("avx");
  if (f == "movbe")
    return cpuid1Ecx(22);
  if (f == "lzcnt" || f == "abm")
    return cpuidExt1Ecx(5);
  return false;
#else
  (void)f;
  return false;
#endif
}

namespace {
std::string quote(const std::string &s) { return "\"" + s + "\""; }
} // namespace

Status check_kernel_abi(const Manifest &m, void *handle, const KernelEntry &k,
                        const std::string &mpath) {
  std::string abiSymbol = k.symbol + abi::kKernelAbiSymbolSuffix;
  const char *desc = static_cast<const char *>(dlsym(handle, abiSymbol.c_str()));
  if (!desc)
    return Status::error(Code::Format,
                         mpath + ": kernel " + quote(k.file) +
                             " has no ABI description (symbol " +
                             quote(abiSymbol) +
                             "); rebuild the bundle with this flashopt-gen");
  std::string have(desc, strnlen(desc, 65536));
  std::string expected = abi::kernel_abi_description(m);
  if (expected != have)
    return Status::error(
        Code::Format, mpath + ": the manifest disagrees with kernel " +
                          quote(k.file) + ": the kernel was compiled for \"" +
                          have + "\" but the manifest describes \"" + expected +
                          "\"");
  return Status::success();
}

Expected<size_t>
select_cpu_kernel(const Manifest &m, std::string_view forced,
                  std::string_view forced_from,
                  const std::function<bool(std::string_view)> &supports) {
  const std::string where = m.path.empty() ? m.name : m.path;
  std::vector<size_t> cpuKernels;
  std::string targets;
  for (size_t i = 0; i < m.kernels.size(); ++i) {
    targets += (targets.empty() ? "" : ", ") + m.kernels[i].target;
    if (m.kernels[i].target == "cpu" &&
        m.kernels[i].kind == abi::KernelKind::Step)
      cpuKernels.push_back(i);
  }
  if (cpuKernels.empty())
    return Status::error(Code::Unsupported,
                         where + ": field 'kernels': no CPU kernel (targets: " +
                             (targets.empty() ? std::string("none") : targets) +
                             ")");
  // The features of kernel `i` the host lacks ("" when it runs here).
  auto lacks = [&](size_t i) {
    std::string s;
    for (const std::string &f : m.kernels[i].features)
      if (!supports(f))
        s += (s.empty() ? "" : ", ") + f;
    return s;
  };
  if (!forced.empty()) {
    std::string available;
    for (size_t i : cpuKernels) {
      if (m.kernels[i].cpu != forced) {
        available += (available.empty() ? "" : ", ") + m.kernels[i].cpu;
        continue;
      }
      if (std::string missing = lacks(i); !missing.empty())
        return Status::error(
            Code::Unsupported,
            where + ": the " + quote(std::string(forced)) +
                " kernel (requested by " + std::string(forced_from) +
                ") needs CPU features this host lacks: " + missing);
      return i;
    }
    return Status::error(Code::Unsupported,
                         where + ": no CPU kernel for cpu " +
                             quote(std::string(forced)) + " (requested by " +
                             std::string(forced_from) +
                             "); the bundle has: " + available);
  }
  std::string why;
  for (size_t i : cpuKernels) {
    std::string missing = lacks(i);
    if (missing.empty())
      return i;
    why += "; " + m.kernels[i].cpu + " needs " + missing;
  }
  return Status::error(Code::Unsupported,
                       where + ": no CPU kernel runs on this host" + why);
}

CpuBundle::~CpuBundle() {
  for (void *h : extra_handles_)
    dlclose(h);
  if (handle_)
    dlclose(handle_);
}

void *CpuBundle::symbol(const std::string &name) const {
  return handle_ ? dlsym(handle_, name.c_str()) : nullptr;
}

Status CpuBundle::loadKernel(const KernelEntry &k, bool checkAbi,
                             void **handle, KernelFn *fn) const {
  const std::string mpath = dir_ + "/manifest.json";
  dlerror();
  *handle = dlopen(kernelPath(k).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!*handle) {
    const char *e = dlerror();
    // A kernel that cannot be read is Io; one that can but does not load
    // (not a shared object, another architecture) is a malformed bundle.
    const bool readable = ::access(kernelPath(k).c_str(), R_OK) == 0;
    return Status::error(readable ? Code::Format : Code::Io,
                         mpath + ": cannot load kernel " + quote(k.file) +
                             " (cpu " + k.cpu +
                             "): " + (e ? e : "dlopen failed"));
  }
  dlerror();
  void *sym = dlsym(*handle, k.symbol.c_str());
  if (!sym) {
    const char *e = dlerror();
    return Status::error(Code::Format,
                         mpath + ": kernel " + quote(k.file) +
                             " has no symbol " + quote(k.symbol) +
                             (e ? std::string(" (") + e + ")" : std::string()));
  }
  // The kernel's own description of what it reads (flashopt-gen emits it
  // next to the kernel): a manifest that disagrees with it (fewer
  // hyper-parameters, other buffers) would make the kernel read out of
  // bounds, so it is refused here, before anything runs.
  if (checkAbi)
    if (Status s = check_kernel_abi(manifest_, *handle, k, mpath); !s)
      return s;
  *fn = reinterpret_cast<KernelFn>(sym);
  return Status::success();
}

std::string CpuBundle::kernelPath(const KernelEntry &k) const {
  return (!k.file.empty() && k.file[0] == '/') ? k.file : dir_ + "/" + k.file;
}

Expected<std::shared_ptr<CpuBundle>>
CpuBundle::load(const std::string &dir, const CpuLoadOptions &opts) {
  try {
    Expected<Manifest> m = load_manifest(dir + "/manifest.json");
    if (!m)
      return m.status();
    std::string forced = opts.cpu, forcedFrom = "CpuLoadOptions::cpu";
    if (const char *env = std::getenv("FLASHOPT_CPU");
        forced.empty() && opts.use_env && env && *env)
      forced = env, forcedFrom = "FLASHOPT_CPU";
    Expected<size_t> chosen = select_cpu_kernel(
        *m, forced, forcedFrom,
        [](std::string_view f) { return host_supports_feature(f); });
    if (!chosen)
      return chosen.status();

    std::shared_ptr<CpuBundle> b(new CpuBundle());
    b->dir_ = dir;
    b->manifest_ = std::move(m.value());
    b->kernel_index_ = *chosen;
    const KernelEntry &k = b->kernel();
    b->kernel_path_ = b->kernelPath(k);
    if (Status s = b->loadKernel(k, opts.check_kernel_abi, &b->handle_, &b->fn_);
        !s)
      return s;
    // With an accumulator: the accumulation kernels of the same flavour.
    if (b->manifest_.accumulator)
      for (abi::KernelKind kind : abi::kKernelKinds) {
        if (kind == abi::KernelKind::Step)
          continue;
        const KernelEntry *e = b->manifest_.find_kernel(kind, "cpu", k.cpu);
        if (!e)
          return Status::error(Code::Format,
                               dir + "/manifest.json: field 'kernels': no " +
                                   abi::kernel_kind_name(kind) +
                                   " kernel for cpu " + quote(k.cpu) +
                                   " (a bundle with an accumulator has one per "
                                   "flavour)");
        void *h = nullptr;
        Status s = b->loadKernel(*e, opts.check_kernel_abi, &h,
                                 &b->extra_fns_[size_t(kind)]);
        if (h)
          b->extra_handles_.push_back(h);
        if (!s)
          return s;
      }
    return Expected<std::shared_ptr<CpuBundle>>(std::move(b));
  } catch (const std::exception &e) {
    return Status::from_exception(e, dir + ": ");
  }
}

std::vector<std::string> list_bundles(const std::string &dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto &e : std::filesystem::directory_iterator(dir, ec))
    if (std::filesystem::is_regular_file(e.path() / "manifest.json", ec))
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

} // namespace flashopt::host
