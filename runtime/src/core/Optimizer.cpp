//===- Optimizer.cpp - The backend-free optimizer core --------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The tensor registry, param groups, argument checks, the tensor table and
/// the step plan, once for every backend (gradient accumulation:
/// Accumulator.cpp; the shared state: OptimizerImpl.h). See Optimizer.h and
/// Backend.h.
///
/// Exceptions are used inside the core only (allocation) and are always
/// turned into a Status before returning to the caller.
///
//===----------------------------------------------------------------------===//

#include "OptimizerImpl.h"

#include "codec/Codec.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <optional>
#include <string>

namespace flashopt::host {

Backend::~Backend() = default;

Expected<std::shared_ptr<void>> Backend::allocate_scratch(int64_t bytes) {
  try {
    std::shared_ptr<uint8_t> p(new uint8_t[size_t(std::max<int64_t>(1, bytes))](),
                               std::default_delete<uint8_t[]>());
    return std::shared_ptr<void>(p, p.get());
  } catch (const std::bad_alloc &) {
    return Status::error(Code::OutOfMemory, "out of memory allocating " +
                                                std::to_string(bytes) +
                                                " bytes of scratch");
  }
}

Optimizer::Optimizer(std::unique_ptr<Backend> backend) : impl_(new Impl()) {
  Impl &I = *impl_;
  I.backend = std::move(backend);
  I.m = &I.backend->manifest();
  I.G = I.m->group_size;
  I.B = I.m->buffers.size();
  I.builtBases.assign(I.B, 0);
}

Optimizer::~Optimizer() = default;

Status Optimizer::init(const char *who) {
  Impl &I = *impl_;
  if (Status ok = HyperTable::check_manifest(*I.m); !ok)
    return ok;
  try {
    I.hypers = std::make_unique<HyperTable>(*I.m);
  } catch (const std::exception &e) {
    return Status::from_exception(e, std::string(who) + ": ");
  }
  if (I.hypers->add_slot() < 0)
    return Status::error(Code::OutOfMemory,
                         std::string(who) + ": out of memory");
  return Status::success();
}

const Manifest &Optimizer::manifest() const { return *impl_->m; }
Backend &Optimizer::backend() { return *impl_->backend; }
const Backend &Optimizer::backend() const { return *impl_->backend; }

// ---- param groups ----------------------------------------------------------

int Optimizer::add_param_group() { return impl_->hypers->add_slot(); }
int Optimizer::num_param_groups() const { return impl_->hypers->num_slots(); }
Status Optimizer::set_hyper(int slot, std::string_view name, float value) {
  return impl_->hypers->set(slot, name, value);
}
void Optimizer::note_hyper_step() { impl_->hypers->note_step(); }
Status Optimizer::restore_hyper(int slot, std::string_view name,
                                std::optional<float> value) {
  return impl_->hypers->restore(slot, name, value);
}
Status Optimizer::set_hyper_all(std::string_view name, float value) {
  return impl_->hypers->set_all(name, value);
}
Expected<float> Optimizer::hyper(int slot, std::string_view name) const {
  return impl_->hypers->get(slot, name);
}
const std::vector<float> &Optimizer::hyper_table() const {
  return impl_->hypers->values();
}
const HyperTable &Optimizer::hypers() const { return *impl_->hypers; }

// ---- tensors ---------------------------------------------------------------

Expected<int64_t> Optimizer::add_param(int slot, void *param, int64_t numel,
                                       void *grad) {
  Impl &I = *impl_;
  if (slot < 0 || slot >= I.hypers->num_slots())
    return Status::error(Code::InvalidArgument,
                         "add_param: param group " + std::to_string(slot) +
                             " does not exist (there are " +
                             std::to_string(I.hypers->num_slots()) + ")");
  if (!param)
    return Status::error(Code::InvalidArgument,
                         "add_param: null param pointer");
  if (numel <= 0)
    return Status::error(Code::InvalidArgument,
                         "add_param: numel must be > 0, got " +
                             std::to_string(numel));
  if (Status s = I.backend->check_address("add_param", "param", param); !s)
    return s;
  if (Status s = I.backend->check_address("add_param", "grad", grad); !s)
    return s;
  try {
    TensorInfo ti;
    ti.numel = numel;
    ti.first_group = I.totalGroups;
    ti.num_groups = (numel + I.G - 1) / I.G;
    ti.param_group = slot;
    ti.param = param;
    ti.grad = grad;
    // Everything that can fail comes first, so a failure leaves nothing
    // registered (arenas may have grown; their extra zeroed space is
    // harmless).
    I.tensors.reserve(I.tensors.size() + 1);
    I.offsets.reserve(I.offsets.size() + 1);
    I.recordStart.reserve(I.recordStart.size() + 1);
    std::vector<int64_t> offs(I.B, 0);
    for (size_t b = 0; b < I.B; ++b)
      if (I.runtimeOwned(b)) {
        Expected<int64_t> off = I.backend->reserve(
            b, I.m->buffers[b].per == Per::Group ? ti.num_groups : numel);
        if (!off)
          return off.status().prefixed("add_param: ");
        offs[b] = *off;
      }
    I.tensors.push_back(ti);
    I.offsets.push_back(std::move(offs));
    I.totalGroups += ti.num_groups;
    I.totalNumel += numel;
    I.dirty = true;
    I.refresh();
    return int64_t(I.tensors.size() - 1);
  } catch (const std::bad_alloc &) {
    return Status::error(Code::OutOfMemory,
                         "add_param: out of memory registering a tensor of " +
                         std::to_string(numel) + " elements");
  } catch (const std::exception &e) {
    return Status::from_exception(e, "add_param: ");
  }
}

Status Optimizer::set_grad(int64_t tensor, void *grad) {
  if (Status s = impl_->checkTensor(tensor, "set_grad"); !s)
    return s;
  return repoint(tensor, &TensorInfo::grad, grad, "set_grad", "grad");
}

Status Optimizer::set_param(int64_t tensor, void *param) {
  if (Status s = impl_->checkTensor(tensor, "set_param"); !s)
    return s;
  if (!param)
    return Status::error(Code::InvalidArgument,
                         "set_param: null param pointer");
  return repoint(tensor, &TensorInfo::param, param, "set_param", "param");
}

Status Optimizer::set_element_offset(int64_t tensor, int64_t offset) {
  if (Status s = impl_->checkTensor(tensor, "set_element_offset"); !s)
    return s;
  if (offset < 0)
    return Status::error(Code::InvalidArgument,
                         "set_element_offset: offset must be >= 0, got " +
                             std::to_string(offset));
  Impl &I = *impl_;
  TensorInfo &ti = I.tensors[size_t(tensor)];
  if (ti.element_offset != offset) {
    ti.element_offset = offset;
    I.dirty = true;
    try {
      I.refresh();
    } catch (const std::exception &e) {
      return Status::from_exception(e, "set_element_offset: ");
    }
  }
  return Status::success();
}

Status Optimizer::repoint(int64_t tensor, void *TensorInfo::*field,
                          void *address, const char *who, const char *what) {
  Impl &I = *impl_;
  if (Status s = I.backend->check_address(who, what, address); !s)
    return s;
  TensorInfo &ti = I.tensors[size_t(tensor)];
  if (ti.*field == address)
    return Status::success();
  ti.*field = address;
  try {
    I.repoint(size_t(tensor));
  } catch (const std::exception &e) {
    I.dirty = true;
    return Status::from_exception(e, std::string(who) + ": ");
  }
  return Status::success();
}

int64_t Optimizer::num_tensors() const {
  return int64_t(impl_->tensors.size());
}
int64_t Optimizer::total_groups() const { return impl_->totalGroups; }
int64_t Optimizer::total_numel() const { return impl_->totalNumel; }
const TensorInfo &Optimizer::tensor(int64_t i) const {
  return impl_->tensors[size_t(i)];
}
const std::vector<TensorInfo> &Optimizer::tensors() const {
  return impl_->tensors;
}
const std::vector<int64_t> &Optimizer::table() const { return impl_->table; }
int64_t Optimizer::num_records() const { return impl_->records; }

Status Optimizer::allocate() {
  try {
    return impl_->prepare();
  } catch (const std::exception &e) {
    return Status::from_exception(e, "allocate: ");
  }
}

Expected<BufferView> Optimizer::buffer(int64_t tensor, std::string_view name) {
  Impl &I = *impl_;
  if (Status s = I.checkTensor(tensor, "buffer"); !s)
    return s;
  Expected<int> found = find_buffer(*I.m, name);
  if (!found)
    return found.status();
  size_t b = size_t(*found);
  if (I.releasable(b) && I.released)
    return Status::error(
        Code::State,
        "buffer \"" + std::string(name) +
            "\" is not held here: this rank holds only its shard of the "
            "correction terms and states (sharded data parallelism)");
  if (I.runtimeOwned(b))
    if (Status s = allocate(); !s)
      return s;
  const BufferSpec &spec = I.m->buffers[b];
  const TensorInfo &ti = I.tensors[size_t(tensor)];
  BufferView v;
  v.data = reinterpret_cast<void *>(uintptr_t(I.address(size_t(tensor), b)));
  v.dtype = spec.dtype;
  v.per = spec.per;
  v.count = spec.per == Per::Group ? ti.num_groups : ti.numel;
  v.bytes = int64_t(dtype_bytes(spec.dtype, uint64_t(v.count)));
  v.runtime_owned = I.runtimeOwned(b);
  return v;
}

Expected<std::vector<uint8_t>> Optimizer::read_buffer(int64_t tensor,
                                                      std::string_view name) {
  Expected<BufferView> v = buffer(tensor, name);
  if (!v)
    return v.status();
  if (!v->data)
    return Status::error(Code::State, "read_buffer: tensor " +
                                          std::to_string(tensor) + " has no " +
                                          std::string(name) + " buffer yet");
  try {
    std::vector<uint8_t> out(size_t(v->bytes));
    if (Status s = impl_->backend->read(v->data, out.data(), v->bytes); !s)
      return s;
    return out;
  } catch (const std::exception &e) {
    return Status::from_exception(e, "read_buffer: ");
  }
}

Status Optimizer::write_buffer(int64_t tensor, std::string_view name,
                               const void *data, int64_t bytes) {
  Expected<BufferView> v = buffer(tensor, name);
  if (!v)
    return v.status();
  if (!v->data)
    return Status::error(Code::State, "write_buffer: tensor " +
                                          std::to_string(tensor) + " has no " +
                                          std::string(name) + " buffer yet");
  if (v->bytes != bytes)
    return Status::error(Code::InvalidArgument,
                         "write_buffer: buffer " + std::string(name) +
                             " of tensor " + std::to_string(tensor) +
                             " holds " + std::to_string(v->bytes) +
                             " bytes, not " + std::to_string(bytes));
  if (dtype_is_packed(v->dtype) && v->count % 2 != 0 && bytes > 0) {
    // The pad nibble (high nibble of the last byte) is always 0
    // (docs/KERNEL-ABI.md "Packed buffers").
    try {
      std::vector<uint8_t> copy(static_cast<const uint8_t *>(data),
                                static_cast<const uint8_t *>(data) + bytes);
      copy.back() &= 0x0F;
      return impl_->backend->write(v->data, copy.data(), bytes);
    } catch (const std::exception &e) {
      return Status::from_exception(e, "write_buffer: ");
    }
  }
  return impl_->backend->write(v->data, data, bytes);
}

// ---- stepping --------------------------------------------------------------

Status Optimizer::step() {
  Impl &I = *impl_;
  if (Status g = check_all_grads(I.tensors); !g)
    return g;
  if (Status s = I.hypers->check_complete(); !s)
    return s;
  if (I.released)
    return Status::error(Code::State,
                         "step: the correction terms and states were "
                         "released (sharded data parallelism steps the "
                         "shards)");
  int64_t t = I.t + 1;
  if (I.tensors.empty()) {
    I.t = t;
    return Status::success();
  }
  try {
    if (Status s = I.prepare(); !s)
      return s;
    LaunchRequest r;
    r.first_record = 0;
    r.num_records = I.records;
    r.group_begin = 0;
    r.group_end = I.totalGroups;
    r.step = t;
    I.hypers->note_step(); // the envelopes take this step's values
    if (Status s = I.backend->launch(r, I.table, I.tableGeneration, *I.hypers);
        !s)
      return s;
  } catch (const std::exception &e) {
    return Status::from_exception(e, "step: ");
  }
  I.t = t;
  return Status::success();
}

Status Optimizer::accumulate_tensors(const std::vector<int64_t> &indices) {
  if (!impl_->m->accumulator)
    return Status::error(
        Code::Unsupported,
        "accumulate: " + impl_->m->name +
            " has no gradient accumulator (its spec has no \"accumulator\"; "
            "add "
            "\"accumulator\": \"f32\" and regenerate it, docs/SPEC.md)");
  return step_tensors(indices, 1, abi::KernelKind::Accumulate);
}

Status Optimizer::step_tensors(const std::vector<int64_t> &indices, int64_t t,
                               abi::KernelKind kernel) {
  Impl &I = *impl_;
  if (kernel != abi::KernelKind::Step && !I.m->accumulator)
    return Status::error(Code::Unsupported,
                         std::string("step: ") + I.m->name + " has no " +
                             abi::kernel_kind_name(kernel) +
                             " kernel (no gradient accumulator)");
  if (Status s = check_step_indices(I.tensors, indices); !s)
    return s;
  if (Status s = I.hypers->check_complete(); !s)
    return s;
  if (indices.empty())
    return Status::success();
  if (I.released && kernel != abi::KernelKind::Accumulate)
    return Status::error(Code::State,
                         "step: the correction terms and states were "
                         "released (sharded data parallelism steps the "
                         "shards)");
  try {
    if (Status s = I.prepare(); !s)
      return s;
    const int64_t R = I.m->record_words;
    const int64_t a = indices.front(), b = indices.back() + 1;
    LaunchRequest r;
    r.step = t;
    r.kernel = kernel;
    if (b - a == int64_t(indices.size())) {
      r.first_record = I.recordStart[size_t(a)];
      r.num_records = I.recordStart[size_t(b)] - I.recordStart[size_t(a)];
      r.group_begin = I.tensors[size_t(a)].first_group;
      const TensorInfo &last = I.tensors[size_t(b - 1)];
      r.group_end = last.first_group + last.num_groups;
    } else {
      // Copy the tensors' records, renumbering word 1 from 0.
      I.compacted.clear();
      int64_t end = 0, nrec = 0;
      for (int64_t i : indices) {
        int64_t delta = end - I.tensors[size_t(i)].first_group;
        for (int64_t rec = I.recordStart[size_t(i)];
             rec < I.recordStart[size_t(i) + 1]; ++rec) {
          const int64_t *w = I.table.data() + rec * R;
          I.compacted.insert(I.compacted.end(), w, w + R);
          I.compacted[I.compacted.size() - size_t(R) +
                      size_t(abi::kRecordFirstGroup)] += delta;
          ++nrec;
        }
        end += I.tensors[size_t(i)].num_groups;
      }
      r.use_compacted = true;
      r.compacted = &I.compacted;
      r.num_records = nrec;
      r.group_begin = 0;
      r.group_end = end;
    }
    if (kernel != abi::KernelKind::Accumulate)
      I.hypers->note_step(); // the envelopes take this step's values
    return I.backend->launch(r, I.table, I.tableGeneration, *I.hypers);
  } catch (const std::exception &e) {
    return Status::from_exception(e, "step: ");
  }
}

Expected<bool> Optimizer::grads_finite(const std::vector<int64_t> &indices) {
  const Impl &I = *impl_;
  try {
    std::vector<ScanRange> ranges;
    for (int64_t i : indices) {
      if (i < 0 || i >= int64_t(I.tensors.size()))
        continue;
      const TensorInfo &ti = I.tensors[size_t(i)];
      if (ti.grad)
        ranges.push_back({ti.grad, ti.numel});
    }
    return I.backend->all_finite(ranges, I.m->grad);
  } catch (const std::exception &e) {
    return Status::from_exception(e, "grads_finite: ");
  }
}

Expected<std::vector<double>>
Optimizer::grad_sum_squares(const std::vector<int64_t> &indices) {
  const Impl &I = *impl_;
  try {
    std::vector<ScanRange> ranges;
    for (int64_t i : indices) {
      if (i < 0 || i >= int64_t(I.tensors.size()))
        return Status::error(Code::InvalidArgument,
                             "grad_sum_squares: no tensor " +
                                 std::to_string(i));
      const TensorInfo &ti = I.tensors[size_t(i)];
      ranges.push_back({ti.grad, ti.grad ? ti.numel : 0});
    }
    return I.backend->sum_squares(ranges, I.m->grad);
  } catch (const std::exception &e) {
    return Status::from_exception(e, "grad_sum_squares: ");
  }
}

int64_t Optimizer::step_count() const { return impl_->t; }
void Optimizer::set_step_count(int64_t t) { impl_->t = t; }
Status Optimizer::synchronize() { return impl_->backend->synchronize(); }

BytesReport Optimizer::bytes() const {
  const Impl &I = *impl_;
  BytesReport r =
      compute_bytes_report(*I.m, I.tensors, I.backend->allocated_bytes());
  if (I.released) {
    r.total -= r.correction + r.states;
    r.total_with_grad_release -= r.correction + r.states;
    r.correction = r.states = 0;
  }
  return r;
}

Status Optimizer::release_state() {
  Impl &I = *impl_;
  std::vector<bool> which(I.B, false);
  for (size_t b = 0; b < I.B; ++b)
    which[b] = I.releasable(b);
  if (Status s = I.backend->release_arenas(which); !s)
    return s;
  I.released = true;
  return Status::success();
}

bool Optimizer::state_released() const { return impl_->released; }

} // namespace flashopt::host
