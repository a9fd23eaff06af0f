//===- Status.h - Status and Expected ---------------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `Status` (success or a message) and `Expected<T>` (a value or a message):
/// how every fallible call of the ABI library and of libflashopt's internal
/// C++ layer reports failure. No exception crosses these APIs.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_ABI_STATUS_H
#define FLASHOPT_ABI_STATUS_H

#include <optional>
#include <string>
#include <utility>

namespace flashopt::abi {

/// Success, or an error message.
class [[nodiscard]] Status {
public:
  Status() = default;
  static Status success() { return Status(); }
  static Status error(std::string message) {
    Status s;
    s.failed_ = true;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  /// The error message ("" on success).
  const std::string &message() const { return message_; }

private:
  bool failed_ = false;
  std::string message_;
};

/// A value, or an error message.
template <typename T> class [[nodiscard]] Expected {
public:
  Expected(T value) : value_(std::move(value)) {}
  Expected(Status error) : error_(std::move(error)) {
    if (error_.ok()) // an Expected built from a success has no value: a bug
      error_ = Status::error("internal error: Expected built from success");
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

private:
  std::optional<T> value_;
  Status error_;
};

} // namespace flashopt::abi

#endif // FLASHOPT_ABI_STATUS_H
