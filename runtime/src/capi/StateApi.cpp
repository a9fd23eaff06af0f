//===- StateApi.cpp - The C ABI: master weights, numerics, checkpoints ----===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// fp32 master weights and states in and out (one parameter, one state at a
/// time), check_numerics (numerics.md §4.3), and checkpoint save/load to
/// files or buffers: the checks of the C arguments, then one call into the
/// checkpoint module (checkpoint/Checkpoint.h, checkpoint/MasterWeights.h)
/// over the optimizer object's Subject.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "Bundles.h"
#include "Errors.h"
#include "Handles.h"
#include "Objects.h"
#include "checkpoint/Checkpoint.h"
#include "checkpoint/MasterWeights.h"
#include "codec/Codec.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace flashopt::capi;
namespace checkpoint = flashopt::checkpoint;

namespace {
/// numerics.md §4.3: the exponent bits of a parameter dtype.
int exponentBits(DType t) { return t == DType::F16 ? 5 : 8; }

/// Fails unless `format` is a flashopt_checkpoint_format.
checkpoint::Form checkFormat(flashopt_checkpoint_format format) {
  if (format != FLASHOPT_CHECKPOINT_COMPRESSED &&
      format != FLASHOPT_CHECKPOINT_F32)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "unknown checkpoint format " + std::to_string(int(format)));
  return format == FLASHOPT_CHECKPOINT_F32 ? checkpoint::Form::F32
                                           : checkpoint::Form::Compressed;
}
} // namespace

extern "C" {

// ---- master weights and numerics -------------------------------------------

namespace {
/// Fails unless `index` is a parameter of `numel` elements.
void checkNumel(const OptObj &o, int64_t index, int64_t numel) {
  checkIndex(o, index);
  if (numel != o.params[size_t(index)].numel)
    fail(FLASHOPT_ERROR_SIZE,
         o.describe(index) + ": numel " + std::to_string(numel) +
             ", but it has " + std::to_string(o.params[size_t(index)].numel));
}
} // namespace

flashopt_status flashopt_export_master_f32(flashopt_optimizer opt,
                                           int64_t index, float *out,
                                           int64_t numel) {
  return guard("flashopt_export_master_f32", [&] {
    needOut(out, "out");
    Locked o(opt);
    checkNumel(*o, index, numel);
    std::vector<float> v =
        o->take(checkpoint::export_master(o->subject(), index));
    std::memcpy(out, v.data(), v.size() * sizeof(float));
  });
}

namespace {
/// The stored state named `state`, or an INVALID_ARGUMENT naming the states
/// there are.
const StateSpec &stateArg(const OptObj &o, const char *state) {
  needOut(state, "state");
  if (const StateSpec *s = checkpoint::stored_state(*o.m, state))
    return *s;
  std::string names;
  for (const StateSpec &s : o.m->states)
    if (!flashopt::abi::state_buffers(s).empty())
      names += (names.empty() ? "" : ", ") + quote(s.name);
  fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
       o.m->name + " stores no state " + quote(state) + " (it stores " +
           (names.empty() ? std::string("none") : names) + ")");
}
} // namespace

namespace {
/// The size in bytes of library-owned buffer `name` of parameter `index`
/// (dtype_bytes: ceil(n / 2) for the packed 4-bit codes), or an
/// INVALID_ARGUMENT naming the buffers there are.
int64_t bufferBytes(const OptObj &obj, int64_t index, const std::string &name) {
  const OptObj *o = &obj;
  checkIndex(*o, index);
  const Manifest &m = *o->m;
  const int64_t numel = o->params[size_t(index)].numel;
  const int64_t ng = (numel + m.group_size - 1) / m.group_size;
  const flashopt::abi::BufferSpec *found = nullptr;
  std::string names;
  for (const flashopt::abi::BufferSpec *b : ownedBuffers(m)) {
    names += (names.empty() ? "" : ", ") + quote(b->name);
    if (b->name == name)
      found = b;
  }
  if (!found)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         m.name + " has no buffer " + quote(name) + " (it has " +
             (names.empty() ? std::string("none") : names) + ")");
  return int64_t(dtype_bytes(found->dtype,
                             uint64_t(found->per == Per::Group ? ng : numel)));
}

/// Checks that `name` is a library-owned buffer of parameter `index` of
/// `size` bytes (flashopt_read_buffer / flashopt_write_buffer).
void checkBuffer(const OptObj &obj, int64_t index, const std::string &name,
                 size_t size) {
  const OptObj *o = &obj;
  const int64_t bytes = bufferBytes(obj, index, name);
  if (size != size_t(bytes))
    fail(FLASHOPT_ERROR_SIZE, o->describe(index) + ": buffer " + quote(name) +
                                  " is " + std::to_string(bytes) +
                                  " bytes, not " + std::to_string(size));
}
} // namespace

flashopt_status flashopt_buffer_size(flashopt_optimizer opt, int64_t index,
                                     const char *buffer, size_t *bytes) {
  return guard("flashopt_buffer_size", [&] {
    needOut(buffer, "buffer");
    needOut(bytes, "bytes");
    Locked o(opt);
    *bytes = size_t(bufferBytes(*o, index, buffer));
  });
}

flashopt_status flashopt_read_buffer(flashopt_optimizer opt, int64_t index,
                                     const char *buffer, void *out,
                                     size_t size) {
  return guard("flashopt_read_buffer", [&] {
    needOut(buffer, "buffer");
    needOut(out, "out");
    Locked o(opt);
    checkBuffer(*o, index, buffer, size);
    std::vector<uint8_t> v = o->read(index, buffer);
    std::memcpy(out, v.data(), v.size());
  });
}

flashopt_status flashopt_write_buffer(flashopt_optimizer opt, int64_t index,
                                      const char *buffer, const void *in,
                                      size_t size) {
  return guard("flashopt_write_buffer", [&] {
    needOut(buffer, "buffer");
    needOut(in, "in");
    Locked o(opt);
    checkBuffer(*o, index, buffer, size);
    o->write(index, buffer, in, int64_t(size));
  });
}

flashopt_status flashopt_export_state_f32(flashopt_optimizer opt, int64_t index,
                                          const char *state, float *out,
                                          int64_t numel) {
  return guard("flashopt_export_state_f32", [&] {
    needOut(out, "out");
    Locked o(opt);
    const StateSpec &s = stateArg(*o, state);
    checkNumel(*o, index, numel);
    std::vector<float> v =
        o->take(checkpoint::export_state(o->subject(), index, s));
    std::memcpy(out, v.data(), v.size() * sizeof(float));
  });
}

flashopt_status flashopt_import_state_f32(flashopt_optimizer opt, int64_t index,
                                          const char *state, const float *in,
                                          int64_t numel) {
  return guard("flashopt_import_state_f32", [&] {
    needOut(in, "in");
    Locked o(opt);
    const StateSpec &s = stateArg(*o, state);
    checkNumel(*o, index, numel);
    o->check(checkpoint::import_state(o->subject(), index, s, in));
  });
}

namespace {
/// The master encoding (param_dtype, correction) of the codec entry points,
/// or an INVALID_ARGUMENT naming what is wrong.
std::optional<DType> masterEncoding(flashopt_dtype param_dtype,
                                    flashopt_dtype correction_dtype,
                                    bool hasCorrection, int64_t n,
                                    const char *fn) {
  if (!validDtype(int(param_dtype)) ||
      (hasCorrection && !validDtype(int(correction_dtype))))
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         std::string(fn) + ": " +
             dtypeText(validDtype(int(param_dtype)) ? int(correction_dtype)
                                                    : int(param_dtype)));
  std::optional<DType> corr;
  if (hasCorrection)
    corr = toHost(correction_dtype);
  if (!codec::valid_master_encoding(toHost(param_dtype), corr))
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         std::string(fn) + ": a " + dtype_name(toHost(param_dtype)) +
             " parameter " +
             (corr ? std::string("with a ") + dtype_name(*corr) +
                         " correction term"
                   : std::string("without a correction term")) +
             " is no master-weight encoding (bf16 or f16 with i8 or i16, or "
             "any float parameter alone)");
  if (n < 0)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         std::string(fn) + ": n is " + std::to_string(n));
  return corr;
}
} // namespace

flashopt_status flashopt_decode_master_f32(flashopt_dtype param_dtype,
                                           const void *param,
                                           flashopt_dtype correction_dtype,
                                           const void *correction, int64_t n,
                                           float *out) {
  return guard("flashopt_decode_master_f32", [&] {
    std::optional<DType> corr =
        masterEncoding(param_dtype, correction_dtype, correction != nullptr, n,
                       "flashopt_decode_master_f32");
    if (n == 0)
      return;
    needOut(param, "param");
    needOut(out, "out");
    codec::decode_master(param, toHost(param_dtype), correction, corr, n, out);
  });
}

flashopt_status flashopt_encode_master_f32(const float *in, int64_t n,
                                           flashopt_dtype param_dtype,
                                           void *param,
                                           flashopt_dtype correction_dtype,
                                           void *correction) {
  return guard("flashopt_encode_master_f32", [&] {
    std::optional<DType> corr =
        masterEncoding(param_dtype, correction_dtype, correction != nullptr, n,
                       "flashopt_encode_master_f32");
    if (n == 0)
      return;
    needOut(in, "in");
    needOut(param, "param");
    codec::encode_master(in, n, param, toHost(param_dtype), correction, corr);
  });
}

flashopt_status flashopt_import_master_f32(flashopt_optimizer opt,
                                           int64_t index, const float *in,
                                           int64_t numel) {
  return guard("flashopt_import_master_f32", [&] {
    needOut(in, "in");
    Locked o(opt);
    checkNumel(*o, index, numel);
    o->check(checkpoint::check_master_fits(o->subject(), index, in,
                                           flashopt::abi::Code::InvalidArgument,
                                           "flashopt_import_master_f32"));
    o->check(checkpoint::import_master(o->subject(), index, in));
  });
}

flashopt_status flashopt_check_numerics(flashopt_optimizer opt,
                                        flashopt_numerics_report *out) {
  return guard("flashopt_check_numerics", [&] {
    Locked o(opt);
    const Manifest &m = *o->m;
    flashopt_numerics_report r{};
    r.first_param = -1;
    r.first_group = -1;
    // numerics.md §4.3: bits of the master weight, mantissa bits M that
    // survive, the step needed to move max|w|, and the step lr * k gives.
    int bits =
        dtype_bits(m.param) + (m.correction ? dtype_bits(*m.correction) : 0);
    double M = double(bits - 1 - exponentBits(m.param)) + std::log2(0.49);
    double k = (m.rule == "adam" || m.rule == "adamw") ? 0.1 : 1.0;
    int lrIndex = m.hyper_index("lr");
    std::string firstNonfinite, firstSmall;
    for (size_t i = 0; i < o->params.size(); ++i) {
      ++r.params_checked;
      std::vector<float> w =
          o->take(checkpoint::export_master(o->subject(), int64_t(i)));
      double maxabs = 0;
      bool finite = true;
      for (float x : w) {
        if (!std::isfinite(x)) {
          finite = false;
          break;
        }
        maxabs = std::max(maxabs, double(std::fabs(x)));
      }
      if (!finite) {
        if (r.nonfinite_params++ == 0)
          firstNonfinite = o->describe(int64_t(i)) + " holds NaN or Inf";
        continue;
      }
      if (lrIndex < 0 || maxabs <= 0)
        continue;
      const ParamRec &p = o->params[i];
      double lr =
          double(o->opt->hyper_table()[size_t(p.group) * m.hypers.size() +
                                       size_t(lrIndex)]);
      if (lr <= 0)
        continue;
      double need = std::floor(std::log2(maxabs)) - M;
      double have = std::log2(lr * k);
      if (need > have) {
        if (r.params_too_small++ == 0) {
          r.first_param = int64_t(i);
          r.first_group = p.group;
          r.max_abs = maxabs;
          r.lr = lr;
          r.min_lr = std::exp2(need) / k;
          firstSmall =
              o->describe(int64_t(i)) + " in param group " +
              std::to_string(p.group) + ": lr " + fmt(lr) +
              " cannot move its largest weight (max |w| = " + fmt(maxabs) +
              ") with " + std::to_string(bits) +
              "-bit master weights; the smallest lr that does is " +
              fmt(r.min_lr);
        }
      }
    }
    if (out)
      *out = r;
    if (r.params_too_small || r.nonfinite_params) {
      std::string msg = !firstSmall.empty() ? firstSmall : firstNonfinite;
      if (r.params_too_small > 1)
        msg += " (and " + std::to_string(r.params_too_small - 1) +
               " more parameters)";
      if (!firstSmall.empty() && r.nonfinite_params)
        msg += "; " + firstNonfinite;
      fail(FLASHOPT_ERROR_NUMERICS, msg);
    }
  });
}

// ---- checkpoints -----------------------------------------------------------

flashopt_status flashopt_save_checkpoint(flashopt_optimizer opt,
                                         const char *path,
                                         flashopt_checkpoint_format format) {
  return guard("flashopt_save_checkpoint", [&] {
    needOut(path, "path");
    checkpoint::Form form = checkFormat(format);
    Locked o(opt);
    o->check(checkpoint::save_file(o->subject(), path, form));
  });
}

flashopt_status flashopt_load_checkpoint(flashopt_optimizer opt,
                                         const char *path) {
  return guard("flashopt_load_checkpoint", [&] {
    needOut(path, "path");
    Locked o(opt);
    // A missing file is NOT_FOUND (a status of the C ABI alone).
    int err = 0;
    if (!fileExists(path, &err))
      fail(err == ENOENT || err == ENOTDIR ? FLASHOPT_ERROR_NOT_FOUND
                                           : FLASHOPT_ERROR_IO,
           "checkpoint file " + quote(path) + ": " + std::strerror(err));
    o->check(checkpoint::load_file(o->subject(), path));
  });
}

flashopt_status
flashopt_save_checkpoint_buffer(flashopt_optimizer opt,
                                flashopt_checkpoint_format format, void **data,
                                size_t *size) {
  return guard("flashopt_save_checkpoint_buffer", [&] {
    needOut(data, "data");
    needOut(size, "size");
    checkpoint::Form form = checkFormat(format);
    Locked o(opt);
    std::vector<uint8_t> bytes =
        o->take(checkpoint::save_buffer(o->subject(), form));
    // malloc'ed, so that flashopt_buffer_free (free) releases it; at least
    // one byte (malloc(0) may return NULL).
    void *out = std::malloc(std::max<size_t>(bytes.size(), 1));
    if (!out)
      fail(FLASHOPT_ERROR_OUT_OF_MEMORY, "allocating " +
                                             std::to_string(bytes.size()) +
                                             " bytes for the checkpoint");
    std::memcpy(out, bytes.data(), bytes.size());
    *data = out;
    *size = bytes.size();
  });
}

flashopt_status flashopt_load_checkpoint_buffer(flashopt_optimizer opt,
                                                const void *data, size_t size) {
  return guard("flashopt_load_checkpoint_buffer", [&] {
    if (size > 0)
      needOut(data, "data");
    Locked o(opt);
    o->check(checkpoint::load_buffer(o->subject(), data, size));
  });
}

void flashopt_buffer_free(void *data) { std::free(data); }

} // extern "C"
