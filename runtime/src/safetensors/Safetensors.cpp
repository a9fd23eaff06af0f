//===- Safetensors.cpp - safetensors files --------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Validated reading and atomic writing of safetensors files (see
/// Safetensors.h for the format). Reading accepts exactly what the reference
/// implementation (huggingface/safetensors) accepts for our dtypes, and is
/// stricter where it is lax: entries must hold exactly dtype / shape /
/// data_offsets, JSON keys must not repeat, shapes and offsets must be
/// non-negative integers (no floats), and every byte of the data section
/// belongs to exactly one tensor.
///
/// Exceptions (nlohmann/json, allocation) are caught in each file (this one:
/// reading; Writer.cpp: writing) and turned into a Status; none escapes.
///
//===----------------------------------------------------------------------===//

#include "SafetensorsInternal.h"

#include "flashopt/abi/Files.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <new>
#include <set>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>
#include <signal.h>
#include <sys/file.h>
#include <cstdlib>
#include <optional>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "Safetensors.cpp assumes a little-endian host"
#endif

namespace flashopt::host::safetensors {

namespace detail {

std::string quote(const std::string &s) { return "'" + s + "'"; }

std::string errnoText(int err) { return std::strerror(err); }

std::string describe(DType t, const std::vector<int64_t> &shape) {
  std::string s = safetensors::dtype_name(t);
  s += " [";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

bool tensorSize(DType t, const std::vector<int64_t> &shape, int64_t *numel,
                int64_t *bytes) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      return false;
  }
  int64_t b;
  if (__builtin_mul_overflow(n, int64_t(dtype_bits(t)), &b))
    return false;
  *numel = n;
  *bytes = b / 8 + (b % 8 != 0); // dtype_bytes, without overflow
  return true;
}

} // namespace detail

using namespace detail;

namespace {

using json = nlohmann::json;

/// A non-negative JSON integer (no floats, no negatives, at most INT64_MAX).
bool asIndex(const json &j, int64_t *out) {
  if (!j.is_number_unsigned())
    return false;
  uint64_t v = j.get<uint64_t>();
  if (v > uint64_t(std::numeric_limits<int64_t>::max()))
    return false;
  *out = int64_t(v);
  return true;
}

/// What a JSON value is, for messages: "an object", "a number (-3)".
std::string found(const json &j) {
  std::string t = j.type_name();
  std::string s = (t == "object" || t == "array") ? "an " + t
                  : t == "null"                   ? t
                                                  : "a " + t;
  if (j.is_primitive() && !j.is_null()) {
    std::string v = j.dump(-1, ' ', false, json::error_handler_t::replace);
    if (v.size() <= 40)
      s += " (" + v + ")";
  }
  return s;
}

} // namespace

namespace {
/// Slicing-by-8 tables of the reflected CRC-32C polynomial 0x82F63B78.
struct Crc32cTables {
  uint32_t t[8][256];
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s)
        t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};
const Crc32cTables &crcTables() {
  static const Crc32cTables tables;
  return tables;
}
} // namespace

uint32_t crc32c(const void *data, size_t n, uint32_t crc) {
  const auto &T = crcTables().t;
  const auto *p = static_cast<const uint8_t *>(data);
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4); // little-endian host
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^
          T[4][lo >> 24] ^ T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^
          T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--)
    crc = (crc >> 8) ^ T[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

//===----------------------------------------------------------------------===//
// Dtypes
//===----------------------------------------------------------------------===//

const char *dtype_name(DType t) { return abi::dtype_safetensors_name(t); }

std::optional<DType> parse_dtype(std::string_view name) {
  return abi::parse_safetensors_dtype(name);
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

File::File(const File &other)
    : path_(other.path_), bytes_(other.bytes_), meta_(other.meta_),
      tensors_(other.tensors_) {
  for (auto &kv : tensors_)
    kv.second.data = bytes_.data() + (kv.second.data - other.bytes_.data());
}

File &File::operator=(const File &other) {
  if (this != &other) {
    File copy(other);
    *this = std::move(copy);
  }
  return *this;
}

const StoredTensor *File::find(const std::string &name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

namespace {

/// The whole of `path`, a regular file ("<where>cannot open: ..." and
/// "read error: ..." are Code::Io).
Expected<std::vector<uint8_t>> readWhole(const std::string &path,
                                         const std::string &where) {
  // O_NONBLOCK: a FIFO must not stall the open (it is refused below).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return Status::error(Code::Io, where + "cannot open: " + errnoText(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::error(Code::Io, where + "cannot stat: " + errnoText(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(Code::Io, where + "not a regular file (it is " +
                                       abi::file_kind(st.st_mode) + ")");
  }
  std::vector<uint8_t> bytes(size_t(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int err = errno;
      ::close(fd);
      return Status::error(Code::Io, where + "read error: " + errnoText(err));
    }
    if (r == 0)
      break;
    got += size_t(r);
  }
  ::close(fd);
  if (got != bytes.size())
    return Status::error(Code::Io,
                         where + "the file shrank while being read (" +
                             std::to_string(got) + " of " +
                             std::to_string(bytes.size()) + " bytes)");
  return bytes;
}

/// The header of `bytes`: its 8-byte length checked against the size, then
/// the JSON object, refusing repeated keys (nlohmann would keep the last).
/// `*dataBegin` is where the data section starts.
Expected<json> parseHeader(const std::vector<uint8_t> &bytes,
                           const std::string &where, int64_t *dataBegin) {
  const uint64_t size = bytes.size();
  if (size < 8)
    return Status::error(Code::Format,
                         where + "the file is " + std::to_string(size) +
                             " bytes, too short for the 8-byte header length");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8); // little-endian host
  if (n > kMaxHeaderBytes)
    return Status::error(Code::Format,
                         where + "header length " + std::to_string(n) +
                             " exceeds the maximum of " +
                             std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    return Status::error(Code::Format, where + "header length " +
                                           std::to_string(n) + " exceeds the " +
                                           std::to_string(size - 8) +
                                           " bytes that follow it in the file");
  if (n == 0)
    return Status::error(Code::Format,
                         where + "header length is 0; expected a JSON "
                                 "object");
  const char *text = reinterpret_cast<const char *>(bytes.data() + 8);
  if (text[0] != '{')
    return Status::error(Code::Format,
                         where + "the header does not start with '{'");
  // nlohmann/json stops at a NUL byte; valid JSON never holds a raw one.
  if (const void *nul = std::memchr(text, 0, n))
    return Status::error(
        Code::Format,
        where + "the header is not valid JSON: NUL byte at offset " +
            std::to_string(static_cast<const char *>(nul) - text));
  *dataBegin = int64_t(8 + n);

  std::vector<std::set<std::string>> keyStack;
  std::string duplicate;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev,
                                   json &parsed) {
    switch (ev) {
    case json::parse_event_t::object_start:
      keyStack.emplace_back();
      break;
    case json::parse_event_t::object_end:
      if (!keyStack.empty())
        keyStack.pop_back();
      break;
    case json::parse_event_t::key:
      if (!keyStack.empty() && parsed.is_string() &&
          !keyStack.back().insert(parsed.get<std::string>()).second &&
          duplicate.empty())
        duplicate = parsed.get<std::string>();
      break;
    default:
      break;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + n, cb);
  } catch (const json::parse_error &e) {
    return Status::error(Code::Format,
                         where + "the header is not valid JSON: " + e.what());
  }
  if (!duplicate.empty())
    return Status::error(Code::Format, where + "the header repeats the key " +
                                           quote(duplicate));
  if (!header.is_object())
    return Status::error(Code::Format, where + "the header is a JSON " +
                                           std::string(header.type_name()) +
                                           ", expected an object");
  return header;
}

/// One tensor entry of the header ({dtype, shape, data_offsets}, exactly),
/// its offsets inside the `dataSize`-byte data section; `*begin` is its
/// first byte there.
Expected<StoredTensor> parseEntry(const json &v, const std::string &tw,
                                  int64_t dataSize, int64_t *begin) {
  if (!v.is_object())
    return Status::error(Code::Format,
                         tw + "the entry is " + found(v) +
                             ", expected an object with dtype, shape and "
                             "data_offsets");
  for (auto k = v.begin(); k != v.end(); ++k)
    if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
      return Status::error(Code::Format,
                           tw + "unexpected key " + quote(k.key()) +
                               " (expected exactly dtype, shape and "
                               "data_offsets)");
  for (const char *k : {"dtype", "shape", "data_offsets"})
    if (!v.contains(k))
      return Status::error(Code::Format, tw + "missing " + quote(k));

  StoredTensor t;
  const json &dt = v.at("dtype");
  if (!dt.is_string())
    return Status::error(Code::Format,
                         tw + "dtype is " + found(dt) + ", expected a string");
  std::optional<DType> dtype = parse_dtype(dt.get<std::string>());
  if (!dtype)
    return Status::error(Code::Format,
                         tw + "dtype " + quote(dt.get<std::string>()) +
                             " is not supported (expected one of BF16, F16, "
                             "F32, I8, U8, I16)");
  t.dtype = *dtype;

  const json &sh = v.at("shape");
  if (!sh.is_array())
    return Status::error(Code::Format,
                         tw + "shape is " + found(sh) +
                             ", expected an array of non-negative integers");
  for (size_t d = 0; d < sh.size(); ++d) {
    int64_t dim;
    if (!asIndex(sh[d], &dim))
      return Status::error(
          Code::Format, tw + "shape[" + std::to_string(d) + "] is " +
                            found(sh[d]) + ", expected a non-negative integer");
    t.shape.push_back(dim);
  }
  if (!tensorSize(t.dtype, t.shape, &t.numel, &t.bytes))
    return Status::error(Code::Format,
                         tw + describe(t.dtype, t.shape) +
                             " is too large (its byte size overflows 64 bits)");

  const json &off = v.at("data_offsets");
  int64_t b, e;
  if (!off.is_array() || off.size() != 2)
    return Status::error(
        Code::Format,
        tw + "data_offsets is " + found(off) +
            (off.is_array() ? " of " + std::to_string(off.size()) + " elements"
                            : std::string()) +
            ", expected [begin, end]");
  if (!asIndex(off[0], &b) || !asIndex(off[1], &e))
    return Status::error(Code::Format,
                         tw + "data_offsets " + off.dump() +
                             " must be two non-negative integers");
  const std::string offText =
      "data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + "]";
  if (b > e)
    return Status::error(Code::Format, tw + offText + " end before they begin");
  if (e > dataSize)
    return Status::error(Code::Format,
                         tw + offText + " run past the end of the " +
                             std::to_string(dataSize) + "-byte data section");
  if (e - b != t.bytes)
    return Status::error(Code::Format,
                         tw + offText + " hold " + std::to_string(e - b) +
                             " bytes but " + describe(t.dtype, t.shape) +
                             " needs " + std::to_string(t.bytes));
  *begin = b;
  return t;
}

/// Bytes [begin, end) of the data section, held by tensor `name`.
struct Span {
  int64_t begin, end;
  const std::string *name;
};

/// Every byte of the `dataSize`-byte data section belongs to exactly one
/// span.
Status checkSpans(std::vector<Span> spans, int64_t dataSize,
                  const std::string &where) {
  std::sort(spans.begin(), spans.end(), [](const Span &x, const Span &y) {
    if (x.begin != y.begin)
      return x.begin < y.begin;
    if (x.end != y.end)
      return x.end < y.end;
    return *x.name < *y.name;
  });
  int64_t covered = 0;
  const Span *prev = nullptr;
  for (const Span &s : spans) {
    if (s.begin < covered)
      return Status::error(Code::Format,
                           where + "tensor " + quote(*s.name) +
                               ": data_offsets [" + std::to_string(s.begin) +
                               ", " + std::to_string(s.end) +
                               "] overlap tensor " + quote(*prev->name) + " [" +
                               std::to_string(prev->begin) + ", " +
                               std::to_string(prev->end) + "]");
    if (s.begin > covered)
      return Status::error(Code::Format,
                           where + "bytes [" + std::to_string(covered) + ", " +
                               std::to_string(s.begin) +
                               ") of the data section belong to no tensor");
    covered = s.end;
    prev = &s;
  }
  if (covered != dataSize)
    return Status::error(
        Code::Format,
        where + "the data section has " + std::to_string(dataSize) +
            " bytes but the tensors cover only " + std::to_string(covered) +
            " (bytes [" + std::to_string(covered) + ", " +
            std::to_string(dataSize) + ") belong to no tensor)");
  return Status::success();
}

} // namespace

Expected<File> File::read(const std::string &path) {
  const std::string where = path + ": ";
  try {
    Expected<std::vector<uint8_t>> bytes = readWhole(path, where);
    if (!bytes)
      return bytes.status();
    return parse(std::move(bytes.value()), path);
  } catch (const std::bad_alloc &) {
    return Status::error(Code::OutOfMemory, where + "out of memory");
  } catch (const std::exception &e) {
    return Status::error(Code::Internal, where + "internal error: " + e.what());
  }
}

Expected<File> File::parse(std::vector<uint8_t> bytes,
                           const std::string &origin) {
  const std::string where = origin + ": ";
  try {
    File f;
    f.path_ = origin;
    f.bytes_ = std::move(bytes);
    int64_t dataBegin = 0;
    Expected<json> header = parseHeader(f.bytes_, where, &dataBegin);
    if (!header)
      return header.status();
    const int64_t dataSize = int64_t(f.bytes_.size()) - dataBegin;
    std::vector<Span> spans;
    for (auto it = header->begin(); it != header->end(); ++it) {
      const std::string &name = it.key();
      const json &v = it.value();
      if (name != kMetadataKey) {
        int64_t begin = 0;
        Expected<StoredTensor> t = parseEntry(
            v, where + "tensor " + quote(name) + ": ", dataSize, &begin);
        if (!t)
          return t.status();
        auto ins = f.tensors_.emplace(name, std::move(t.value()));
        ins.first->second.data = f.bytes_.data() + dataBegin + begin;
        spans.push_back(
            {begin, begin + ins.first->second.bytes, &ins.first->first});
        continue;
      }
      if (!v.is_object())
        return Status::error(Code::Format,
                             where + "__metadata__ is " + found(v) +
                                 ", expected an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return Status::error(Code::Format, where + "__metadata__ key " +
                                                 quote(m.key()) + " holds " +
                                                 found(m.value()) +
                                                 ", expected a string");
        f.meta_[m.key()] = m.value().get<std::string>();
      }
    }
    if (Status s = checkSpans(std::move(spans), dataSize, where); !s)
      return s;
    return Expected<File>(std::move(f));
  } catch (const std::bad_alloc &) {
    return Status::error(Code::OutOfMemory, where + "out of memory");
  } catch (const std::exception &e) {
    return Status::error(Code::Internal, where + "internal error: " + e.what());
  }
}

} // namespace flashopt::host::safetensors
