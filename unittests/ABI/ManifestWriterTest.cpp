//===- ManifestWriterTest.cpp - Writing manifests ---------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// abi/src/ManifestWriter.cpp against the reader: the compiler writes every
/// bundle's manifest with write_manifest and the runtime reads it with
/// parse_manifest, so a write → read → write round trip must give the same
/// bytes, for every shipped spec's manifest (build/kernels) and for
/// models built by hand (complete_manifest derives the buffers, the table
/// layout and the bytes per parameter).
///
//===----------------------------------------------------------------------===//

#include "flashopt/abi/Manifest.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

using namespace flashopt::abi;
namespace fs = std::filesystem;

namespace {

std::string readText(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// An AdamW-24 model as the compiler would describe it.
Manifest adamwModel() {
  Manifest m;
  m.generator = std::string("flashopt-gen ") + kFlashOptVersion;
  m.name = "adamw_like";
  m.spec = "specs/adamw_like.json";
  m.spec_hash = "0123456789abcdef";
  m.rule = "adamw";
  m.description = "a hand-made model";
  m.group_size = 32;
  m.param = DType::BF16;
  m.correction = DType::I8;
  m.grad = DType::BF16;
  m.hypers = {{"lr", std::nullopt}, {"beta1", 0.9}, {"eps", 1e-8}};
  StateSpec a{"exp_avg", StateKind::Quantized, DType::I8, 32, "softsign",
              DType::F16, ""};
  StateSpec v{"exp_avg_sq", StateKind::Quantized, DType::U8, 32, "sqrt",
              DType::F16, ""};
  StateSpec e{"momentum", StateKind::Elided, DType::F32, 0, "", DType::F32,
              "beta1"};
  m.states = {a, v, e};
  KernelEntry cpu;
  cpu.target = "cpu";
  cpu.cpu = "x86-64-v3";
  cpu.features = {"avx2", "fma"};
  cpu.file = "adamw_like.x86-64-v3.so";
  cpu.symbol = "adamw_like_step";
  KernelEntry gpu;
  gpu.target = "sm_90";
  gpu.file = "adamw_like.sm_90.ptx";
  gpu.symbol = "adamw_like_step";
  gpu.threads_per_block = kGpuThreadsPerBlock;
  gpu.elements_per_thread = 4;
  gpu.registers = 56;
  gpu.spill_stores = 0;
  gpu.spill_loads = 0;
  gpu.cubin = "adamw_like.sm_90.cubin";
  m.kernels = {cpu, gpu};
  complete_manifest(m);
  return m;
}

} // namespace

TEST_CASE("complete_manifest derives buffers, table layout and bytes") {
  Manifest m = adamwModel();
  REQUIRE(m.buffers.size() == 7);
  CHECK(m.buffers[0].name == "param");
  CHECK(m.buffers[1].role == BufferRole::Correction);
  CHECK(m.buffers[2].name == "grad");
  CHECK_FALSE(m.buffers[2].writable);
  CHECK(m.buffers[4].name == "exp_avg.scales");
  CHECK(m.buffers[4].per == Per::Group);
  CHECK(m.header_words == kTableHeaderWords);
  CHECK(m.record_words == kTableHeaderWords + 7);
  CHECK(m.bytes_per_param.total == doctest::Approx(7.125));
  CHECK(m.bytes_per_param.total_with_grad_release == doctest::Approx(5.125));
}

TEST_CASE("a hand-made model survives write, read, write") {
  Manifest m = adamwModel();
  std::string text = write_manifest(m);
  auto back = parse_manifest(text, "adamw_like/manifest.json");
  REQUIRE_MESSAGE(back.ok(), back.error());
  CHECK(back->name == m.name);
  CHECK(back->spec == m.spec);
  CHECK(back->description == m.description);
  CHECK(back->states.size() == 3);
  CHECK(back->states[2].kind == StateKind::Elided);
  CHECK(back->states[2].elidable_if_zero == "beta1");
  CHECK_FALSE(back->hypers[0].default_value.has_value());
  CHECK(*back->hypers[2].default_value == 1e-8); // exactly the number written
  CHECK(back->kernels[1].cubin == "adamw_like.sm_90.cubin");
  CHECK(back->kernels[1].registers == 56);
  CHECK(write_manifest(*back) == text);
}

TEST_CASE("every shipped manifest is rewritten byte for byte") {
  const std::string dir = FLASHOPT_KERNELS; // build/kernels
  int n = 0;
  for (const auto &e : fs::directory_iterator(dir)) {
    fs::path p = e.path() / "manifest.json";
    if (!fs::is_regular_file(p))
      continue;
    INFO(p.string());
    std::string text = readText(p);
    auto m = parse_manifest(text, p.string());
    REQUIRE_MESSAGE(m.ok(), m.error());
    CHECK(write_manifest(*m) == text);
    // The derived fields are what the compiler wrote.
    Manifest derived = *m;
    complete_manifest(derived);
    CHECK(write_manifest(derived) == text);
    ++n;
  }
  CHECK(n >= 26);
}

TEST_CASE("the dtype table: names, sizes and safetensors spellings") {
  for (DType t : {DType::BF16, DType::F16, DType::F32, DType::I8, DType::U8,
                  DType::I16}) {
    CHECK(parse_dtype(dtype_name(t)) == t);
    CHECK(parse_safetensors_dtype(dtype_safetensors_name(t)) == t);
  }
  CHECK(dtype_bits(DType::F32) == 32);
  CHECK(dtype_bits(DType::I16) == 16);
  CHECK(dtype_bytes(DType::F32, 3) == 12);
  // The packed 4-bit codes: two per byte, the odd tail's pad nibble a byte.
  for (DType t : {DType::I4, DType::U4}) {
    CHECK(dtype_bits(t) == 4);
    CHECK(dtype_is_packed(t));
    CHECK(dtype_bytes(t, 0) == 0);
    CHECK(dtype_bytes(t, 1) == 1);
    CHECK(dtype_bytes(t, 64) == 32);
    CHECK(dtype_bytes(t, 65) == 33);
    CHECK(std::string(dtype_safetensors_name(t)) == "U8");
    CHECK(parse_dtype(dtype_name(t)) == t);
  }
  CHECK_FALSE(dtype_is_packed(DType::U8));
  CHECK(std::string(dtype_name(DType::I4)) == "i4");
  CHECK(std::string(dtype_name(DType::U4)) == "ui4");
  CHECK(parse_safetensors_dtype("U8") == DType::U8);
  CHECK(std::string(dtype_name(DType::U8)) == "ui8");
  CHECK(std::string(dtype_safetensors_name(DType::U8)) == "U8");
  CHECK_FALSE(parse_dtype("f64").has_value());
  CHECK_FALSE(parse_safetensors_dtype("ui8").has_value());
}

TEST_CASE("every default CPU flavour names only known CPU features") {
  REQUIRE_FALSE(default_x86_cpu_flavours().empty());
  for (const CpuFlavour &f : default_x86_cpu_flavours())
    for (const std::string &feature : f.features) {
      INFO(f.cpu << " needs " << feature);
      CHECK(is_known_cpu_feature(feature));
    }
  CHECK(default_x86_cpu_flavours().front().cpu == "x86-64-v4");
  CHECK(default_x86_cpu_flavours().back().features.empty());
  CHECK_FALSE(is_known_cpu_feature("quantum-entanglement"));
}

TEST_CASE("the kernel ABI description is found in a PTX global, a cubin or a "
          "shared object, and nowhere else") {
  using flashopt::abi::find_kernel_abi_description;
  using flashopt::abi::ptx_kernel_abi_global;
  const std::string desc =
      "flashopt-kernel-abi 1; group_size 32; hypers lr,grad_scale; buffers "
      "param:bf16:element:readwrite; record_words 8";
  std::string ptx = ".version 7.8\n.target sm_90\n.address_size 64\n\n" +
                    ptx_kernel_abi_global("k", desc) +
                    "\n.visible .entry k(\n)\n{\n}\n";
  CHECK(ptx.find(".visible .global .align 1 .b8 k__abi[") != std::string::npos);
  CHECK(find_kernel_abi_description(ptx) == desc);
  // Raw bytes (a cubin's initialized data, a shared object's rodata).
  std::string raw = std::string("\x7f" "ELF", 4) + std::string(3, '\0') + desc +
                    std::string(1, '\0') + "more";
  CHECK(find_kernel_abi_description(raw) == desc);
  // None, a commented-out one, a malformed array, an unterminated string.
  CHECK_FALSE(find_kernel_abi_description(".visible .entry k()\n{\n}\n"));
  std::string commented = ptx;
  commented.replace(commented.find(".visible .global"), 0, "// ");
  CHECK_FALSE(find_kernel_abi_description(commented));
  CHECK_FALSE(find_kernel_abi_description(
      ".visible .global .align 1 .b8 k__abi[3] = {102,999,0};\n"));
  CHECK_FALSE(find_kernel_abi_description(
      ".visible .global .align 1 .b8 k__abi[3] = {102,x,0};\n"));
  CHECK_FALSE(find_kernel_abi_description("flashopt-kernel-abi 1; no NUL"));
  // Another global that is not the description is skipped.
  std::string two = ".global .align 4 .u32 other[1] = {7};\n" + ptx;
  CHECK(find_kernel_abi_description(two) == desc);
}

TEST_CASE("an accumulator: its buffers, bytes and kernel kinds survive a "
          "round trip, and a kind without one is refused") {
  Manifest m = adamwModel();
  m.accumulator = AccumulatorSpec{DType::BF16, DType::I8};
  KernelEntry acc = m.kernels[0];
  acc.kind = KernelKind::Accumulate;
  acc.symbol = "adamw_like" + kernel_kind_suffix(KernelKind::Accumulate);
  m.kernels.push_back(acc);
  complete_manifest(m);
  REQUIRE(m.buffers.size() == 9);
  CHECK(m.buffers[3].name == "accum");
  CHECK(m.buffers[3].role == BufferRole::Accum);
  CHECK(m.buffers[4].name == "accum_correction");
  CHECK(m.buffers[4].dtype == DType::I8);
  CHECK(m.bytes_per_param.accumulator == doctest::Approx(3.0));
  CHECK(m.bytes_per_param.total == doctest::Approx(10.125));
  std::string text = write_manifest(m);
  CHECK(text.find("\"kind\": \"accumulate\"") != std::string::npos);
  auto back = parse_manifest(text, "acc/manifest.json");
  REQUIRE_MESSAGE(back.ok(), back.error());
  REQUIRE(back->accumulator);
  CHECK(back->accumulator->correction == DType::I8);
  CHECK(back->kernels[2].kind == KernelKind::Accumulate);
  CHECK(back->find_kernel(KernelKind::Accumulate, "cpu", "x86-64-v3") !=
        nullptr);
  CHECK(back->find_kernel(KernelKind::StepFused, "cpu") == nullptr);
  CHECK(write_manifest(*back) == text);

  // Without the accumulator, the accumulate kernel is an error.
  Manifest plain = adamwModel();
  plain.kernels.push_back(acc);
  auto bad = parse_manifest(write_manifest(plain), "bad/manifest.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("needs an accumulator") != std::string::npos);
}
