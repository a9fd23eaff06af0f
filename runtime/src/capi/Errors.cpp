//===- Errors.cpp - How the C ABI reports failure
//--------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The thread-local last error and fail().
///
//===----------------------------------------------------------------------===//

#include "Errors.h"

namespace flashopt::capi {

std::string &last_error() {
  thread_local std::string message;
  return message;
}

void fail(flashopt_status s, std::string message) {
  throw ApiError{s, std::move(message)};
}

} // namespace flashopt::capi
