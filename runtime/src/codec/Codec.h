//===- Codec.h - Host-side encodings of docs/NUMERICS.md --------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The runtime's own host implementation of the storage encodings of
/// docs/NUMERICS.md, for what the kernels do not do: exporting and importing
/// fp32 master weights (§1.3, §1.4) and the fp32 checkpoint form (states
/// dequantized, §2.4, and quantized again on load, §2.3). Every f32
/// operation is one IEEE rounding in the documented order (the library is
/// built with -ffp-contract=off), so decode agrees bit for bit with what the
/// generated kernels compute internally.
///
/// Internal to libflashopt (not installed).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_RUNTIME_CODEC_H
#define FLASHOPT_RUNTIME_CODEC_H

#include "flashopt/host/Abi.h"

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace flashopt::host::codec {

/// Whether (param_dtype, correction) is a master-weight encoding of §1:
/// param BF16/F16/F32; correction nullopt, or I8/I16 with a BF16/F16 param.
/// decode_master / encode_master require it (with an invalid pair they
/// fall back to plain widen / narrow and assert in debug builds).
bool valid_master_encoding(DType param_dtype, std::optional<DType> correction);
/// Whether a quantized encoding is one dequantize / quantize handle: codes
/// I8 or U8 with compander "none", "softsign" or "sqrt" (every combination
/// computed as §2 writes it; the manifest additionally restricts softsign to
/// I8 and sqrt to U8), or a minifloat in codes of its width and signedness
/// (I8 e3m4, U8 e4m4; the packed 4-bit codes I4 e2m1/e3m0, U4 e3m1/e4m0);
/// scales BF16/F16/F32; group > 0. With an invalid
/// encoding dequantize writes NaN, quantize writes nothing, and both assert
/// in debug builds.
bool valid_quant_encoding(DType code_dtype, DType scale_dtype,
                          std::string_view compand, int64_t group);

/// Widens `n` values of `dtype` (BF16, F16 or F32) to f32 (exact).
void widen(const void *in, DType dtype, int64_t n, float *out);
/// Narrows `n` f32 values to `dtype` (BF16, F16 or F32), RTNE, no FTZ.
void narrow(const float *in, int64_t n, DType dtype, void *out);

/// The fp32 master weights of `n` elements: param (BF16/F16/F32) plus, when
/// `correction` is I8 or I16, its correction term (§1.4). With no correction
/// this is widen().
void decode_master(const void *param, DType param_dtype, const void *corr,
                   std::optional<DType> correction, int64_t n, float *out);
/// The inverse (§1.3): param = RTNE narrowing of `in`, correction = the
/// encoded remainder (when `correction` is set).
void encode_master(const float *in, int64_t n, void *param, DType param_dtype,
                   void *corr, std::optional<DType> correction);

/// Dequantizes `n` elements of a quantized state (§2.4): codes (I8 or U8,
/// or I4/U4 packed two per byte, the even element in the low nibble, signed
/// nibbles two's complement), one scale (F16/BF16/F32) per `group`
/// elements, the compander of valid_quant_encoding.
void dequantize(const void *codes, DType code_dtype, const void *scales,
                DType scale_dtype, std::string_view compand, int64_t group,
                int64_t n, float *out);
/// Quantizes `n` f32 values (§2.3), writing ceil(n / group) scales. A tail
/// group is padded with zeros, as the kernels do. Packed codes take
/// dtype_bytes(code_dtype, n) bytes; an odd n's pad nibble is written 0.
void quantize(const float *in, int64_t n, int64_t group,
              std::string_view compand, void *codes, DType code_dtype,
              void *scales, DType scale_dtype);

/// The codec table, keyed by the manifest's encoding kind: state `s` of `n`
/// elements (groups of `group`) from its stored buffers to f32 values.
/// `buffers` holds one pointer per abi::state_buffers(s) entry, in order
/// (quantized: codes, scales; plain: the values; elided: none, and the
/// state reads as zeros).
void decode_state(const StateSpec &s, const std::vector<const void *> &buffers,
                  int64_t group, int64_t n, float *out);
/// The inverse: f32 values to the stored buffers of `s` (each sized as
/// abi::state_buffers says: n entries per element, ceil(n / group) per
/// group).
void encode_state(const StateSpec &s, const float *in, int64_t group,
                  int64_t n, const std::vector<void *> &buffers);

} // namespace flashopt::host::codec

#endif // FLASHOPT_RUNTIME_CODEC_H
