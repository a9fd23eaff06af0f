//===- Writer.cpp - Atomic safetensors writing ----------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// write_file: a temporary beside the target, fsync'ed, renamed over it and
/// the directory fsync'ed, so a failed write leaves the previous file intact
/// (Safetensors.h); and the fault injection its tests use.
///
/// Exceptions (nlohmann/json, allocation) are caught here and turned into a
/// Status; none escapes.
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
#error "the safetensors code assumes a little-endian host"
#endif


namespace flashopt::host::safetensors {

using namespace detail;

namespace {

using ordered_json = nlohmann::ordered_json;

//===----------------------------------------------------------------------===//
// File I/O helpers
//===----------------------------------------------------------------------===//

std::optional<WriteFault> injectedFault;

bool faultAt(WriteStage stage, int *err) {
  if (injectedFault && injectedFault->stage == stage) {
    *err = injectedFault->error;
    return true;
  }
  return false;
}

/// Writes all `n` bytes; `*written` counts the bytes of the file so far (for
/// an injected Write fault at a chosen byte).
bool writeAll(int fd, const void *data, size_t n, int *err,
              uint64_t *written) {
  const auto *p = static_cast<const uint8_t *>(data);
  while (n > 0) {
    size_t chunk = std::min<size_t>(n, size_t(1) << 30);
    if (injectedFault && injectedFault->stage == WriteStage::Write) {
      uint64_t at = injectedFault->at_byte;
      if (*written >= at) {
        *err = injectedFault->error;
        return false;
      }
      chunk = size_t(std::min<uint64_t>(chunk, at - *written));
    }
    ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      *err = errno;
      return false;
    }
    if (w == 0) {
      *err = EIO;
      return false;
    }
    p += w;
    n -= size_t(w);
    *written += uint64_t(w);
  }
  return true;
}

/// The directory part of `path` ("." when it has none) and the file name.
void splitPath(const std::string &path, std::string *dir, std::string *base) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) {
    *dir = ".";
    *base = path;
  } else {
    *dir = slash == 0 ? "/" : path.substr(0, slash);
    *base = path.substr(slash + 1);
  }
}

std::atomic<uint64_t> tempCounter{0};

/// Whether `name` is "<prefix><digits>-<digits>" and, if so, the pid.
bool parseTempName(const std::string &name, const std::string &prefix,
                   long *pid) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix))
    return false;
  size_t i = prefix.size(), start = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9')
    ++i;
  if (i == start || i - start > 9 || i >= name.size() || name[i] != '-')
    return false;
  *pid = std::stol(name.substr(start, i - start));
  size_t j = ++i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9')
    ++i;
  return i > j && i == name.size();
}

/// Removes the temporaries that killed writers of `dir`/`base` left: names
/// ".<base>.tmp-<pid>-<n>" (what write_file creates for this target and no
/// other), regular files of this user, whose process is gone, and which no
/// writer holds locked (every writer holds an exclusive flock on its
/// temporary until the rename). Best effort: errors are ignored.
void removeStaleTemporaries(const std::string &dir, const std::string &base) {
  const std::string prefix = "." + base + ".tmp-";
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return;
  std::vector<std::string> stale;
  while (struct dirent *e = ::readdir(d)) {
    std::string name = e->d_name;
    long pid = 0;
    if (!parseTempName(name, prefix, &pid))
      continue;
    if (pid == long(::getpid()))
      continue; // this process's own writers (other threads)
    if (pid > 0 && (::kill(pid_t(pid), 0) == 0 || errno == EPERM))
      continue; // the writer may still be alive
    stale.push_back(name);
  }
  ::closedir(d);
  for (const std::string &name : stale) {
    std::string full = (dir == "/" ? std::string("/") : dir + "/") + name;
    int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW |
                                      O_NONBLOCK);
    if (fd < 0)
      continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_uid == ::geteuid() && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      // Still the same file at that name? Then nobody writes it: remove.
      struct stat now;
      if (::lstat(full.c_str(), &now) == 0 && now.st_ino == st.st_ino &&
          now.st_dev == st.st_dev)
        ::unlink(full.c_str());
    }
    ::close(fd);
  }
}

} // namespace

void set_write_fault_for_testing(std::optional<WriteFault> fault) {
  injectedFault = fault;
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

namespace {

/// A safetensors image laid out: the 8-byte header length and the header
/// (padded with spaces to a multiple of 8), then each tensor's bytes in the
/// given order.
struct Prepared {
  std::string head; ///< length + header
  std::vector<int64_t> size; ///< [tensor] bytes
};

/// Validates `tensors` (names, dtypes, shapes, data) and writes the header:
/// __metadata__ first, then the tensors sorted by name, as the reference
/// implementation does; the data section in the given order.
Expected<Prepared> prepare(const std::vector<TensorRef> &tensors,
                           const std::map<std::string, std::string> &metadata,
                           const std::string &where) {
  Prepared p;
  std::vector<int64_t> begin(tensors.size());
  p.size.resize(tensors.size());
  std::set<std::string> names;
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef &t = tensors[i];
    const std::string tw = where + "tensor " + quote(t.name) + ": ";
    if (t.name.empty())
      return Status::error(Code::InvalidArgument, where + "tensor " +
                                                      std::to_string(i) +
                                                      " has an empty name");
    if (t.name == kMetadataKey)
      return Status::error(Code::InvalidArgument,
                           tw + "the name is reserved for the metadata");
    if (!names.insert(t.name).second)
      return Status::error(Code::InvalidArgument,
                           tw + "the name is used by more than one tensor");
    if (!parse_dtype(safetensors::dtype_name(t.dtype)))
      return Status::error(Code::InvalidArgument, tw + "unsupported dtype");
    // A safetensors dtype has whole bytes per element: the packed 4-bit
    // codes are written as their container, U8 [ceil(n / 2)].
    if (abi::dtype_is_packed(t.dtype))
      return Status::error(Code::InvalidArgument,
                           tw + "dtype " + abi::dtype_name(t.dtype) +
                               " is packed: write its bytes as U8");
    int64_t numel, bytes;
    for (size_t d = 0; d < t.shape.size(); ++d)
      if (t.shape[d] < 0)
        return Status::error(Code::InvalidArgument,
                             tw + "shape[" + std::to_string(d) + "] is " +
                                 std::to_string(t.shape[d]) +
                                 ", expected a non-negative size");
    if (!tensorSize(t.dtype, t.shape, &numel, &bytes))
      return Status::error(
          Code::InvalidArgument,
          tw + describe(t.dtype, t.shape) +
              " is too large (its byte size overflows 64 bits)");
    if (bytes > 0 && t.data == nullptr)
      return Status::error(Code::InvalidArgument,
                           tw + "data is null but " +
                               describe(t.dtype, t.shape) + " needs " +
                               std::to_string(bytes) + " bytes");
    if (__builtin_add_overflow(offset, bytes, &offset))
      return Status::error(Code::InvalidArgument,
                           where + "the data section is too large");
    begin[i] = offset - bytes;
    p.size[i] = bytes;
  }

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto &kv : metadata)
      m[kv.first] = kv.second;
    header[kMetadataKey] = std::move(m);
  }
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].name < tensors[b].name;
  });
  for (size_t i : order) {
    const TensorRef &t = tensors[i];
    ordered_json e = ordered_json::object();
    e["dtype"] = safetensors::dtype_name(t.dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {uint64_t(begin[i]), uint64_t(begin[i] + p.size[i])};
    header[t.name] = std::move(e);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const ordered_json::type_error &e) {
    return Status::error(Code::InvalidArgument,
                         where +
                             "a tensor name or metadata string is not valid "
                             "UTF-8 (" +
                             e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes)
    return Status::error(Code::InvalidArgument,
                         where + "the header would be " +
                             std::to_string(text.size()) +
                             " bytes, more than the format's maximum of " +
                             std::to_string(kMaxHeaderBytes));
  uint8_t len[8];
  uint64_t n = text.size();
  std::memcpy(len, &n, 8); // little-endian host
  p.head.assign(reinterpret_cast<const char *>(len), 8);
  p.head += text;
  return p;
}

/// What write_file may replace at `path`: a new path or a regular file, a
/// symbolic link followed to its regular target. Sets `*target` (the file
/// to replace) and its directory and name.
Status checkTarget(const std::string &path, const std::string &where,
                   std::string *target, std::string *dir, std::string *base) {
  if (path.empty())
    return Status::error(Code::InvalidArgument,
                         "safetensors: empty output path");
  splitPath(path, dir, base);
  if (base->empty() || *base == "." || *base == "..")
    return Status::error(Code::Io,
                         where + "the path names a directory, not a file");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return Status::error(Code::Io,
                         where + "is a directory; expected a file path");
  // Symbolic links are followed: the link's final target is written (and
  // replaced atomically), the link itself is kept.
  *target = path;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char *real = ::realpath(path.c_str(), nullptr);
    if (!real)
      return Status::error(Code::Io,
                           where +
                               "is a symbolic link that does not resolve "
                               "to an existing file (" +
                               errnoText(errno) +
                               "); checkpoints follow links only to existing "
                               "regular files");
    *target = real;
    std::free(real);
    splitPath(*target, dir, base);
  }
  if (::stat(target->c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return Status::error(
        Code::Io, where + (*target == path ? "is " : "links to ") +
                      abi::file_kind(st.st_mode) +
                      ", not a regular file; checkpoints are written only "
                      "to regular files (or new paths)");
  return Status::success();
}

/// A fresh temporary file next to the target, locked while written (so a
/// later save can tell a live writer's temporary from a stale one).
Status createTemporary(const std::string &dir, const std::string &base,
                       const std::string &where, std::string *tmp, int *fd) {
  *fd = -1;
  for (int attempt = 0; attempt < 100 && *fd < 0; ++attempt) {
    *tmp = (dir == "/" ? std::string("/") : dir + "/") + "." + base + ".tmp-" +
           std::to_string(::getpid()) + "-" +
           std::to_string(tempCounter.fetch_add(1));
    int openErr = 0;
    if (faultAt(WriteStage::Open, &openErr)) {
      errno = openErr;
      *fd = -1;
    } else {
      *fd = ::open(tmp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                   0666);
    }
    if (*fd < 0 && errno != EEXIST)
      return Status::error(Code::Io, where +
                                         "cannot create the temporary file " +
                                         quote(*tmp) + ": " + errnoText(errno));
  }
  if (*fd < 0)
    return Status::error(Code::Io, where +
                                       "cannot create a temporary file in " +
                                       quote(dir) + ": names in use");
  (void)::flock(*fd, LOCK_EX | LOCK_NB);
  return Status::success();
}

/// Writes the image to the temporary `tmp` (open as `fd`), fsyncs it and
/// renames it over `target`, then fsyncs the directory. On a failure before
/// the rename the temporary is removed.
Status writeAndRename(int fd, const std::string &tmp, const Prepared &p,
                      const std::vector<TensorRef> &tensors,
                      const std::string &target, const std::string &dir,
                      const std::string &where) {
  auto fail = [&](const std::string &what, int err) {
    if (fd >= 0)
      ::close(fd);
    ::unlink(tmp.c_str());
    return Status::error(Code::Io, where + what + ": " + errnoText(err));
  };
  int err = 0;
  uint64_t written = 0;
  if (!writeAll(fd, p.head.data(), 8, &err, &written) ||
      !writeAll(fd, p.head.data() + 8, p.head.size() - 8, &err, &written))
    return fail("writing the header to " + quote(tmp), err);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (p.size[i] > 0 &&
        !writeAll(fd, tensors[i].data, size_t(p.size[i]), &err, &written))
      return fail("writing tensor " + quote(tensors[i].name) + " to " +
                      quote(tmp),
                  err);
  if (faultAt(WriteStage::Fsync, &err))
    return fail("fsync of " + quote(tmp), err);
  if (::fsync(fd) != 0)
    return fail("fsync of " + quote(tmp), errno);
  if (faultAt(WriteStage::Rename, &err))
    return fail("renaming " + quote(tmp) + " to the target", err);
  // Rename while still holding the lock, then close.
  if (::rename(tmp.c_str(), target.c_str()) != 0)
    return fail("renaming " + quote(tmp) + " to the target", errno);
  if (::close(fd) != 0)
    return Status::error(Code::Io, where + "written, but closing it failed: " +
                                       errnoText(errno));

  // Make the rename durable.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return Status::error(
        Code::Io, where + "written, but opening its directory " + quote(dir) +
                      " to fsync it failed: " + errnoText(errno));
  int syncResult = ::fsync(dfd);
  int syncErr = errno;
  ::close(dfd);
  if (syncResult != 0 && syncErr != EINVAL) // EINVAL: not supported there
    return Status::error(Code::Io,
                         where + "written, but the fsync of its directory " +
                             quote(dir) + " failed: " + errnoText(syncErr));
  return Status::success();
}

} // namespace

Status write_file(const std::string &path, const std::vector<TensorRef> &tensors,
                  const std::map<std::string, std::string> &metadata) {
  const std::string where = path + ": ";
  std::string target, dir, base;
  if (Status s = checkTarget(path, where, &target, &dir, &base); !s)
    return s;
  try {
    Expected<Prepared> p = prepare(tensors, metadata, where);
    if (!p)
      return p.status();
    removeStaleTemporaries(dir, base);
    std::string tmp;
    int fd = -1;
    if (Status s = createTemporary(dir, base, where, &tmp, &fd); !s)
      return s;
    return writeAndRename(fd, tmp, *p, tensors, target, dir, where);
  } catch (const std::bad_alloc &) {
    return Status::error(Code::OutOfMemory, where + "out of memory");
  } catch (const std::exception &e) {
    return Status::error(Code::Internal, where + "internal error: " + e.what());
  }
}

Expected<std::vector<uint8_t>>
serialize(const std::vector<TensorRef> &tensors,
          const std::map<std::string, std::string> &metadata) {
  const std::string where = "safetensors: ";
  try {
    Expected<Prepared> p = prepare(tensors, metadata, where);
    if (!p)
      return p.status();
    size_t total = p->head.size();
    for (int64_t n : p->size)
      total += size_t(n);
    std::vector<uint8_t> out;
    out.reserve(total);
    out.insert(out.end(), p->head.begin(), p->head.end());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto *d = static_cast<const uint8_t *>(tensors[i].data);
      out.insert(out.end(), d, d + p->size[i]);
    }
    return out;
  } catch (const std::bad_alloc &) {
    return Status::error(Code::OutOfMemory, where + "out of memory");
  } catch (const std::exception &e) {
    return Status::error(Code::Internal, where + "internal error: " + e.what());
  }
}

} // namespace flashopt::host::safetensors
