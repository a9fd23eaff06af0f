//===- BundleDriverTest.cpp - the bundle driver library -------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Calls lib/Driver directly, without flashopt-gen: a CPU-only bundle of a
/// shipped spec, the manifest description of quantized and plain states,
/// kernel IR, and the errors the driver returns instead of exiting.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Driver/BundleDriver.h"
#include "flashopt/Target/PTX.h"
#include "flashopt/InitAll.h"

#include "mlir/IR/MLIRContext.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace flashopt;

namespace {

std::string specPath(const std::string &name) {
  return std::string(FLASHOPT_DRIVER_SOURCE_DIR) + "/specs/" + name + ".json";
}

/// A context with every dialect flashopt-gen uses.
struct DriverContext {
  mlir::DialectRegistry registry;
  mlir::MLIRContext ctx;

  DriverContext() : ctx(makeRegistry(registry)) {
    ctx.loadAllAvailableDialects();
    ctx.printOpOnDiagnostic(false);
  }

  static mlir::DialectRegistry &makeRegistry(mlir::DialectRegistry &r) {
    registerAllDialects(r);
    return r;
  }
};

/// A fresh directory, removed at the end of the test.
struct TempDir {
  llvm::SmallString<128> path;
  TempDir() {
    std::error_code ec =
        llvm::sys::fs::createUniqueDirectory("flashopt-driver-test", path);
    REQUIRE_MESSAGE(!ec, ec.message());
  }
  ~TempDir() { llvm::sys::fs::remove_directories(path); }
};

/// Loads the one job of a spec, failing the test on any error.
driver::CompileJob loadSpec(mlir::MLIRContext &ctx, const std::string &name) {
  std::string diagnostics;
  llvm::raw_string_ostream os(diagnostics);
  auto jobs = driver::loadInput(ctx, specPath(name), os);
  REQUIRE_MESSAGE(static_cast<bool>(jobs), diagnostics);
  REQUIRE(jobs->size() == 1);
  REQUIRE(!driver::verifyJob(jobs->front()));
  return std::move(jobs->front());
}

std::string errorMessage(llvm::Error err) {
  return llvm::toString(std::move(err));
}

} // namespace

TEST_CASE("a CPU-only bundle of sgd_f32 names its kernel in the manifest") {
  DriverContext c;
  driver::CompileJob job = loadSpec(c.ctx, "sgd_f32");
  CHECK(job.getName() == "sgd_f32");

  TempDir dir;
  driver::DriverOptions options;
  options.outputDir = dir.path.str().str();
  options.targets = std::vector<std::string>{"cpu"};
  // One flavour is enough here (the baseline on x86-64).
  options.cpus = std::vector<target::HostCPU>{target::defaultHostCPUs().back()};

  auto targets = driver::resolveTargets(job, options);
  REQUIRE_MESSAGE(static_cast<bool>(targets),
                  errorMessage(targets.takeError()));
  auto bundle = driver::buildBundle(job, *targets, options);
  REQUIRE_MESSAGE(static_cast<bool>(bundle), errorMessage(bundle.takeError()));

  llvm::SmallString<128> expectedDir(dir.path);
  llvm::sys::path::append(expectedDir, "sgd_f32");
  CHECK(bundle->directory == expectedDir.str().str());
  const abi::Manifest &info = bundle->manifest;
  CHECK(info.name == "sgd_f32");
  REQUIRE(info.kernels.size() == 1);
  CHECK(info.kernels[0].target == "cpu");
  CHECK(info.kernels[0].symbol == "sgd_f32");

  llvm::SmallString<128> manifestPath(bundle->directory), soPath(manifestPath);
  llvm::sys::path::append(manifestPath, "manifest.json");
  llvm::sys::path::append(soPath, info.kernels[0].file);
  CHECK(llvm::sys::fs::exists(soPath));
  auto manifest = llvm::MemoryBuffer::getFile(manifestPath);
  REQUIRE_MESSAGE(static_cast<bool>(manifest), manifestPath.str().str());
  CHECK((*manifest)->getBuffer().contains("\"sgd_f32\""));
  CHECK((*manifest)->getBuffer() == abi::write_manifest(info));
  // No temporary directory is left behind.
  llvm::SmallString<128> tmpDir(dir.path);
  llvm::sys::path::append(tmpDir, ".sgd_f32.tmp");
  CHECK(!llvm::sys::fs::exists(tmpDir));
}

TEST_CASE("the manifest describes each state through its encoding") {
  DriverContext c;
  driver::CompileJob job = loadSpec(c.ctx, "adamw_bf16_m24_f32states");
  driver::CompileJob quantized = loadSpec(c.ctx, "adamw_bf16_m24");

  // Only the quantized encoding reduces over the group.
  auto kernelIR = [](const driver::CompileJob &j) {
    auto text = driver::emitKernelIRText(j);
    REQUIRE(static_cast<bool>(text));
    return *text;
  };
  CHECK(kernelIR(quantized).find("flashopt.group_max") != std::string::npos);
  CHECK(kernelIR(job).find("flashopt.group_max") == std::string::npos);

  TempDir dir;
  driver::DriverOptions options;
  options.outputDir = dir.path.str().str();
  auto bundle = driver::buildBundle(quantized, {}, options);
  REQUIRE_MESSAGE(static_cast<bool>(bundle), errorMessage(bundle.takeError()));
  const abi::Manifest &info = bundle->manifest;
  CHECK(info.kernels.empty());
  REQUIRE(info.states.size() == 2);
  CHECK(info.states[0].name == "exp_avg");
  CHECK(info.states[0].kind == abi::StateKind::Quantized);
  CHECK(info.states[0].storage == abi::DType::I8);
  // The bounded numerics' minifloat codes (docs/NUMERICS.md §2d).
  CHECK(info.states[0].compand == "softsign");
  CHECK(info.states[0].scale == abi::DType::BF16);
  CHECK(info.states[0].group == 32);
  CHECK(info.states[1].kind == abi::StateKind::Quantized);
  CHECK(info.states[1].storage == abi::DType::U8);
  CHECK(info.states[1].compand == "e4m4");
  CHECK(info.states[1].scale == abi::DType::BF16);
  // FlashOptim's numerics keep its softsign and sqrt codes with f16 scales.
  auto flash = driver::buildBundle(
      loadSpec(c.ctx, "adamw_bf16_m24_flashoptim"), {}, options);
  REQUIRE_MESSAGE(static_cast<bool>(flash), errorMessage(flash.takeError()));
  CHECK(flash->manifest.states[0].compand == "softsign");
  CHECK(flash->manifest.states[0].scale == abi::DType::F16);
  CHECK(flash->manifest.states[1].compand == "sqrt");
  CHECK(flash->manifest.states[1].scale == abi::DType::F16);
  std::vector<std::string> bufferNames;
  for (const abi::BufferSpec &b : info.buffers)
    bufferNames.push_back(b.name);
  CHECK(bufferNames ==
        std::vector<std::string>{"param", "correction", "grad", "exp_avg.codes",
                                 "exp_avg.scales", "exp_avg_sq.codes",
                                 "exp_avg_sq.scales"});

  auto plain = driver::buildBundle(job, {}, options);
  REQUIRE_MESSAGE(static_cast<bool>(plain), errorMessage(plain.takeError()));
  REQUIRE(plain->manifest.states.size() == 2);
  CHECK(plain->manifest.states[0].kind == abi::StateKind::Plain);
  CHECK(plain->manifest.states[0].storage == abi::DType::F32);
  CHECK(plain->manifest.states[0].compand.empty());
}

TEST_CASE("errors are returned, not printed or exited on") {
  DriverContext c;
  driver::CompileJob job = loadSpec(c.ctx, "sgd_f32");

  SUBCASE("an unknown target") {
    driver::DriverOptions options;
    options.targets = std::vector<std::string>{"cpu", "sm_42"};
    auto targets = driver::resolveTargets(job, options);
    REQUIRE(!targets);
    CHECK(errorMessage(targets.takeError()) ==
          "unknown target 'sm_42' (supported: cpu, sm_80, sm_90, sm_100)");
    std::string out;
    llvm::raw_string_ostream os(out);
    auto result = driver::compile(job, options, os);
    REQUIRE(!result);
    CHECK(errorMessage(result.takeError()).find("sm_42") != std::string::npos);
    CHECK(out.empty());
  }

  SUBCASE("a spec that does not exist is reported to the diagnostics stream") {
    std::string diagnostics;
    llvm::raw_string_ostream os(diagnostics);
    auto jobs = driver::loadInput(c.ctx, specPath("does_not_exist"), os);
    REQUIRE(!jobs);
    bool reported = false;
    llvm::handleAllErrors(jobs.takeError(), [&](const driver::ReportedError &) {
      reported = true;
    });
    CHECK(reported);
    CHECK(diagnostics.find("does_not_exist.json") != std::string::npos);
  }

  SUBCASE("a dialect file without an optimizer") {
    TempDir dir;
    llvm::SmallString<128> path(dir.path);
    llvm::sys::path::append(path, "empty.mlir");
    {
      std::error_code ec;
      llvm::raw_fd_ostream file(path, ec);
      REQUIRE(!ec);
      file << "module {}\n";
    }
    std::string diagnostics;
    llvm::raw_string_ostream os(diagnostics);
    auto jobs = driver::loadInput(c.ctx, path, os);
    REQUIRE(!jobs);
    CHECK(errorMessage(jobs.takeError()) ==
          (path + ": no flashopt.optimizer found").str());
  }
}

TEST_CASE("a GPU kernel that spills with the full-warp body is built "
          "without it") {
  // flashopt-to-gpu{full-warp-path}: the group body twice, unpredicated for
  // warps of full vectors (a redux.sync decides). AdamW with fp32
  // parameters and states spills on sm_100 at its 64 registers with the
  // second copy (16-32 bytes with ptxas 13); the bundle then carries the
  // single predicated body, with no spills, and sm_90 keeps both copies.
  if (!target::findPtxas()) {
    MESSAGE("skipped: needs ptxas (the CUDA toolkit) to see the spills");
    return;
  }
  DriverContext c;
  driver::CompileJob job = loadSpec(c.ctx, "adamw_f32_f32states");
  TempDir dir;
  driver::DriverOptions options;
  options.outputDir = dir.path.str().str();
  options.targets = std::vector<std::string>{"sm_90", "sm_100"};
  auto targets = driver::resolveTargets(job, options);
  REQUIRE_MESSAGE(static_cast<bool>(targets),
                  errorMessage(targets.takeError()));
  auto bundle = driver::buildBundle(job, *targets, options);
  REQUIRE_MESSAGE(static_cast<bool>(bundle), errorMessage(bundle.takeError()));
  auto ptxOf = [&](const std::string &chip) {
    for (const abi::KernelEntry &k : bundle->manifest.kernels)
      if (k.target == chip) {
        CHECK(k.spill_stores == 0);
        CHECK(k.spill_loads == 0);
        llvm::SmallString<128> p(bundle->directory);
        llvm::sys::path::append(p, k.file);
        auto text = llvm::MemoryBuffer::getFile(p);
        REQUIRE_MESSAGE(static_cast<bool>(text), p.str().str());
        return (*text)->getBuffer().str();
      }
    FAIL("no kernel for " << chip);
    return std::string();
  };
  CHECK(llvm::StringRef(ptxOf("sm_90")).contains("redux.sync.and.b32"));
  CHECK_FALSE(llvm::StringRef(ptxOf("sm_100")).contains("redux.sync"));
  // The single-kernel --emit=ptx stage chooses the same.
  std::string out;
  llvm::raw_string_ostream os(out);
  options.targets = std::vector<std::string>{"sm_100"};
  options.emit = driver::EmitStage::PTX;
  auto ptx = driver::compile(job, options, os);
  REQUIRE_MESSAGE(static_cast<bool>(ptx), errorMessage(ptx.takeError()));
  CHECK(llvm::StringRef(out).contains(".entry"));
  CHECK_FALSE(llvm::StringRef(out).contains("redux.sync"));
}
