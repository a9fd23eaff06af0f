//===- Files.cpp - Reading input files safely -----------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/abi/Files.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace flashopt::abi {

const char *file_kind(unsigned mode) {
  if (S_ISREG(mode))
    return "a regular file";
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISLNK(mode))
    return "a symbolic link";
  return "not a regular file";
}

namespace {
std::string sizeText(uint64_t bytes) {
  if (bytes >= (uint64_t(1) << 20) && bytes % (uint64_t(1) << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}
} // namespace

FileError read_regular_file(const std::string &path, uint64_t max_bytes,
                            std::string &out, std::string &reason) {
  out.clear();
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of
  // waiting; the fstat below then refuses it. Regular files ignore the flag.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      reason = "no such file";
      return FileError::NotFound;
    }
    if (err == EISDIR) {
      reason = "is a directory, not a regular file";
      return FileError::NotRegular;
    }
    reason = std::string("cannot open: ") + std::strerror(err);
    return FileError::Io;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    reason = std::string("cannot stat: ") + std::strerror(err);
    return FileError::Io;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    reason =
        std::string("is ") + file_kind(st.st_mode) + ", not a regular file";
    return FileError::NotRegular;
  }
  if (uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    reason = "is " + std::to_string(uint64_t(st.st_size)) +
             " bytes, more than the limit of " + sizeText(max_bytes);
    return FileError::TooLarge;
  }
  try {
    out.resize(size_t(st.st_size));
  } catch (...) {
    ::close(fd);
    reason = "out of memory";
    return FileError::Io;
  }
  size_t got = 0;
  while (true) {
    if (got == out.size()) {
      // The file may have grown since the fstat: read on, within the bound.
      if (out.size() >= max_bytes) {
        char probe;
        ssize_t r = ::read(fd, &probe, 1);
        if (r > 0) {
          ::close(fd);
          out.clear();
          reason = "grew past the limit of " + sizeText(max_bytes) +
                   " while being read";
          return FileError::TooLarge;
        }
        break;
      }
      out.resize(std::min<uint64_t>(max_bytes, out.size() + 65536));
    }
    ssize_t r = ::read(fd, &out[got], out.size() - got);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (r < 0) {
      int err = errno;
      ::close(fd);
      out.clear();
      reason = std::string("read error: ") + std::strerror(err);
      return FileError::Io;
    }
    if (r == 0)
      break;
    got += size_t(r);
  }
  ::close(fd);
  out.resize(got);
  return FileError::None;
}

} // namespace flashopt::abi
