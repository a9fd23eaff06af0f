//===- Params.cpp - Registering parameters and gradients ------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The checks of flashopt_add_param(_dlpack) and flashopt_set_grad(_dlpack):
/// names (unique, no clash between checkpoint tensor names), dtypes, sizes,
/// alignment, and memory registered once.
///
//===----------------------------------------------------------------------===//

#include "Params.h"

#include "checkpoint/Format.h"

namespace flashopt::capi {

/// Whether `s` is well-formed UTF-8 (no overlong forms, no surrogates, at
/// most U+10FFFF) with no NUL byte.
static bool validUtf8(const std::string &s) {
  const auto *p = reinterpret_cast<const unsigned char *>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned c = p[i];
    if (c == 0)
      return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n)
      return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80)
        return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

/// A piece's address: the alignment the backend's kernels need (any on the
/// CPU, 16 bytes on CUDA).
static void checkPieceAddress(OptObj &o, const std::string &who,
                              const char *what, const void *address) {
  Status s = o.opt->backend().check_address(who.c_str(), what, address);
  if (!s)
    fail(s);
}

void addParam(OptObj &o, int32_t group, const char *cname, void *param,
              flashopt_dtype pdt, int64_t numel, const void *grad,
              flashopt_dtype gdt, std::vector<int64_t> shape,
              int64_t *out_index, int64_t elementOffset) {
  needOut(out_index, "out_index");
  const bool piece = elementOffset != kWholeTensor;
  int64_t index = int64_t(o.params.size());
  if (o.dp())
    fail(FLASHOPT_ERROR_STATE,
         "parameter " + std::to_string(index) +
             ": a communicator is attached; every parameter must be "
             "registered before flashopt_optimizer_attach_comm");
  if (cname && !*cname)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "parameter " + std::to_string(index) +
             ": the name is empty (pass NULL for \"p<index>\")");
  std::string name = cname ? cname : "p" + std::to_string(index);
  // Names become checkpoint tensor names (JSON strings of a safetensors
  // header): they must be valid UTF-8 and must not be the metadata key.
  if (!validUtf8(name))
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "parameter " + std::to_string(index) +
             ": the name is not valid UTF-8 (checkpoint tensor names are "
             "JSON strings)");
  if (name == "__metadata__")
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "parameter " + std::to_string(index) +
             ": the name \"__metadata__\" is reserved by the safetensors "
             "checkpoint format");
  std::string who = "parameter " + quote(name);
  checkGroup(o, group);
  if (!param)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT, who + ": the param pointer is NULL");
  if (numel <= 0)
    fail(FLASHOPT_ERROR_SIZE,
         who + ": numel must be > 0, got " + std::to_string(numel));
  if (numel > (int64_t(1) << 56))
    fail(FLASHOPT_ERROR_SIZE,
         who + ": numel " + std::to_string(numel) + " is too large");
  const Manifest &m = *o.m;
  if (!validDtype(pdt) || toHost(pdt) != m.param)
    fail(FLASHOPT_ERROR_DTYPE, who + ": param dtype is " + dtypeText(pdt) +
                                   ", but " + m.name + " takes " +
                                   dtype_name(m.param) + " parameters");
  if (grad && (!validDtype(gdt) || toHost(gdt) != m.grad))
    fail(FLASHOPT_ERROR_DTYPE, who + ": grad dtype is " + dtypeText(gdt) +
                                   ", but " + m.name + " takes " +
                                   dtype_name(m.grad) + " gradients");
  if (piece) {
    if (elementOffset < 0 || elementOffset % m.group_size != 0)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           who + ": the element offset " + std::to_string(elementOffset) +
               " is not a nonnegative multiple of the group size " +
               std::to_string(m.group_size));
    checkPieceAddress(o, who, "param", param);
    if (grad)
      checkPieceAddress(o, who, "grad", grad);
  } else if (uintptr_t(param) % 16 != 0 || uintptr_t(grad) % 16 != 0) {
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         who + ": the " + (uintptr_t(param) % 16 ? "param" : "grad") +
             " address is not 16-byte aligned");
  }
  // Names: unique, and no checkpoint tensor name shared with another
  // parameter ("w.correction" as a name next to a parameter "w").
  auto same = o.byName.find(name);
  if (same != o.byName.end())
    fail(FLASHOPT_ERROR_ALREADY_EXISTS,
         who + ": a parameter with this name is already registered (index " +
             std::to_string(same->second) + ")");
  std::vector<std::string> names = checkpoint::tensor_names(m, name);
  for (const std::string &n : names) {
    auto it = o.tensorNames.find(n);
    if (it != o.tensorNames.end())
      fail(FLASHOPT_ERROR_ALREADY_EXISTS, who + ": its checkpoint tensor " +
                                              quote(n) + " clashes with " +
                                              o.describe(it->second));
  }
  // Memory: the same (or overlapping) param memory is registered once.
  int64_t bytes = int64_t(dtype_bytes(m.param, uint64_t(numel)));
  uintptr_t lo = uintptr_t(param), hi = lo + uintptr_t(bytes);
  for (size_t i = 0; i < o.params.size(); ++i) {
    const ParamRec &p = o.params[i];
    if (lo < p.param + uintptr_t(p.paramBytes) && p.param < hi)
      fail(FLASHOPT_ERROR_ALREADY_EXISTS,
           who + ": its param memory " + (lo == p.param ? "is" : "overlaps") +
               " that of " + o.describe(int64_t(i)) + ", already registered");
  }
  Expected<int64_t> r =
      o.opt->add_param(group, param, numel, const_cast<void *>(grad));
  if (!r)
    fail(r.status(), who + ": " + r.error());
  if (piece && elementOffset != 0) {
    // Only a failure to rebuild the tensor table can fail here (the offset
    // was checked above).
    if (Status st = o.opt->set_element_offset(*r, elementOffset); !st)
      fail(st, who + ": " + st.message());
  }
  ParamRec rec;
  rec.name = name;
  rec.numel = numel;
  rec.group = group;
  rec.shape = shape.empty() ? std::vector<int64_t>{numel} : std::move(shape);
  rec.param = lo;
  rec.paramBytes = bytes;
  rec.piece = piece;
  o.params.push_back(std::move(rec));
  o.byName.emplace(name, index);
  for (const std::string &n : names)
    o.tensorNames.emplace(n, index);
  *out_index = index;
}

void setGrad(OptObj &o, int64_t index, const void *grad, flashopt_dtype dt,
             int64_t numel) {
  checkGrad(o, index, grad, dt, numel);
  applyGrad(o, index, grad);
}

void checkGrad(OptObj &o, int64_t index, const void *grad, flashopt_dtype dt,
               int64_t numel) {
  checkIndex(o, index);
  const ParamRec &p = o.params[size_t(index)];
  std::string who = o.describe(index);
  if (!validDtype(dt) || toHost(dt) != o.m->grad)
    fail(FLASHOPT_ERROR_DTYPE, who + ": grad dtype is " + dtypeText(dt) +
                                   ", but " + o.m->name + " takes " +
                                   dtype_name(o.m->grad) + " gradients");
  if (numel != p.numel)
    fail(FLASHOPT_ERROR_SIZE, who + ": grad has " + std::to_string(numel) +
                                  " elements, the parameter " +
                                  std::to_string(p.numel));
  if (p.piece)
    checkPieceAddress(o, who, "grad", grad);
  else if (uintptr_t(grad) % 16 != 0)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         who + ": the grad address is not 16-byte aligned");
}

void applyGrad(OptObj &o, int64_t index, const void *grad) {
  Status s = o.opt->set_grad(index, const_cast<void *>(grad));
  if (!s)
    fail(s, o.describe(index) + ": " + s.message());
}

} // namespace flashopt::capi
