//===- Abi.h - The kernel ABI's names in flashopt::host ---------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The runtime reads the compiler↔runtime contract from the MLIR-free ABI
/// library (abi/: Status, dtypes, the kernel ABI constants, the manifest
/// model and its one reader): this header brings those names into
/// flashopt::host, where the rest of the runtime's internal layer lives.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_ABI_H
#define FLASHOPT_HOST_ABI_H

#include "flashopt/abi/DType.h"
#include "flashopt/abi/KernelAbi.h"
#include "flashopt/abi/Manifest.h"
#include "flashopt/abi/Status.h"

namespace flashopt::host {

using abi::Code;
using abi::Expected;
using abi::Status;

using abi::DType;
using abi::dtype_name;
using abi::dtype_bits;
using abi::dtype_bytes;
using abi::dtype_is_packed;
using abi::parse_dtype;

using abi::BufferRole;
using abi::BufferSpec;
using abi::BytesPerParam;
using abi::find_buffer;
using abi::HyperSpec;
using abi::KernelEntry;
using abi::load_manifest;
using abi::Manifest;
using abi::parse_manifest;
using abi::Per;
using abi::StateKind;
using abi::StateSpec;

} // namespace flashopt::host

#endif // FLASHOPT_HOST_ABI_H
