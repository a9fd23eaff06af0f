//===- Errors.cpp - How the C ABI reports failure -------------------------===//
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

// The codes are the statuses of the same name (abi/Status.h).
#define FLASHOPT_SAME_CODE(code, status)                                       \
  static_assert(int(abi::Code::code) == int(status), #code " is " #status);
FLASHOPT_SAME_CODE(Ok, FLASHOPT_OK)
FLASHOPT_SAME_CODE(InvalidArgument, FLASHOPT_ERROR_INVALID_ARGUMENT)
FLASHOPT_SAME_CODE(Device, FLASHOPT_ERROR_DEVICE)
FLASHOPT_SAME_CODE(State, FLASHOPT_ERROR_STATE)
FLASHOPT_SAME_CODE(Format, FLASHOPT_ERROR_FORMAT)
FLASHOPT_SAME_CODE(Mismatch, FLASHOPT_ERROR_MISMATCH)
FLASHOPT_SAME_CODE(Io, FLASHOPT_ERROR_IO)
FLASHOPT_SAME_CODE(OutOfMemory, FLASHOPT_ERROR_OUT_OF_MEMORY)
FLASHOPT_SAME_CODE(Unsupported, FLASHOPT_ERROR_UNSUPPORTED)
FLASHOPT_SAME_CODE(Cuda, FLASHOPT_ERROR_CUDA)
FLASHOPT_SAME_CODE(Internal, FLASHOPT_ERROR_INTERNAL)
FLASHOPT_SAME_CODE(Comm, FLASHOPT_ERROR_COMM)
#undef FLASHOPT_SAME_CODE

flashopt_status statusOf(const abi::Status &s) {
  // Every code is the status of the same value (checked above).
  return flashopt_status(int(s.code()));
}

void fail(const abi::Status &s, std::string message) {
  fail(statusOf(s), std::move(message));
}

void fail(const abi::Status &s) { fail(statusOf(s), s.message()); }

} // namespace flashopt::capi
