//===- SafetensorsTest.cpp - safetensors reading and writing tests ---------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Tests of runtime/src/safetensors/Safetensors.cpp: round trips of every dtype with
/// metadata, the header layout, one case per validation error of
/// File::read (files crafted byte by byte), the atomicity of write_file (a
/// failed write leaves an existing file byte-identical and no temporary file
/// behind), and, in the case "python interop" (skipped by default, run by
/// the ctest SafetensorsTests.python_interop), interoperability with
/// Python's `safetensors` through Inputs/safetensors_interop.py.
///
//===----------------------------------------------------------------------===//

#include "safetensors/Safetensors.h"

#include "flashopt/host/Float16.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using namespace flashopt::host;
using namespace flashopt::host::safetensors;
using json = nlohmann::json;

namespace {

/// This process's scratch directory, removed at exit.
fs::path scratchDir() {
  struct Scratch {
    fs::path path = fs::temp_directory_path() /
                    ("flashopt-safetensors-test-" + std::to_string(getpid()));
    Scratch() { fs::create_directories(path); }
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static Scratch scratch;
  return scratch.path;
}

/// A fresh, empty directory for one test.
fs::path freshDir(const std::string &name) {
  fs::path d = scratchDir() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<uint8_t> readBytes(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void writeBytes(const fs::path &p, const std::vector<uint8_t> &b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(b.data()), std::streamsize(b.size()));
}

/// The names of the files in `dir`.
std::vector<std::string> listDir(const fs::path &dir) {
  std::vector<std::string> v;
  for (const auto &e : fs::directory_iterator(dir))
    v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

/// A safetensors file from a header text (not padded) and data bytes; the
/// header length word is `n` if given, else the text's size.
std::vector<uint8_t> craft(const std::string &header,
                           const std::vector<uint8_t> &data = {},
                           std::optional<uint64_t> n = std::nullopt) {
  std::vector<uint8_t> b(8);
  uint64_t len = n ? *n : header.size();
  for (int i = 0; i < 8; ++i)
    b[size_t(i)] = uint8_t(len >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

/// Reads `bytes` as a file and expects an error naming the file and
/// containing every one of `needles`.
void expectReadError(const std::vector<uint8_t> &bytes,
                     std::initializer_list<const char *> needles) {
  fs::path p = scratchDir() / "broken.safetensors";
  writeBytes(p, bytes);
  Expected<File> f = File::read(p.string());
  REQUIRE_FALSE(f.ok());
  const std::string &msg = f.error();
  CAPTURE(msg);
  CHECK(msg.rfind(p.string() + ": ", 0) == 0); // names the file
  for (const char *n : needles)
    CHECK_MESSAGE(msg.find(n) != std::string::npos, "missing '" << n << "'");
}

/// `"name":body`, one header entry.
std::string entry(const std::string &name, const std::string &body) {
  return "\"" + name + "\":" + body;
}

std::vector<uint8_t> zeros(size_t n) { return std::vector<uint8_t>(n, 0); }

} // namespace

//===----------------------------------------------------------------------===//
// Dtypes and round trips
//===----------------------------------------------------------------------===//

TEST_CASE("dtype names") {
  for (DType t : {DType::BF16, DType::F16, DType::F32, DType::I8, DType::U8,
                  DType::I16}) {
    std::optional<DType> back = safetensors::parse_dtype(safetensors::dtype_name(t));
    REQUIRE(back.has_value());
    CHECK(*back == t);
  }
  CHECK(std::string(safetensors::dtype_name(DType::BF16)) == "BF16");
  CHECK(std::string(safetensors::dtype_name(DType::U8)) == "U8");
  CHECK_FALSE(safetensors::parse_dtype("bf16").has_value()); // case matters
  CHECK_FALSE(safetensors::parse_dtype("F64").has_value());
  CHECK_FALSE(safetensors::parse_dtype("").has_value());
}

TEST_CASE("write_file / File::read: every dtype, shapes and metadata round "
          "trip") {
  fs::path dir = freshDir("roundtrip");
  std::string path = (dir / "all.safetensors").string();
  std::vector<uint16_t> bf16(6), f16(5);
  for (int i = 0; i < 6; ++i)
    bf16[size_t(i)] = f32_to_bf16(float(i) * 0.75f - 1.875f);
  for (int i = 0; i < 5; ++i)
    f16[size_t(i)] = f32_to_f16(float(i) - 2.0f);
  std::vector<float> f32 = {1.5f, -2.25f, 1024.125f, -0.0078125f, 3.0f, 9.0f};
  std::vector<int8_t> i8 = {-128, -1, 0, 127, 5};
  std::vector<uint8_t> u8 = {0, 1, 128, 255};
  std::vector<int16_t> i16 = {-32768, -1, 0, 32767, 12345};
  float scalar = 7.0f;
  // Given in an order different from the names' so that the data order
  // (as given) and the header order (sorted) differ.
  std::vector<TensorRef> ts = {
      {"z.i8", DType::I8, {5}, i8.data()},
      {"b.bf16", DType::BF16, {2, 3}, bf16.data()},
      {"f16", DType::F16, {5}, f16.data()},
      {"a.f32", DType::F32, {3, 1, 2}, f32.data()},
      {"u8", DType::U8, {2, 2}, u8.data()},
      {"i16", DType::I16, {5}, i16.data()},
      {"scalar", DType::F32, {}, &scalar},
      {"empty", DType::BF16, {0, 4}, nullptr}, // no bytes: null is fine
  };
  std::map<std::string, std::string> meta = {
      {"format", "flashopt"}, {"step", "12"}, {"unicode", "θ'≈ρ"}, {"e", ""}};
  Status s = write_file(path, ts, meta);
  REQUIRE_MESSAGE(s.ok(), s.message());

  Expected<File> f = File::read(path);
  REQUIRE_MESSAGE(f.ok(), f.error());
  CHECK(f->path() == path);
  CHECK(f->metadata() == meta);
  CHECK(f->tensors().size() == ts.size());
  for (const TensorRef &t : ts) {
    CAPTURE(t.name);
    const StoredTensor *st = f->find(t.name);
    REQUIRE(st != nullptr);
    CHECK(st->dtype == t.dtype);
    CHECK(st->shape == t.shape);
    int64_t numel = 1;
    for (int64_t d : t.shape)
      numel *= d;
    CHECK(st->numel == numel);
    CHECK(st->bytes == int64_t(dtype_bytes(t.dtype, uint64_t(numel))));
    if (st->bytes > 0)
      CHECK(std::memcmp(st->data, t.data, size_t(st->bytes)) == 0);
  }
  CHECK(f->find("missing") == nullptr);

  // The raw layout: an 8-aligned header padded with spaces, __metadata__
  // first then the names sorted, the data in the given order.
  std::vector<uint8_t> raw = readBytes(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  CHECK(n % 8 == 0);
  std::string header(reinterpret_cast<const char *>(raw.data() + 8), n);
  size_t last = header.find_last_not_of(' ');
  REQUIRE(last != std::string::npos);
  CHECK(header[last] == '}');
  CHECK(n - (last + 1) < 8);
  json h = json::parse(header);
  std::vector<std::string> keyOrder;
  {
    nlohmann::ordered_json oh = nlohmann::ordered_json::parse(header);
    for (auto it = oh.begin(); it != oh.end(); ++it)
      keyOrder.push_back(it.key());
  }
  REQUIRE(keyOrder.size() == ts.size() + 1);
  CHECK(keyOrder[0] == "__metadata__");
  CHECK(std::is_sorted(keyOrder.begin() + 1, keyOrder.end()));
  int64_t expectBegin = 0;
  for (const TensorRef &t : ts) {
    const StoredTensor *st = f->find(t.name);
    CHECK(h[t.name]["data_offsets"][0].get<int64_t>() == expectBegin);
    CHECK(st->data == f->find(ts[0].name)->data + expectBegin);
    expectBegin += st->bytes;
  }
  CHECK(int64_t(raw.size()) == int64_t(8 + n) + expectBegin);
  CHECK(listDir(dir) == std::vector<std::string>{"all.safetensors"});
}

TEST_CASE("write_file / File::read: no tensors and no metadata") {
  fs::path dir = freshDir("empty");
  std::string path = (dir / "e.safetensors").string();
  Status s = write_file(path, {}, {});
  REQUIRE_MESSAGE(s.ok(), s.message());
  std::vector<uint8_t> raw = readBytes(path);
  REQUIRE(raw.size() == 16);
  CHECK(std::string(raw.begin() + 8, raw.end()) == "{}      ");
  Expected<File> f = File::read(path);
  REQUIRE_MESSAGE(f.ok(), f.error());
  CHECK(f->tensors().empty());
  CHECK(f->metadata().empty());
}

TEST_CASE("File: copies own their data") {
  fs::path dir = freshDir("copy");
  std::string path = (dir / "c.safetensors").string();
  std::vector<float> a = {1, 2, 3}, b = {4, 5};
  REQUIRE(write_file(path, {{"a", DType::F32, {3}, a.data()},
                            {"b", DType::F32, {2}, b.data()}},
                     {})
              .ok());
  File copy;
  {
    Expected<File> f = File::read(path);
    REQUIRE(f.ok());
    copy = *f; // copy assignment
    File copy2(*f);
    CHECK(copy2.find("b")->data != f->find("b")->data);
    CHECK(std::memcmp(copy2.find("b")->data, b.data(), 8) == 0);
  } // the original is gone
  File moved = std::move(copy);
  CHECK(std::memcmp(moved.find("a")->data, a.data(), 12) == 0);
  CHECK(std::memcmp(moved.find("b")->data, b.data(), 8) == 0);
}

TEST_CASE("File::read: accepts zero-sized tensors sharing an offset and any "
          "data order") {
  // b's data first, then a; two empty tensors at offset 8 and one at the end.
  std::vector<uint8_t> data = {1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9};
  std::string h =
      "{" + entry("a", R"({"dtype":"F32","shape":[1],"data_offsets":[8,12]})") +
      "," + entry("b", R"({"dtype":"I16","shape":[2,2],"data_offsets":[0,8]})") +
      "," + entry("e1", R"({"dtype":"U8","shape":[0],"data_offsets":[8,8]})") +
      "," + entry("e2", R"({"dtype":"BF16","shape":[3,0],"data_offsets":[8,8]})") +
      "," + entry("e3", R"({"dtype":"I8","shape":[0],"data_offsets":[12,12]})") +
      "}";
  fs::path p = scratchDir() / "zero.safetensors";
  writeBytes(p, craft(h, data));
  Expected<File> f = File::read(p.string());
  REQUIRE_MESSAGE(f.ok(), f.error());
  CHECK(f->tensors().size() == 5);
  CHECK(f->find("b")->data[0] == 1);
  CHECK(f->find("a")->data[0] == 9);
  CHECK(f->find("e2")->numel == 0);
}

//===----------------------------------------------------------------------===//
// Validation errors of File::read, one case each
//===----------------------------------------------------------------------===//

namespace {
const std::string kA =
    entry("a", R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})");
}

TEST_CASE("read error: missing file and directories") {
  Expected<File> f = File::read((scratchDir() / "nope.safetensors").string());
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().find("nope.safetensors") != std::string::npos);
  CHECK(f.error().find("cannot open") != std::string::npos);
  Expected<File> d = File::read(scratchDir().string());
  REQUIRE_FALSE(d.ok());
  CHECK(d.error().find("not a regular file") != std::string::npos);
}

TEST_CASE("read error: file shorter than the length word") {
  expectReadError({1, 0, 0}, {"3 bytes", "too short"});
  expectReadError({}, {"0 bytes", "too short"});
}

TEST_CASE("read error: header length over the 100 MB maximum") {
  expectReadError(craft("{}", {}, uint64_t(100'000'001)),
                  {"header length 100000001", "maximum of 100000000"});
  expectReadError(craft("{}", {}, ~uint64_t(0)), {"exceeds the maximum"});
}

TEST_CASE("read error: header length past the end of the file") {
  expectReadError(craft("{}", {}, 3), {"header length 3", "2 bytes"});
}

TEST_CASE("read error: zero header length") {
  expectReadError(craft("", {}), {"header length is 0"});
}

TEST_CASE("read error: header not starting with '{'") {
  expectReadError(craft(" {}"), {"does not start with '{'"});
  expectReadError(craft("[]"), {"does not start with '{'"});
}

TEST_CASE("read error: invalid JSON") {
  expectReadError(craft("{\"a\":"), {"not valid JSON"});
  expectReadError(craft("{} x"), {"not valid JSON"});
  expectReadError(craft(std::string("{}\0\0", 4)), {"not valid JSON",
                                                     "NUL byte at offset 2"});
  expectReadError(craft(std::string("{\"a\0\":1}", 8)), {"NUL byte"});
}

TEST_CASE("read error: invalid UTF-8 in the header") {
  expectReadError(craft("{\"\xff\xfe\":{}}"), {"not valid JSON"});
}

TEST_CASE("read error: a repeated key") {
  expectReadError(craft("{" + kA + "," + kA + "}", zeros(8)),
                  {"repeats the key 'a'"});
  expectReadError(
      craft(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
            zeros(8)),
      {"repeats the key 'dtype'"});
}

TEST_CASE("read error: entry not an object") {
  expectReadError(craft("{\"a\":[1,2]}"),
                  {"tensor 'a'", "the entry is an array", "expected an object"});
}

TEST_CASE("read error: entry missing a key") {
  expectReadError(craft(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", zeros(8)),
                  {"tensor 'a'", "missing 'dtype'"});
  expectReadError(craft(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", zeros(8)),
                  {"tensor 'a'", "missing 'shape'"});
  expectReadError(craft(R"({"a":{"dtype":"F32","shape":[2]}})", zeros(8)),
                  {"tensor 'a'", "missing 'data_offsets'"});
}

TEST_CASE("read error: entry with an extra key") {
  expectReadError(
      craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})",
            zeros(8)),
      {"tensor 'a'", "unexpected key 'x'", "exactly dtype, shape and data_offsets"});
}

TEST_CASE("read error: dtype not a string") {
  expectReadError(craft(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})",
                        zeros(8)),
                  {"tensor 'a'", "dtype is a number (4)", "expected a string"});
}

TEST_CASE("read error: unknown dtype") {
  expectReadError(craft(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                        zeros(8)),
                  {"tensor 'a'", "dtype 'F64' is not supported", "BF16, F16"});
  expectReadError(craft(R"({"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})",
                        zeros(8)),
                  {"dtype 'f32' is not supported"});
}

TEST_CASE("read error: shape not an array") {
  expectReadError(craft(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})",
                        zeros(8)),
                  {"tensor 'a'", "shape is a number (2)"});
}

TEST_CASE("read error: negative dimension") {
  expectReadError(
      craft(R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})",
            zeros(8)),
      {"tensor 'a'", "shape[1] is a number (-1)", "non-negative integer"});
}

TEST_CASE("read error: non-integer dimension") {
  expectReadError(
      craft(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})",
            zeros(8)),
      {"tensor 'a'", "shape[0] is a number (2.0)"});
  expectReadError(
      craft(R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})",
            zeros(8)),
      {"shape[0] is a string"});
}

TEST_CASE("read error: size overflow") {
  expectReadError(
      craft(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
            zeros(8)),
      {"tensor 'a'", "F32 [4294967296, 4294967296]", "overflows"});
  // numel fits, bytes do not.
  expectReadError(
      craft(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})",
            zeros(8)),
      {"overflows"});
  // A dimension beyond int64.
  expectReadError(
      craft(R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,8]}})",
            zeros(8)),
      {"shape[0]"});
}

TEST_CASE("read error: data_offsets malformed") {
  expectReadError(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})",
                        zeros(8)),
                  {"tensor 'a'", "data_offsets is an array of 1 elements",
                   "[begin, end]"});
  expectReadError(
      craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":{"b":0}}})",
            zeros(8)),
      {"data_offsets is an object"});
  expectReadError(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})",
                        zeros(8)),
                  {"tensor 'a'", "non-negative integers"});
}

TEST_CASE("read error: data_offsets reversed") {
  expectReadError(craft(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})",
                        zeros(8)),
                  {"tensor 'a'", "data_offsets [8, 0] end before they begin"});
}

TEST_CASE("read error: data_offsets past the data section") {
  expectReadError(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                        zeros(7)),
                  {"tensor 'a'", "data_offsets [0, 8]", "7-byte data section"});
}

TEST_CASE("read error: data_offsets size differs from dtype x shape") {
  expectReadError(
      craft(R"({"w.param":{"dtype":"BF16","shape":[4],"data_offsets":[0,10]}})",
            zeros(10)),
      {"tensor 'w.param': data_offsets [0, 10] hold 10 bytes but BF16 [4] "
       "needs 8"});
}

TEST_CASE("read error: overlapping tensors") {
  std::string h =
      "{" + kA + "," +
      entry("b", R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})") + "}";
  expectReadError(craft(h, zeros(8)),
                  {"tensor 'b'", "[4, 8] overlap tensor 'a' [0, 8]"});
}

TEST_CASE("read error: a gap between tensors") {
  std::string h =
      "{" + kA + "," +
      entry("b", R"({"dtype":"F32","shape":[1],"data_offsets":[12,16]})") + "}";
  expectReadError(craft(h, zeros(16)),
                  {"bytes [8, 12) of the data section belong to no tensor"});
}

TEST_CASE("read error: trailing bytes not covered") {
  expectReadError(craft("{" + kA + "}", zeros(9)),
                  {"data section has 9 bytes", "cover only 8"});
  expectReadError(craft("{}", zeros(1)), {"data section has 1 bytes"});
}

TEST_CASE("read error: __metadata__ not an object") {
  expectReadError(craft("{\"__metadata__\":[\"a\"]," + kA + "}", zeros(8)),
                  {"__metadata__ is an array", "object of strings"});
}

TEST_CASE("read error: __metadata__ value not a string") {
  expectReadError(craft("{\"__metadata__\":{\"k\":\"v\",\"n\":3}," + kA + "}",
                        zeros(8)),
                  {"__metadata__ key 'n' holds a number (3)", "expected a string"});
  expectReadError(craft("{\"__metadata__\":{\"k\":null}}"),
                  {"__metadata__ key 'k' holds null"});
}

TEST_CASE("read: the header may be padded with spaces and need not be "
          "8-aligned") {
  fs::path p = scratchDir() / "pad.safetensors";
  writeBytes(p, craft("{" + kA + "}   ", zeros(8)));
  Expected<File> f = File::read(p.string());
  REQUIRE_MESSAGE(f.ok(), f.error());
  CHECK(f->find("a")->numel == 2);
}

//===----------------------------------------------------------------------===//
// write_file errors and atomicity
//===----------------------------------------------------------------------===//

namespace {

/// A target file with known contents, and a check that a failed write left
/// it (and the directory) exactly as it was.
struct Existing {
  fs::path dir, path;
  std::vector<uint8_t> before;
  explicit Existing(const std::string &name) {
    dir = freshDir(name);
    path = dir / "ckpt.safetensors";
    std::vector<float> v = {1, 2, 3, 4};
    Status s = write_file(path.string(), {{"old", DType::F32, {4}, v.data()}},
                          {{"version", "1"}});
    REQUIRE_MESSAGE(s.ok(), s.message());
    before = readBytes(path);
    REQUIRE(before.size() > 16);
  }
  void checkUntouched() const {
    CHECK(readBytes(path) == before);
    CHECK(listDir(dir) == std::vector<std::string>{"ckpt.safetensors"});
  }
};

} // namespace

TEST_CASE("write error: null data leaves the existing file untouched") {
  Existing e("null-data");
  std::vector<float> ok = {1};
  Status s = write_file(e.path.string(),
                        {{"fine", DType::F32, {1}, ok.data()},
                         {"w", DType::BF16, {4}, nullptr}},
                        {});
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find(e.path.string()) != std::string::npos);
  CHECK(s.message().find("tensor 'w': data is null but BF16 [4] needs 8 "
                         "bytes") != std::string::npos);
  e.checkUntouched();
}

TEST_CASE("write error: directory that does not exist") {
  fs::path p = scratchDir() / "no-such-dir" / "x.safetensors";
  std::vector<float> v = {1};
  Status s = write_file(p.string(), {{"a", DType::F32, {1}, v.data()}}, {});
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("no-such-dir") != std::string::npos);
  CHECK(s.message().find("No such file or directory") != std::string::npos);
  CHECK_FALSE(fs::exists(scratchDir() / "no-such-dir"));
}

TEST_CASE("write error: the path is an existing directory") {
  fs::path dir = freshDir("is-dir");
  fs::create_directory(dir / "target");
  std::ofstream(dir / "target" / "inside.txt") << "keep";
  std::vector<float> v = {1};
  Status s = write_file((dir / "target").string(),
                        {{"a", DType::F32, {1}, v.data()}}, {});
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("is a directory") != std::string::npos);
  CHECK(fs::is_directory(dir / "target"));
  CHECK(listDir(dir) == std::vector<std::string>{"target"});
  CHECK(listDir(dir / "target") == std::vector<std::string>{"inside.txt"});
  // A path ending in '/' names a directory too.
  Status s2 = write_file((dir / "target").string() + "/", {}, {});
  REQUIRE_FALSE(s2.ok());
  CHECK(listDir(dir) == std::vector<std::string>{"target"});
}

TEST_CASE("write error: invalid tensors") {
  Existing e("invalid");
  std::vector<float> v = {1, 2};
  auto expectError = [&](const std::vector<TensorRef> &ts, const char *needle) {
    Status s = write_file(e.path.string(), ts, {});
    REQUIRE_FALSE(s.ok());
    CAPTURE(s.message());
    CHECK(s.message().find(needle) != std::string::npos);
    e.checkUntouched();
  };
  expectError({{"a", DType::F32, {1}, v.data()}, {"a", DType::F32, {1}, v.data()}},
              "tensor 'a': the name is used by more than one tensor");
  expectError({{"__metadata__", DType::F32, {1}, v.data()}},
              "reserved for the metadata");
  expectError({{"", DType::F32, {1}, v.data()}}, "empty name");
  expectError({{"a", DType::F32, {2, -1}, v.data()}},
              "tensor 'a': shape[1] is -1");
  expectError({{"a", DType::F32, {int64_t(1) << 40, int64_t(1) << 40}, v.data()}},
              "overflows");
  Status s = write_file(e.path.string(), {{"a\xff", DType::F32, {1}, v.data()}},
                        {});
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("UTF-8") != std::string::npos);
  e.checkUntouched();
}

TEST_CASE("write error: failing mid-write removes the temporary file") {
  // Limit the file size so that writing the data fails with EFBIG after the
  // temporary file exists (SIGXFSZ ignored), in a child process so the
  // limit cannot leak into other tests.
  Existing e("mid-write");
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {4096, 4096};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
      _exit(10);
    std::vector<uint8_t> big(1 << 20, 7);
    Status s = write_file(e.path.string(),
                          {{"big", DType::U8, {int64_t(big.size())}, big.data()}},
                          {});
    if (s.ok())
      _exit(11);
    if (s.message().find("File too large") == std::string::npos)
      _exit(12);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0); // 11: it succeeded; 12: another error
  e.checkUntouched();
}

TEST_CASE("write_file: replaces an existing file atomically") {
  Existing e("replace");
  std::vector<int16_t> v = {5, 6, 7};
  Status s = write_file(e.path.string(), {{"new", DType::I16, {3}, v.data()}},
                        {{"version", "2"}});
  REQUIRE_MESSAGE(s.ok(), s.message());
  CHECK(listDir(e.dir) == std::vector<std::string>{"ckpt.safetensors"});
  Expected<File> f = File::read(e.path.string());
  REQUIRE_MESSAGE(f.ok(), f.error());
  CHECK(f->find("old") == nullptr);
  REQUIRE(f->find("new") != nullptr);
  CHECK(std::memcmp(f->find("new")->data, v.data(), 6) == 0);
  CHECK(f->metadata().at("version") == "2");
  // A relative path (no directory part) works too.
  std::string cwd = fs::current_path().string();
  fs::current_path(e.dir);
  Status s2 = write_file("rel.safetensors", {}, {{"k", "v"}});
  fs::current_path(cwd);
  REQUIRE_MESSAGE(s2.ok(), s2.message());
  CHECK(fs::exists(e.dir / "rel.safetensors"));
}

//===----------------------------------------------------------------------===//
// Interoperability with Python's safetensors
//===----------------------------------------------------------------------===//

namespace {

std::string shellQuote(const std::string &s) {
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Keep in sync with expected_tensors() of Inputs/safetensors_interop.py.
struct InteropData {
  std::vector<uint16_t> bf16, f16;
  std::vector<float> f32 = {1.5f, -2.25f, 1024.125f, -0.0078125f};
  std::vector<int8_t> i8 = {-128, -1, 0, 127};
  std::vector<uint8_t> u8 = {0, 1, 128, 255};
  std::vector<int16_t> i16 = {-32768, -1, 0, 32767, 12345};
  float scalar = 7.0f;
  InteropData() {
    for (float x : {-1.875f, -1.125f, -0.375f, 0.375f, 1.125f, 1.875f})
      bf16.push_back(f32_to_bf16(x));
    for (float x : {-2.5f, -0.5f, 0.0f, 0.25f, 65504.0f})
      f16.push_back(f32_to_f16(x));
  }
  std::vector<TensorRef> refs() const {
    return {{"bf16", DType::BF16, {2, 3}, bf16.data()},
            {"f16", DType::F16, {5}, f16.data()},
            {"f32", DType::F32, {2, 2}, f32.data()},
            {"i8", DType::I8, {4}, i8.data()},
            {"u8", DType::U8, {2, 2}, u8.data()},
            {"i16", DType::I16, {5}, i16.data()},
            {"nested.name/with.dots", DType::F32, {}, &scalar},
            {"empty", DType::F32, {0, 4}, nullptr}};
  }
};

} // namespace

TEST_CASE("python interop" * doctest::skip()) {
  const char *src = std::getenv("FLASHOPT_SOURCE_DIR");
  const char *py = std::getenv("FLASHOPT_PYTHON");
  const char *script = std::getenv("FLASHOPT_SAFETENSORS_SCRIPT");
  std::string srcDir = src ? src : "";
  std::string python = py ? py : srcDir + "/.venv/bin/python";
  std::string scriptPath =
      script ? script
             : srcDir + "/unittests/Runtime/Inputs/safetensors_interop.py";
  const bool located = !srcDir.empty() || (py && script);
  REQUIRE_MESSAGE(located,
                  "set FLASHOPT_SOURCE_DIR (ctest does) to the source tree");
  if (access(python.c_str(), X_OK) != 0)
    FAIL(python << " is missing: run scripts/setup.sh to create the .venv "
                   "with safetensors (this test needs it)");
  REQUIRE_MESSAGE(fs::exists(scriptPath), scriptPath << " is missing");

  fs::path dir = freshDir("python");
  InteropData d;

  // C++ writes, Python reads.
  std::string cppFile = (dir / "from_cpp.safetensors").string();
  Status s = write_file(cppFile, d.refs(),
                        {{"format", "flashopt-interop"},
                         {"step", "42"},
                         {"unicode", "θ'≈ρ"}});
  REQUIRE_MESSAGE(s.ok(), s.message());
  std::string cmd = shellQuote(python) + " " + shellQuote(scriptPath) +
                    " check " + shellQuote(cppFile);
  int rc = std::system(cmd.c_str());
  CHECK_MESSAGE(rc == 0, cmd << " failed (status " << rc << ")");

  // Python writes, C++ reads.
  std::string pyFile = (dir / "from_python.safetensors").string();
  cmd = shellQuote(python) + " " + shellQuote(scriptPath) + " write " +
        shellQuote(pyFile);
  rc = std::system(cmd.c_str());
  REQUIRE_MESSAGE(rc == 0, cmd << " failed (status " << rc << ")");
  Expected<File> f = File::read(pyFile);
  REQUIRE_MESSAGE(f.ok(), f.error());
  const std::map<std::string, std::string> wantMeta = {
      {"writer", "python"}, {"step", "7"}, {"empty", ""}};
  CHECK(f->metadata() == wantMeta);
  std::vector<TensorRef> want = d.refs();
  CHECK(f->tensors().size() == want.size());
  for (const TensorRef &t : want) {
    CAPTURE(t.name);
    const StoredTensor *st = f->find(t.name);
    REQUIRE(st != nullptr);
    CHECK(st->dtype == t.dtype);
    CHECK(st->shape == t.shape);
    int64_t numel = 1;
    for (int64_t x : t.shape)
      numel *= x;
    CHECK(st->numel == numel);
    REQUIRE(st->bytes == int64_t(dtype_bytes(t.dtype, uint64_t(numel))));
    if (st->bytes > 0)
      CHECK(std::memcmp(st->data, t.data, size_t(st->bytes)) == 0);
  }
}
