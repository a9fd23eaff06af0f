//===- Status.h - Status and Expected ---------------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `Status` (success, or an error: a code and a message) and `Expected<T>` (a
/// value or an error): how every fallible call of the ABI library and of
/// libflashopt's internal C++ layer reports failure. No exception crosses
/// these APIs.
///
/// The code is set where the failure happens, by the code that knows what
/// went wrong (a layout mismatch, a missing kernel, a failed driver call);
/// the C ABI turns it into a `flashopt_status` in one place
/// (runtime/src/capi/Errors.h). Messages are for people: nothing reads a
/// code back out of one.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_ABI_STATUS_H
#define FLASHOPT_ABI_STATUS_H

#include <exception>
#include <new>
#include <optional>
#include <string>
#include <utility>

namespace flashopt::abi {

/// What kind of failure a Status reports: the kinds the library's own code
/// tells apart. The values are those of the C ABI's `flashopt_status`
/// (flashopt.h) of the same name; the C ABI checks that they agree. Every
/// producer names one, by what went wrong (not by who asked); there is no
/// error without a kind.
enum class Code : int {
  Ok = 0,
  /// A value out of range, a bad enum, a null pointer, an unknown name or
  /// index.
  InvalidArgument = 1,
  /// No usable device: no driver library (or one that lacks an entry point
  /// or does not initialize), no GPU, a device ordinal that does not exist.
  Device = 4,
  /// The call is not valid now (a missing gradient, a hyper-parameter that
  /// was never set, a bucket reduced twice).
  State = 8,
  /// A file's content is malformed: a manifest, a kernel's ABI description,
  /// a checkpoint, a safetensors header (opening or reading it is Io).
  Format = 9,
  /// Two things that must agree do not (ranks' layouts or steps).
  Mismatch = 10,
  /// Opening, reading or writing a file failed, or the path is not a
  /// regular file.
  Io = 11,
  /// An allocation failed (host or device memory).
  OutOfMemory = 12,
  /// Not possible on this device, by this bundle or with this engine.
  Unsupported = 13,
  /// A CUDA driver call failed.
  Cuda = 15,
  /// A bug in flashopt (an exception that is not an allocation failure, a
  /// broken invariant).
  Internal = 16,
  /// A collective of a communicator failed, or another rank did.
  Comm = 17,
};

/// Success, or an error: a code and a message.
class [[nodiscard]] Status {
public:
  Status() = default;
  static Status success() { return Status(); }
  /// An error of kind `code` (Internal for Code::Ok: a bug).
  static Status error(Code code, std::string message) {
    Status s;
    s.code_ = code == Code::Ok ? Code::Internal : code;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return code_ == Code::Ok; }
  explicit operator bool() const { return ok(); }
  /// Code::Ok on success.
  Code code() const { return code_; }
  /// The error message ("" on success).
  const std::string &message() const { return message_; }
  /// The same error with `prefix` before its message (the code kept).
  Status prefixed(const std::string &prefix) const {
    return error(code_, prefix + message_);
  }
  /// The error of exception `e`, caught where `prefix` says ("step: "):
  /// OutOfMemory for a std::bad_alloc, Internal for anything else (nothing
  /// in flashopt throws on purpose); the message is `prefix` + e.what().
  /// Defined in abi/src/Status.cpp, which is built with RTTI: this header is
  /// also compiled into the compiler's -fno-rtti code.
  static Status from_exception(const std::exception &e,
                               const std::string &prefix);

private:
  Code code_ = Code::Ok;
  std::string message_;
};

/// A value, or an error.
template <typename T> class [[nodiscard]] Expected {
public:
  Expected(T value) : value_(std::move(value)) {}
  Expected(Status error) : error_(std::move(error)) {
    if (error_.ok()) // an Expected built from a success has no value: a bug
      error_ = Status::error(Code::Internal,
                             "internal error: Expected built from success");
  }
  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  /// The value; only valid when ok().
  T &value() & { return *value_; }
  const T &value() const & { return *value_; }
  T &&value() && { return std::move(*value_); }
  T &operator*() & { return *value_; }
  const T &operator*() const & { return *value_; }
  T *operator->() { return &*value_; }
  const T *operator->() const { return &*value_; }
  /// The error (a success Status when ok()).
  const Status &status() const { return error_; }
  const std::string &error() const { return error_.message(); }
  /// The error's code (Code::Ok when ok()).
  Code code() const { return error_.code(); }

private:
  std::optional<T> value_;
  Status error_;
};

} // namespace flashopt::abi

#endif // FLASHOPT_ABI_STATUS_H
