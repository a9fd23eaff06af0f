//===- Files.h - Reading input files safely ---------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The one way flashopt's tools and library read an input file (spec, rule
/// file, manifest, kernel artifact, checkpoint): opened without blocking
/// (a FIFO never stalls the open), refused unless it is a regular file
/// (after following symlinks: a link to /dev/zero is a character device),
/// and refused when larger than a stated bound, before anything is read.
/// MLIR-free; linked by the compiler and by libflashopt.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_ABI_FILES_H
#define FLASHOPT_ABI_FILES_H

#include <cstdint>
#include <string>

namespace flashopt::abi {

/// Why read_regular_file failed.
enum class FileError {
  None,
  NotFound,   ///< ENOENT / ENOTDIR
  NotRegular, ///< a directory, FIFO, socket, or device
  TooLarge,   ///< larger than max_bytes
  Io,         ///< open/stat/read failed otherwise
};

/// Reads the whole regular file at `path` into `out` (replacing it). Fails,
/// with `reason` a short phrase ("no such file", "is a FIFO, not a regular
/// file", "is 3 GiB, more than the limit of 64 MiB", "read error: ...") and
/// nothing read, unless `path` names a regular file of at most `max_bytes`.
FileError read_regular_file(const std::string &path, uint64_t max_bytes,
                            std::string &out, std::string &reason);

/// What kind of file `mode` (st_mode) is, as a phrase: "a directory",
/// "a FIFO", "a character device", "a block device", "a socket",
/// "a symbolic link", "a regular file".
const char *file_kind(unsigned mode);

} // namespace flashopt::abi

#endif // FLASHOPT_ABI_FILES_H
