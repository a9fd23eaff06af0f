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

namespace {
/// Set when this thread's message has been destroyed (thread exit, or the
/// main thread at process exit, which runs before the destructors of
/// static objects). A bool is trivially destructible: readable until the end.
thread_local bool messageGone = false;
struct Message {
  std::string text;
  ~Message() { messageGone = true; }
};
} // namespace

std::string &last_error() {
  thread_local Message message;
  if (messageGone) {
    // A call from a static destructor (a global C++ wrapper object, the
    // fuzzer's optimizer): the thread's message is gone. Use one that is
    // never destroyed (shared; only such late calls reach it).
    static std::string *late = new std::string();
    return *late;
  }
  return message.text;
}

void fail(flashopt_status s, std::string message) {
  throw ApiError{s, std::move(message)};
}

} // namespace flashopt::capi
