//===- Status.cpp - Errors with a code ------------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Status::from_exception, out of line: it asks the exception's dynamic
/// type, and Status.h is also compiled into code built without RTTI (the
/// compiler, like LLVM); this file is built with it (flashopt_abi_objects).
///
//===----------------------------------------------------------------------===//

#include "flashopt/abi/Status.h"

#include <new>

namespace flashopt::abi {

Status Status::from_exception(const std::exception &e,
                              const std::string &prefix) {
  return error(dynamic_cast<const std::bad_alloc *>(&e) ? Code::OutOfMemory
                                                        : Code::Internal,
               prefix + e.what());
}

} // namespace flashopt::abi
