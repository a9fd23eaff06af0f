//===- Errors.h - How the C ABI reports failure -----------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Every entry point runs its body in `guard`, which clears the thread-local
/// last error, turns an ApiError (status + message) into the status and the
/// message "<function>: <object>: <reason>", and every other exception into
/// OUT_OF_MEMORY or INTERNAL. Nothing escapes.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_ERRORS_H
#define FLASHOPT_CAPI_ERRORS_H

#include "flashopt/abi/Status.h"
#include "flashopt/flashopt.h"

#include <new>
#include <stdexcept>
#include <string>

/// Sets libflashopt's last error of the calling thread (what
/// flashopt_last_error returns) to `message` ("" clears it). For the
/// plug-ins built with the library (libflashopt_nccl): their entry points
/// run in their own guard(), over their own copy of last_error() (this
/// file's Errors.cpp compiled into them, hidden as everything of theirs
/// but their C ABI is), then hand the message over with this. Exported
/// with the C ABI (FLASHOPT_API) but declared in no public header: not part
/// of the ABI.
extern "C" FLASHOPT_API void
flashopt_internal_set_last_error(const char *message);

namespace flashopt::capi {

/// Thrown inside the C ABI layer only; caught by guard().
struct ApiError {
  flashopt_status status;
  std::string message;
};

/// Throws the ApiError that guard() turns into `s` and `message`.
[[noreturn]] void fail(flashopt_status s, std::string message);

/// The public status of an internal failure: the status of its code, which
/// the failing code set (abi/Status.h), whichever entry point called it.
flashopt_status statusOf(const abi::Status &s);
/// fail() with statusOf(s) and `message` (s's own with context added).
[[noreturn]] void fail(const abi::Status &s, std::string message);
/// fail() with statusOf(s) and s's own message.
[[noreturn]] void fail(const abi::Status &s);

/// The calling thread's last error message (flashopt_last_error).
std::string &last_error();

/// Runs `body` for entry point `fn`: clears the last error, maps failures to
/// a status and a message. No exception escapes.
template <typename F> flashopt_status guard(const char *fn, F &&body) noexcept {
  try {
    last_error().clear();
    body();
    return FLASHOPT_OK;
  } catch (const ApiError &e) {
    try {
      last_error() = std::string(fn) + ": " + e.message;
    } catch (...) {
    }
    return e.status;
  } catch (const std::bad_alloc &) {
    try {
      last_error() = std::string(fn) + ": out of memory";
    } catch (...) {
    }
    return FLASHOPT_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    try {
      last_error() = std::string(fn) + ": internal error: " + e.what();
    } catch (...) {
    }
    return FLASHOPT_ERROR_INTERNAL;
  } catch (...) {
    try {
      last_error() = std::string(fn) + ": internal error (unknown exception)";
    } catch (...) {
    }
    return FLASHOPT_ERROR_INTERNAL;
  }
}

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_ERRORS_H
