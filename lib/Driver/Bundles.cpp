//===- Bundles.cpp - a job to a bundle directory --------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// describeBundle and buildBundle: the manifest of a job, then each of its
/// kernels built for each target into a staging directory (buildCpuKernel,
/// buildGpuKernel), the manifest written last and the directory renamed
/// into place.
///
//===----------------------------------------------------------------------===//

#include "DriverSupport.h"

#include "flashopt/Conversion/Passes.h"
#include "flashopt/Dialect/FlashOpt/IR/StateEncodingInterface.h"
#include "flashopt/Target/PTX.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

using namespace mlir;
using namespace mlir::flashopt;
using namespace ::flashopt;
using namespace ::flashopt::driver;
using namespace ::flashopt::driver::detail;

namespace {

/// Whether `kernel`'s buffers are exactly `m`'s (the ones the kernel ABI
/// implies), else an internal error naming the first difference.
llvm::Error checkKernelBuffers(KernelOp kernel, const abi::Manifest &m) {
  auto buffers = kernel.getBuffers();
  auto render = [](llvm::StringRef name, llvm::StringRef dtype, bool perGroup,
                   bool writable) {
    return (name + " (" + dtype + (perGroup ? ", per group" : ", per element") +
            (writable ? ", readwrite)" : ", read)"))
        .str();
  };
  for (size_t i = 0; i < std::max<size_t>(buffers.size(), m.buffers.size());
       ++i) {
    std::string have = "nothing", want = "nothing";
    if (i < buffers.size()) {
      auto b = cast<BufferAttr>(buffers[i]);
      have = render(b.getName(), storageTypeName(b.getElementType()),
                    b.getRate() == BufferRate::group,
                    b.getAccess() == BufferAccess::readwrite);
    }
    if (i < m.buffers.size()) {
      const abi::BufferSpec &e = m.buffers[i];
      want = render(e.name, abi::dtype_name(e.dtype), e.per == abi::Per::Group,
                    e.writable);
    }
    if (have != want)
      return makeError("internal error: buffer " + std::to_string(i) + " of " +
                       m.name + " is " + have + " in the kernel but " + want +
                       " in the kernel ABI");
  }
  return llvm::Error::success();
}

/// The staging directory <outputDir>/.<name>.tmp a bundle is written into,
/// then renamed to <outputDir>/<name> whole (commit); removed on
/// destruction unless committed, so a failed build leaves nothing behind.
class StagingDir {
public:
  StagingDir(const std::string &outputDir, const std::string &name)
      : outputDir_(outputDir), final_(outputDir), tmp_(outputDir) {
    llvm::sys::path::append(final_, name);
    llvm::sys::path::append(tmp_, "." + name + ".tmp");
  }
  StagingDir(const StagingDir &) = delete;
  StagingDir &operator=(const StagingDir &) = delete;
  ~StagingDir() {
    if (created_)
      llvm::sys::fs::remove_directories(tmp_);
  }

  /// Creates the output directory and an empty staging directory.
  llvm::Error create() {
    if (std::error_code ec = llvm::sys::fs::create_directories(outputDir_))
      return makeError("cannot create " + outputDir_ + ": " + ec.message());
    llvm::sys::fs::remove_directories(tmp_);
    if (std::error_code ec = llvm::sys::fs::create_directories(tmp_))
      return makeError("cannot create " + tmp_ + ": " + ec.message());
    created_ = true;
    return llvm::Error::success();
  }

  /// The path of file `name` in the staging directory.
  std::string file(const llvm::Twine &name) const {
    llvm::SmallString<256> path(tmp_);
    llvm::sys::path::append(path, name);
    return path.str().str();
  }

  /// Replaces <outputDir>/<name> with the staging directory; its path.
  llvm::Expected<std::string> commit() {
    llvm::sys::fs::remove_directories(final_);
    if (std::error_code ec = llvm::sys::fs::rename(tmp_, final_))
      return makeError("cannot move the bundle into " + final_ + ": " +
                       ec.message());
    created_ = false;
    return final_.str().str();
  }

private:
  std::string outputDir_;
  llvm::SmallString<256> final_, tmp_;
  bool created_ = false;
};

/// One kernel of a bundle: its job (jobForKernel), kind and symbol.
struct KernelJob {
  CompileJob job;
  abi::KernelKind kind;
  std::string symbol;
};

/// One job per kernel of `job`'s bundle (the step; with an accumulator also
/// accumulate, step_accumulated and step_fused): each kernel is its own
/// file with its own ABI description (the same: one table for all).
std::vector<KernelJob> kernelJobs(const CompileJob &job) {
  std::vector<KernelJob> kernels;
  for (abi::KernelKind kind : kernelKinds(job))
    kernels.push_back({jobForKernel(job, kind), kind,
                       job.getName().str() + abi::kernel_kind_suffix(kind)});
  return kernels;
}

/// Builds `k` for `cpu` into <symbol>.<cpu>.so in `dir`: the kernel's
/// object linked with its ABI description, a data symbol next to the
/// kernel (its own object: the kernel's code is untouched), which the
/// runtime checks against the manifest it is given.
llvm::Expected<abi::KernelEntry> buildCpuKernel(const KernelJob &k,
                                                const target::HostCPU &cpu,
                                                const abi::Manifest &info,
                                                const StagingDir &dir) {
  auto cpuModule = lowerToHostLLVM(
      k.job, cpu, "lowering " + k.symbol + " to the CPU failed");
  if (!cpuModule)
    return cpuModule.takeError();
  auto obj = target::emitHostObject(**cpuModule, cpu);
  if (!obj)
    return obj.takeError();
  auto abiObj =
      target::emitDataObject(cpu, k.symbol + abi::kKernelAbiSymbolSuffix,
                             abi::kernel_abi_description(info));
  if (!abiObj)
    return abiObj.takeError();
  std::string base = k.symbol + "." + cpu.name;
  std::string objPath = dir.file(base + ".o"),
              abiPath = dir.file(base + ".abi.o");
  if (auto err = writeFile(objPath, *obj))
    return std::move(err);
  if (auto err = writeFile(abiPath, *abiObj))
    return std::move(err);
  if (auto err =
          target::linkSharedObject(objPath, dir.file(base + ".so"), {abiPath}))
    return std::move(err);
  llvm::sys::fs::remove(objPath);
  llvm::sys::fs::remove(abiPath);
  abi::KernelEntry e;
  e.target = "cpu";
  e.cpu = cpu.name;
  e.features = cpu.requires_;
  e.file = base + ".so";
  e.symbol = k.symbol;
  e.kind = k.kind;
  return e;
}

/// The elements per thread of `job`'s kernel for `chip`, as
/// flashopt-to-gpu sees the kernel, so that the manifest states what the
/// PTX really handles.
llvm::Expected<int> gpuKernelElementsPerThread(const CompileJob &job,
                                               llvm::StringRef chip,
                                               const DriverOptions &options) {
  OwningOpRef<ModuleOp> module = cloneModule(job);
  KernelKind kind = dialectKernelKind(job.kernelKind);
  if (failed(runPasses(*module, [kind](OpPassManager &pm) {
        buildGPUPreLoweringPipeline(pm, kind);
      })))
    return makeError("preparing " + job.getName() + " for the GPU failed");
  return int(gpuElementsPerThread(*(*module).getOps<KernelOp>().begin(),
                                  options.gpuBytesPerThread,
                                  gpuHeavyBudget(chip), gpuWideBudget(chip)));
}

/// Builds `k` for `chip` into <symbol>.<chip>.ptx in `dir` (and, with
/// `ptxas`, <symbol>.<chip>.cubin), the kernel's ABI description a
/// module-scope global after the PTX header (the PTX and the cubin ptxas
/// makes of it both carry it), which the runtime checks against the
/// manifest it is given, as for the CPU.
llvm::Expected<abi::KernelEntry>
buildGpuKernel(const KernelJob &k, const std::string &chip,
               const abi::Manifest &info, const DriverOptions &options,
               const std::optional<std::string> &ptxas, const StagingDir &dir) {
  // The PTX with the ABI global and, with ptxas, its cubin. The unpredicated
  // copy of the body for full warps and its shared base addresses
  // (flashopt-to-gpu{full-warp-path,shared-bases}) raise register pressure:
  // where ptxas spills, the next shape of the ladder is tried (without
  // ptxas, the PTX keeps the first: nothing says it spills).
  using Built = std::pair<std::string, std::optional<target::PtxasResult>>;
  auto built = pickGpuShape<Built>(
      options, ptxas.has_value(),
      [&](const DriverOptions &opts) -> llvm::Expected<std::pair<Built, int>> {
        auto ptx = emitPTXText(k.job, chip, opts);
        if (!ptx)
          return ptx.takeError();
        size_t header = ptx->find(".address_size");
        size_t eol =
            header == std::string::npos ? header : ptx->find('\n', header);
        if (eol == std::string::npos)
          return makeError("lowering " + k.job.getName() + " to " + chip +
                           ": the PTX has no .address_size line");
        ptx->insert(eol + 1,
                    "\n" + abi::ptx_kernel_abi_global(
                               k.symbol, abi::kernel_abi_description(info)));
        std::optional<target::PtxasResult> assembled;
        int spills = 0;
        if (ptxas) {
          auto a = target::runPtxas(*ptxas, *ptx, chip);
          if (!a)
            return a.takeError();
          spills = std::max(0, a->spillStores) + std::max(0, a->spillLoads);
          assembled = std::move(*a);
        }
        return std::make_pair(Built(std::move(*ptx), std::move(assembled)),
                              spills);
      });
  if (!built)
    return built.takeError();
  std::string &ptx = built->first;
  std::string base = k.symbol + "." + chip;
  if (auto err = writeFile(dir.file(base + ".ptx"), ptx))
    return std::move(err);
  abi::KernelEntry e;
  e.target = chip;
  e.file = base + ".ptx";
  e.symbol = k.symbol;
  e.kind = k.kind;
  e.threads_per_block = abi::kGpuThreadsPerBlock;
  auto elements = gpuKernelElementsPerThread(k.job, chip, options);
  if (!elements)
    return elements.takeError();
  e.elements_per_thread = *elements;
  if (const auto &assembled = built->second) {
    if (auto err = writeFile(dir.file(base + ".cubin"), assembled->cubin))
      return std::move(err);
    e.cubin = base + ".cubin";
    e.registers = int(assembled->registers);
    e.spill_stores = int(assembled->spillStores);
    e.spill_loads = int(assembled->spillLoads);
  }
  return e;
}

} // namespace

llvm::Expected<abi::Manifest> driver::describeBundle(const CompileJob &job,
                                                     KernelOp kernel) {
  abi::Manifest m;
  m.generator = std::string("flashopt-gen ") + abi::kFlashOptVersion;
  m.name = kernel.getSymName().str();
  m.spec = job.specPath;
  m.spec_hash = job.specHash;
  m.rule = job.rule;
  m.description = job.description;
  m.group_size = kernel.getGroupSize();
  OptimizerOp optimizer = job.optimizer;
  MasterAttr master = optimizer.getParam();
  m.param = *storageDType(master.getParamType());
  if (master.hasCorrection())
    m.correction = *storageDType(master.getCorrection());
  m.grad = *storageDType(optimizer.getGrad());
  m.arithmetic = stringifyArithmetic(optimizer.getArithmetic()).str();
  m.numerics = stringifyNumerics(optimizer.getNumerics()).str();
  if (MasterAttr acc = optimizer.getAccumulateAttr()) {
    abi::AccumulatorSpec a;
    a.dtype = *storageDType(acc.getParamType());
    if (acc.hasCorrection())
      a.correction = *storageDType(acc.getCorrection());
    m.accumulator = a;
  }
  for (HyperOp h : getHypers(kernel)) {
    abi::HyperSpec mh;
    mh.name = h.getName().str();
    if (auto d = h.getDefaultValueAttr())
      mh.default_value = d.getValueAsDouble();
    if (auto e = h.getEnvelope()) {
      mh.envelope = stringifyEnvelope(*e).str();
      mh.envelope_of = h.getEnvelopeOf()->str();
    }
    m.hypers.push_back(mh);
  }
  for (StateOp s : getStates(optimizer)) {
    abi::StateSpec ms;
    ms.name = s.getName().str();
    s.getEncoding().describeInManifest(ms);
    if (auto e = s.getElidable())
      ms.elidable_if_zero = e->str();
    m.states.push_back(ms);
  }
  // The buffers, table layout and bytes follow from the ABI; the expanded
  // kernel must agree with it buffer for buffer.
  abi::complete_manifest(m);
  if (auto err = checkKernelBuffers(kernel, m))
    return std::move(err);
  return m;
}

llvm::Expected<BundleResult>
driver::buildBundle(const CompileJob &job,
                    const std::vector<std::string> &targets,
                    const DriverOptions &options) {
  auto kernelModule = expandEncodings(job);
  if (!kernelModule)
    return kernelModule.takeError();
  KernelOp kernel = *(*kernelModule)->getOps<KernelOp>().begin();
  auto described = describeBundle(job, kernel);
  if (!described)
    return described.takeError();
  abi::Manifest info = std::move(*described);
  StagingDir dir(options.outputDir, job.getName().str());
  if (auto err = dir.create())
    return std::move(err);
  std::vector<KernelJob> kernels = kernelJobs(job);

  if (llvm::is_contained(targets, "cpu"))
    for (const target::HostCPU &cpu : resolveHostCPUs(options))
      for (const KernelJob &k : kernels) {
        auto entry = buildCpuKernel(k, cpu, info, dir);
        if (!entry)
          return entry.takeError();
        info.kernels.push_back(std::move(*entry));
      }
  std::optional<std::string> ptxas;
  if (options.runPtxas)
    ptxas = target::findPtxas();
  for (const std::string &chip : targets) {
    if (chip == "cpu")
      continue;
    for (const KernelJob &k : kernels) {
      auto entry = buildGpuKernel(k, chip, info, options, ptxas, dir);
      if (!entry)
        return entry.takeError();
      info.kernels.push_back(std::move(*entry));
    }
  }

  if (auto err =
          writeFile(dir.file("manifest.json"), abi::write_manifest(info)))
    return std::move(err);
  auto finalDir = dir.commit();
  if (!finalDir)
    return finalDir.takeError();
  return BundleResult{std::move(*finalDir), std::move(info)};
}
