//===- Tables.cpp - Hyper tables, tensor records, bytes reports -----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/host/Tables.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace flashopt::host {

Status HyperTable::check_manifest(const Manifest &m) {
  for (const StateSpec &s : m.states)
    if (s.kind == StateKind::Elided) {
      int h = m.hyper_index(s.elidable_if_zero);
      if (h < 0)
        continue; // the parser guarantees it exists
      const HyperSpec &hs = m.hypers[size_t(h)];
      if (hs.default_value && *hs.default_value != 0.0f)
        return Status::error(Code::Format,
                             m.path + ": state \"" + s.name +
                                 "\" is elided, but hyper-parameter \"" +
                                 hs.name + "\" defaults to a nonzero value");
    }
  return Status::success();
}

int HyperTable::add_slot() {
  size_t H = m_->hypers.size();
  try {
    // Reserve first, so the pushes below cannot throw.
    values_.reserve(values_.size() + H);
    given_.reserve(given_.size() + H);
  } catch (const std::exception &) {
    return -1;
  }
  for (const HyperSpec &h : m_->hypers) {
    values_.push_back(float(h.default_value.value_or(0.0)));
    given_.push_back(h.default_value.has_value());
  }
  ++generation_;
  return slots_++;
}

Status HyperTable::check(int slot, std::string_view name, int *index) const {
  if (slot < 0 || slot >= slots_)
    return Status::error(Code::InvalidArgument,
                         "param group " + std::to_string(slot) +
                             " does not exist (there are " +
                             std::to_string(slots_) + ")");
  int h = m_->hyper_index(name);
  if (h < 0) {
    std::string names;
    for (const HyperSpec &s : m_->hypers)
      names += (names.empty() ? "" : ", ") + s.name;
    return Status::error(Code::InvalidArgument,
                         "unknown hyper-parameter \"" + std::string(name) +
                             "\" for " + m_->name + " (known: " + names + ")");
  }
  *index = h;
  return Status::success();
}

Status HyperTable::set(int slot, std::string_view name, float value) {
  int h = -1;
  Status s = check(slot, name, &h);
  if (!s)
    return s;
  const HyperSpec &spec = m_->hypers[size_t(h)];
  if (spec.is_envelope())
    return Status::error(Code::InvalidArgument,
                         "hyper-parameter \"" + std::string(name) +
                             "\" is the running " + spec.envelope + " of \"" +
                             spec.envelope_of +
                             "\", kept by the runtime; set \"" +
                             spec.envelope_of + "\"");
  return restore(slot, name, value);
}

Status HyperTable::restore(int slot, std::string_view name,
                           std::optional<float> maybe) {
  int h = -1;
  Status s = check(slot, name, &h);
  if (!s)
    return s;
  if (!maybe) {
    if (!m_->hypers[size_t(h)].is_envelope())
      return Status::error(Code::InvalidArgument,
                           "hyper-parameter \"" + std::string(name) +
                               "\" needs a value");
    size_t i = size_t(slot) * m_->hypers.size() + size_t(h);
    if (given_[i]) {
      values_[i] = 0.0f;
      given_[i] = 0;
      ++generation_;
    }
    return Status::success();
  }
  const float value = *maybe;
  if (!std::isfinite(value))
    return Status::error(Code::InvalidArgument, "hyper-parameter \"" +
                                                    std::string(name) +
                                                    "\" must be finite");
  if (value != 0.0f)
    for (const StateSpec &st : m_->states)
      if (st.kind == StateKind::Elided && st.elidable_if_zero == name)
        return Status::error(Code::InvalidArgument,
                             "hyper-parameter \"" + std::string(name) +
                                 "\" must stay 0 in " + m_->name +
                                 ": its state \"" + st.name +
                                 "\" is elided (compile a spec that keeps it)");
  size_t i = size_t(slot) * m_->hypers.size() + size_t(h);
  // Compare bits: a plain re-set of the same value is not a change.
  bool same = given_[i] && std::memcmp(&values_[i], &value, sizeof value) == 0;
  values_[i] = value;
  given_[i] = 1;
  if (!same)
    ++generation_;
  return Status::success();
}

Status HyperTable::set_all(std::string_view name, float value) {
  for (int g = 0; g < slots_; ++g) {
    Status s = set(g, name, value);
    if (!s)
      return s;
  }
  return Status::success();
}

Expected<float> HyperTable::get(int slot, std::string_view name) const {
  int h = -1;
  Status s = check(slot, name, &h);
  if (!s)
    return s;
  return values_[size_t(slot) * m_->hypers.size() + size_t(h)];
}

void HyperTable::note_step() {
  const size_t H = m_->hypers.size();
  for (size_t h = 0; h < H; ++h) {
    const HyperSpec &spec = m_->hypers[h];
    if (!spec.is_envelope())
      continue;
    const size_t src = size_t(m_->hyper_index(spec.envelope_of));
    const bool keepMax = spec.envelope == "max";
    for (int s = 0; s < slots_; ++s) {
      const size_t i = size_t(s) * H + h;
      const float v = values_[size_t(s) * H + src];
      float next = v;
      if (given_[i])
        next = keepMax ? std::max(values_[i], v) : std::min(values_[i], v);
      if (!given_[i] || std::memcmp(&next, &values_[i], sizeof next) != 0) {
        values_[i] = next;
        given_[i] = 1;
        ++generation_;
      }
    }
  }
}

Status HyperTable::check_complete() const {
  size_t H = m_->hypers.size();
  for (int s = 0; s < slots_; ++s)
    for (size_t h = 0; h < H; ++h)
      if (!given_[size_t(s) * H + h] && !m_->hypers[h].is_envelope())
        return Status::error(Code::State,
                             "step: hyper-parameter \"" + m_->hypers[h].name +
                             "\" has no default and was never set for param "
                             "group " +
                             std::to_string(s));
  return Status::success();
}

std::vector<RecordSlice> split_records(int64_t numel, int64_t group_size,
                                       int64_t max_record_elements) {
  std::vector<RecordSlice> out;
  if (numel <= 0)
    return out;
  int64_t unit = abi::kSliceAlignEntries * std::max<int64_t>(1, group_size);
  if (numel <= max_record_elements) {
    out.push_back({0, numel});
    return out;
  }
  int64_t piece = std::max<int64_t>(unit, max_record_elements / unit * unit);
  out.reserve(size_t((numel + piece - 1) / piece));
  for (int64_t off = 0; off < numel; off += piece)
    out.push_back({off, std::min(piece, numel - off)});
  return out;
}

int64_t gpu_max_record_elements(int64_t group_size) {
  int64_t unit = abi::kSliceAlignEntries * std::max<int64_t>(1, group_size);
  return std::max<int64_t>(unit, int64_t(std::numeric_limits<int32_t>::max()) /
                                     unit * unit);
}

int64_t append_table_records(const Manifest &m, const TensorInfo &t,
                             const std::vector<int64_t> &addresses,
                             int64_t max_record_elements,
                             std::vector<int64_t> &table) {
  const int64_t G = m.group_size;
  const size_t B = m.buffers.size();
  std::vector<RecordSlice> slices =
      split_records(t.numel, G, max_record_elements);
  for (const RecordSlice &r : slices) {
    size_t at = table.size();
    table.resize(at + size_t(abi::record_words(int64_t(B))), 0);
    int64_t *rec = table.data() + at;
    rec[abi::kRecordNumel] = r.numel;
    rec[abi::kRecordFirstGroup] = t.first_group + r.offset / G;
    rec[abi::kRecordHyperSlot] = t.param_group;
    rec[abi::kRecordElementOffset] = t.element_offset + r.offset;
    for (size_t b = 0; b < B; ++b) {
      const BufferSpec &spec = m.buffers[b];
      int64_t entries = spec.per == Per::Group ? r.offset / G : r.offset;
      // A null address (a grad not given yet) stays null.
      // Records split at multiples of 64 groups: an even element offset,
      // so whole bytes of a packed (4-bit) buffer too.
      rec[abi::kTableHeaderWords + b] =
          addresses[b] == 0
              ? 0
              : addresses[b] +
                    int64_t(dtype_bytes(spec.dtype, uint64_t(entries)));
    }
  }
  return int64_t(slices.size());
}

BytesReport compute_bytes_report(const Manifest &m,
                                 const std::vector<TensorInfo> &tensors,
                                 int64_t runtime_allocated) {
  BytesReport r;
  for (const TensorInfo &ti : tensors)
    r.numel += ti.numel;
  for (const BufferSpec &spec : m.buffers) {
    // count x bits, per tensor (an odd-length packed buffer's last byte
    // holds its pad nibble).
    int64_t bytes = 0;
    for (const TensorInfo &ti : tensors)
      bytes += int64_t(dtype_bytes(
          spec.dtype, uint64_t(spec.per == Per::Group ? ti.num_groups : ti.numel)));
    switch (spec.role) {
    case BufferRole::Param:
      r.param += bytes;
      break;
    case BufferRole::Correction:
      r.correction += bytes;
      break;
    case BufferRole::Grad:
      r.grad += bytes;
      break;
    case BufferRole::State:
      r.states += bytes;
      break;
    case BufferRole::Accum:
      r.accumulator += bytes;
      break;
    }
  }
  r.runtime_allocated = runtime_allocated;
  r.total = r.param + r.correction + r.grad + r.states + r.accumulator;
  r.total_with_grad_release = r.total - r.grad;
  if (r.numel > 0) {
    double n = double(r.numel);
    r.per_param.param = double(r.param) / n;
    r.per_param.correction = double(r.correction) / n;
    r.per_param.grad = double(r.grad) / n;
    r.per_param.states = double(r.states) / n;
    r.per_param.accumulator = double(r.accumulator) / n;
    r.per_param.total = double(r.total) / n;
    r.per_param.total_with_grad_release = double(r.total_with_grad_release) / n;
  }
  return r;
}

namespace {
Status missing_grad(const std::vector<TensorInfo> &tensors, size_t i) {
  return Status::error(Code::State,
                       "step: tensor " + std::to_string(i) + " (numel " +
                           std::to_string(tensors[i].numel) +
                           ") has no gradient (add_param/set_grad)");
}
} // namespace

Status check_all_grads(const std::vector<TensorInfo> &tensors) {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!tensors[i].grad)
      return missing_grad(tensors, i);
  return Status::success();
}

Status check_step_indices(const std::vector<TensorInfo> &tensors,
                          const std::vector<int64_t> &indices) {
  const int64_t n = int64_t(tensors.size());
  for (size_t k = 0; k < indices.size(); ++k) {
    int64_t i = indices[k];
    if (i < 0 || i >= n)
      return Status::error(Code::InvalidArgument,
                           "step_tensors: no tensor " + std::to_string(i) +
                               " (there are " + std::to_string(n) + ")");
    if (k > 0 && i <= indices[k - 1])
      return Status::error(Code::InvalidArgument,
                           "step_tensors: tensor indices must be ascending "
                           "and distinct");
    if (!tensors[size_t(i)].grad)
      return missing_grad(tensors, size_t(i));
  }
  return Status::success();
}

} // namespace flashopt::host
