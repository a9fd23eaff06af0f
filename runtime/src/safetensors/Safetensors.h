//===- Safetensors.h - safetensors files ------------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Reading and writing the safetensors format: an 8-byte little-endian
/// header length N, N bytes of JSON header (UTF-8, padded with spaces to a
/// multiple of 8), then the raw little-endian tensor data. The header maps
/// each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
/// (offsets relative to the data section) and may hold "__metadata__", a
/// string-to-string map.
///
/// Writes are atomic: a temporary file in the target's directory, fsync,
/// rename, fsync of the directory; on any failure the temporary file is
/// removed and a previous file at the path is untouched.
///
/// Reads validate everything before handing out data: the header length
/// against the file size, the JSON, every entry's keys, dtype, shape and
/// offsets (inside the data section, sized dtype * prod(shape), not
/// overlapping, covering the data section), the metadata's types.
///
/// Internal to libflashopt (not installed).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_RUNTIME_SAFETENSORS_H
#define FLASHOPT_RUNTIME_SAFETENSORS_H

#include "flashopt/host/Abi.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashopt::host::safetensors {

/// safetensors dtype names: "BF16", "F16", "F32", "I8", "U8", "I16".
const char *dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);

/// One tensor to write; `data` points at dtype_bytes(dtype, prod(shape))
/// bytes.
struct TensorRef {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void *data = nullptr;
};

/// Writes `tensors` (in this order in the data section; the header lists
/// them sorted by name, as the reference implementation does) and
/// `metadata` to `path`, atomically (a temporary file next to the target,
/// fsync, rename, fsync of the directory).
///
/// The target must be a regular file or not exist: a directory, FIFO,
/// socket or device is refused. A symbolic link is followed (its final
/// target is replaced atomically and the link is kept); a dangling link or a
/// link to a non-regular file is refused. Temporaries left by writers of
/// the same target that were killed (".<name>.tmp-<pid>-<n>", no longer
/// locked by a live writer) are removed first.
Status write_file(const std::string &path, const std::vector<TensorRef> &tensors,
                  const std::map<std::string, std::string> &metadata);

/// The bytes write_file would write for `tensors` and `metadata` (the same
/// checks, the same header), in memory.
Expected<std::vector<uint8_t>>
serialize(const std::vector<TensorRef> &tensors,
          const std::map<std::string, std::string> &metadata);

/// CRC-32C (Castagnoli, the iSCSI/ext4 checksum) of `n` bytes, continuing
/// from `crc` (0 to start). crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void *data, size_t n, uint32_t crc = 0);

/// The stage of write_file at which an injected fault strikes (tests only).
enum class WriteStage { Open, Write, Fsync, Rename };
/// An injected write fault: the stage, the byte of the file at which a
/// Write fault strikes (the bytes before it are written), and the errno.
struct WriteFault {
  WriteStage stage = WriteStage::Open;
  uint64_t at_byte = 0;
  int error = 5; // EIO
};
/// Makes every later write_file of this process fail as `fault` says
/// (nullopt: no fault). For fault tests; not thread-safe against writers.
void set_write_fault_for_testing(std::optional<WriteFault> fault);

/// One tensor of a file that was read.
struct StoredTensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  /// Into the File's buffer; not necessarily aligned for the dtype (the
  /// format packs tensors back to back): copy out with memcpy.
  const uint8_t *data = nullptr;
  int64_t bytes = 0;
};

/// A whole file read into memory and validated.
class File {
public:
  File() = default;
  /// Copies rebase the tensors' data pointers onto the copy's own buffer.
  File(const File &other);
  File &operator=(const File &other);
  File(File &&) = default;
  File &operator=(File &&) = default;

  /// Reads and validates `path`. Errors name the file and what is wrong
  /// ("ckpt.safetensors: tensor 'w.param': data_offsets [0, 10] hold 10
  /// bytes but BF16 [4] needs 8").
  static Expected<File> read(const std::string &path);
  /// Validates a whole file's bytes held in memory (as read() does after
  /// reading); `origin` names them in errors and is path().
  static Expected<File> parse(std::vector<uint8_t> bytes,
                              const std::string &origin);
  const std::map<std::string, std::string> &metadata() const { return meta_; }
  const std::map<std::string, StoredTensor> &tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const StoredTensor *find(const std::string &name) const;
  const std::string &path() const { return path_; }

private:
  std::string path_;
  std::vector<uint8_t> bytes_;
  std::map<std::string, std::string> meta_;
  std::map<std::string, StoredTensor> tensors_;
};

} // namespace flashopt::host::safetensors

#endif // FLASHOPT_RUNTIME_SAFETENSORS_H
