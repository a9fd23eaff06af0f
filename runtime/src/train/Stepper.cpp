//===- Stepper.cpp - What a training step means ---------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The step's phases (agree, reduce, decide, clip, run, finish), gradient
/// release, accumulation and the policy setters. See Stepper.h.
///
//===----------------------------------------------------------------------===//

#include "Stepper.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <sstream>

namespace flashopt::train {

namespace {

const char *const kGradScale = abi::kGradScaleHyper;

std::string fmt(double v) {
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

/// "CPU" or "CUDA": the backend's kind as the messages name contexts.
std::string contextName(const host::Backend &b) {
  std::string s = b.kind();
  for (char &c : s)
    c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

} // namespace

//===----------------------------------------------------------------------===//
// Every group's grad_scale, changed for one step
//===----------------------------------------------------------------------===//

/// The caller's grad_scale values, remembered before the first change of a
/// step and put back when the step ends, however it ends.
class Stepper::GradScales {
public:
  explicit GradScales(host::Optimizer &opt) : opt_(opt) {}
  ~GradScales() { restore(); }
  GradScales(const GradScales &) = delete;
  GradScales &operator=(const GradScales &) = delete;

  /// Every group's grad_scale now; Unsupported when the bundle has none
  /// (`what` needs it).
  Expected<std::vector<float>> current(const std::string &what) const {
    const host::Manifest &m = opt_.manifest();
    if (m.hyper_index(kGradScale) < 0)
      return Status::error(Code::Unsupported,
                           what + " needs the kernels' \"grad_scale\", which " +
                               m.name +
                               " lacks (a bundle from an older "
                               "flashopt-gen): regenerate it");
    const int groups = opt_.num_param_groups();
    std::vector<float> v(static_cast<size_t>(groups));
    for (int g = 0; g < groups; ++g) {
      Expected<float> x = opt_.hyper(g, kGradScale);
      if (!x)
        return x.status();
      v[size_t(g)] = *x;
    }
    return v;
  }
  /// Sets every group's grad_scale to `values[g] * factor`, remembering
  /// `values` as the caller's when nothing was changed yet.
  Status set(const std::vector<float> &values, float factor) {
    if (saved_.empty())
      saved_ = values;
    for (size_t g = 0; g < values.size(); ++g)
      if (Status s = opt_.set_hyper(int(g), kGradScale, values[g] * factor); !s)
        return s;
    return Status::success();
  }
  /// Puts the caller's values back.
  void restore() {
    for (size_t g = 0; g < saved_.size(); ++g)
      (void)opt_.set_hyper(int(g), kGradScale, saved_[g]);
    saved_.clear();
  }

private:
  host::Optimizer &opt_;
  std::vector<float> saved_;
};

//===----------------------------------------------------------------------===//
// Counters
//===----------------------------------------------------------------------===//

Stepper::Stepper(host::Optimizer &opt, TensorNamer name)
    : opt_(opt), name_(std::move(name)) {}

Stepper::~Stepper() = default;

void Stepper::sync() {
  if (counters_.size() < size_t(opt_.num_tensors()))
    counters_.resize(size_t(opt_.num_tensors()));
}

std::vector<int64_t> Stepper::allTensors() const {
  std::vector<int64_t> all(size_t(opt_.num_tensors()));
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = int64_t(i);
  return all;
}

std::string Stepper::name(int64_t i) const {
  return name_ ? name_(i) : "tensor " + std::to_string(i);
}

int64_t Stepper::tensor_step(int64_t i) const {
  return i >= 0 && size_t(i) < counters_.size() ? counters_[size_t(i)].step : 0;
}

int64_t Stepper::accumulated(int64_t i) const {
  return i >= 0 && size_t(i) < counters_.size()
             ? counters_[size_t(i)].accumulated
             : 0;
}

bool Stepper::accumulation_pending() const {
  for (const Counters &c : counters_)
    if (c.accumulated > 0)
      return true;
  return false;
}

void Stepper::restore(const std::vector<int64_t> &tensor_steps, int64_t step,
                      int64_t skipped) {
  sync();
  for (size_t i = 0; i < counters_.size(); ++i)
    counters_[i].step = i < tensor_steps.size() ? tensor_steps[i] : 0;
  step_ = step;
  skipped_ = skipped;
  opt_.set_step_count(step);
}

//===----------------------------------------------------------------------===//
// Policy
//===----------------------------------------------------------------------===//

Status Stepper::set_nonfinite_policy(NonFinitePolicy policy) {
  if (policy == NonFinitePolicy::Skip && !opt_.backend().scans_gradients())
    return Status::error(Code::Unsupported,
                         "skipping steps on non-finite gradients is not "
                         "supported on " +
                             contextName(opt_.backend()) +
                             " contexts yet (it needs a device-side gradient "
                             "scan)");
  policy_ = policy;
  return Status::success();
}

Status Stepper::set_max_grad_norm(double max_norm) {
  if (!std::isfinite(max_norm) || max_norm < 0.0)
    return Status::error(Code::InvalidArgument,
                         "max_norm must be finite and >= 0 (0 turns clipping "
                         "off), got " +
                             fmt(max_norm));
  if (max_norm > 0.0 && !opt_.backend().scans_gradients())
    return Status::error(Code::Unsupported,
                         "gradient-norm clipping is not supported on " +
                             contextName(opt_.backend()) +
                             " contexts yet (it needs a device-side "
                             "reduction)");
  if (max_norm > 0.0 && opt_.manifest().hyper_index(kGradScale) < 0)
    return Status::error(Code::Unsupported,
                         opt_.manifest().name +
                             " has no \"grad_scale\" hyper-parameter (a "
                             "bundle from an older flashopt-gen): regenerate "
                             "it");
  maxGradNorm_ = max_norm;
  if (max_norm == 0.0)
    lastGradNorm_ = -1.0;
  return Status::success();
}

Status Stepper::set_accumulation_normalizer(double normalizer) {
  if (!std::isfinite(normalizer) || normalizer < 0.0)
    return Status::error(Code::InvalidArgument,
                         "normalizer must be finite and >= 0 (0: the number "
                         "of micro-batches), got " +
                             fmt(normalizer));
  normalizer_ = normalizer;
  return Status::success();
}

//===----------------------------------------------------------------------===//
// Checks
//===----------------------------------------------------------------------===//

Status Stepper::checkReady(const std::vector<int64_t> &idx) {
  for (int64_t i : idx)
    if (i < 0 || i >= opt_.num_tensors())
      return Status::error(Code::InvalidArgument,
                           "tensor " + std::to_string(i) +
                               " does not exist (there are " +
                               std::to_string(opt_.num_tensors()) + ")");
  for (int64_t i : idx)
    if (!opt_.tensor(i).grad)
      return Status::error(Code::State,
                           name(i) + " has no gradient (register one with "
                                     "the parameter, or set one)");
  // An empty step checks the hyper table and runs nothing.
  return opt_.step_tensors({}, 0);
}

Status Stepper::checkCanAccumulate() const {
  const host::Manifest &m = opt_.manifest();
  if (!m.accumulator)
    return Status::error(Code::Unsupported,
                         m.name + " has no gradient accumulator: its spec has "
                                  "no \"accumulator\" (add \"accumulator\": "
                                  "\"f32\", \"bf16+i8\" or \"bf16\" and "
                                  "regenerate the bundle; docs/SPEC.md)");
  if (dp_ && dp_->any_reduced())
    return Status::error(Code::State,
                         "a bucket's gradients were already reduced for this "
                         "step (an early bucket reduction); with accumulation "
                         "the step reduces the accumulators instead");
  return Status::success();
}

Expected<bool> Stepper::gradsFinite(const std::vector<int64_t> &idx) {
  return opt_.grads_finite(idx);
}

//===----------------------------------------------------------------------===//
// The step
//===----------------------------------------------------------------------===//

StepKind Stepper::next_step_kind() const {
  if (!accumulation_pending())
    return StepKind::Plain;
  const bool decides = maxGradNorm_ > 0.0 || policy_ == NonFinitePolicy::Skip;
  return dp_ || decides ? StepKind::Accumulated : StepKind::Fused;
}

Status Stepper::step() {
  sync();
  if (peers_)
    return Status::error(Code::State,
                         "externally reduced data parallelism is attached: "
                         "every rank steps through step_external");
  return step(next_step_kind());
}

Status Stepper::step(StepKind kind) {
  const std::vector<int64_t> all = allTensors();
  // Ready: gradients, hyper-parameters, and (accumulated) one number of
  // micro-batches for every tensor, since one scale serves them all.
  int64_t n = 0;
  if (kind != StepKind::Plain) {
    if (Status s = checkCanAccumulate(); !s)
      return s;
    n = counters_.front().accumulated;
    for (size_t i = 1; i < counters_.size(); ++i)
      if (counters_[i].accumulated != n)
        return Status::error(
            Code::State,
            name(int64_t(i)) + " has " +
                std::to_string(counters_[i].accumulated) +
                " accumulated micro-batches but " + name(0) + " has " +
                std::to_string(n) +
                ": a step needs the same number for every parameter");
  }
  if (Status s = checkReady(all); !s)
    return s;
  // With an accumulation, this step's gradient is micro-batch N.
  const int64_t N = kind == StepKind::Plain ? 0 : n + 1;

  // Agree: the ranks agree on the step (policy, clipping, hypers, counter,
  // micro-batches, normalizer) and on skipping it; nothing has changed
  // if not.
  if (dp_) {
    Expected<bool> skipped = agree(kind, N);
    if (!skipped)
      return skipped.status();
    if (*skipped) {
      dp_->step_done();
      return skip(kind);
    }
  }
  // Reduce, then decide over the (reduced) gradient.
  if (Status s = reduce(kind, N); !s)
    return s;
  Expected<bool> goAhead = decide(kind);
  if (!goAhead)
    return goAhead.status();
  if (!*goAhead)
    return skip(kind);

  // Scale an accumulated gradient by 1/N (1/(N * W), or the normalizer),
  // then clip: the clip factor joins grad_scale for this step only.
  GradScales scales(opt_);
  if (kind != StepKind::Plain) {
    const int W = dp_ ? dp_->comm().size() : 1;
    const double normalizer =
        normalizer_ > 0.0 ? normalizer_ : double(N) * double(W);
    Expected<std::vector<float>> v = scales.current("an accumulated step");
    if (!v)
      return v.status();
    if (Status s = scales.set(*v, float(1.0 / normalizer)); !s)
      return s;
  }
  if (Status s = clip(kind, scales); !s)
    return s;
  Status s = run(kind);
  scales.restore();
  if (!s)
    return s;
  finish(kind);
  return Status::success();
}

Expected<bool> Stepper::agree(StepKind kind, int64_t microBatches) {
  dist::DataParallel::StepView view;
  view.skip_policy = policy_ == NonFinitePolicy::Skip;
  if (kind == StepKind::Plain && view.skip_policy) {
    // The accumulated gradient is judged after its reduction (decide()).
    Expected<bool> finite = gradsFinite(allTensors());
    if (!finite)
      return finite;
    view.finite = *finite;
  }
  view.max_grad_norm = maxGradNorm_;
  view.hyper_hash = hyperHash();
  view.step = step_;
  view.micro_batches = microBatches;
  view.normalizer = normalizer_;
  Expected<bool> skip = dp_->agree(view);
  if (!skip)
    dp_->step_done();
  return skip;
}

Status Stepper::reduce(StepKind kind, int64_t microBatches) {
  if (kind == StepKind::Accumulated) {
    // Micro-batch N joins the accumulators first.
    if (Status s = opt_.accumulate_tensors(allTensors()); !s)
      return s;
    for (Counters &c : counters_)
      c.accumulated = microBatches;
  }
  if (!dp_ || kind == StepKind::Fused)
    return Status::success();
  // With clipping every rank needs the whole reduced gradient (sharded
  // too), so the norm is over the same bits as in replicated mode.
  dp_->set_full_grads(maxGradNorm_ > 0.0);
  Status r = kind == StepKind::Plain ? dp_->reduce_remaining(opt_)
                                     : dp_->reduce_accumulators(opt_);
  dp_->step_done();
  return r;
}

Expected<bool> Stepper::decide(StepKind kind) {
  if (policy_ != NonFinitePolicy::Skip || kind == StepKind::Fused)
    return true;
  if (kind == StepKind::Plain) {
    // Under data parallelism agree() decided already.
    if (dp_)
      return true;
    return gradsFinite(allTensors());
  }
  return dp_ ? dp_->accumulators_finite(opt_)
             : opt_.accumulators_finite(allTensors());
}

Status Stepper::skip(StepKind kind) {
  if (kind != StepKind::Plain) {
    // The micro-batches are dropped; nothing else changes.
    Status z = dp_ ? dp_->zero_accumulators(opt_) : opt_.zero_accumulators();
    if (!z)
      return z.prefixed("zeroing the accumulators: ");
    for (Counters &c : counters_)
      c.accumulated = 0;
  }
  ++skipped_;
  return Status::success();
}

Status Stepper::clip(StepKind kind, GradScales &scales) {
  if (maxGradNorm_ <= 0.0)
    return Status::success();
  const std::vector<int64_t> all = allTensors();
  // The accumulated gradient's norm is that of the decoded accumulators
  // (reduced over the ranks) times the grad_scale already set (1/(N * W)).
  Expected<std::vector<double>> ss = kind == StepKind::Plain
                                         ? opt_.grad_sum_squares(all)
                                         : opt_.accumulator_sum_squares(all);
  if (!ss)
    return ss.status();
  Expected<std::vector<float>> v = scales.current("gradient clipping");
  if (!v)
    return v.status();
  double total = 0.0; // in tensor order
  for (size_t i = 0; i < all.size(); ++i) {
    double s = double((*v)[size_t(opt_.tensor(int64_t(i)).param_group)]);
    total += (*ss)[i] * s * s;
  }
  const double norm = std::sqrt(total);
  lastGradNorm_ = norm;
  if (!(norm > maxGradNorm_)) // also when the norm is NaN
    return Status::success();
  return scales.set(*v, float(maxGradNorm_ / (norm + 1e-6)));
}

Status Stepper::run(StepKind kind) {
  const abi::KernelKind kernel = kind == StepKind::Plain ? abi::KernelKind::Step
                                 : kind == StepKind::Fused
                                     ? abi::KernelKind::StepFused
                                     : abi::KernelKind::StepAccumulated;
  if (dp_ && dp_->sharded()) {
    // The owners step their shards (one step counter: no gradient release
    // here), then the parameters are all-gathered.
    if (Status s = dp_->step_shards(opt_, step_ + 1, kernel); !s)
      return s;
    // The owners' kernel zeroed the shards' accumulators; this rank's own
    // sums are zeroed here.
    if (kind == StepKind::Accumulated)
      if (Status z = opt_.zero_accumulators(); !z)
        return z.prefixed("zeroing the accumulators: ");
    return Status::success();
  }
  // One kernel call per distinct step counter (one when all are equal); the
  // accumulated kernels zero the accumulators.
  std::map<int64_t, std::vector<int64_t>> byStep;
  for (size_t i = 0; i < counters_.size(); ++i)
    byStep[counters_[i].step].push_back(int64_t(i));
  for (const auto &kv : byStep)
    if (Status s = opt_.step_tensors(kv.second, kv.first + 1, kernel); !s)
      return s;
  return Status::success();
}

void Stepper::finish(StepKind kind) {
  for (Counters &c : counters_) {
    ++c.step;
    if (kind != StepKind::Plain)
      c.accumulated = 0;
  }
  ++step_;
  opt_.set_step_count(step_);
}

uint64_t Stepper::hyperHash() const {
  // FNV-1a over the bytes of the hyper table.
  const std::vector<float> &v = opt_.hyper_table();
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto *p = reinterpret_cast<const unsigned char *>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

//===----------------------------------------------------------------------===//
// Gradient release and accumulation
//===----------------------------------------------------------------------===//

Status Stepper::step_tensor(int64_t i) {
  sync();
  if (i < 0 || i >= opt_.num_tensors())
    return checkReady({i}); // the error naming the index
  const std::string why = name(i) + ": gradient release is not possible with ";
  if (accumulation_pending())
    return Status::error(Code::State,
                         why + "gradient accumulation (micro-batches are "
                               "accumulated; a whole step ends them)");
  if (maxGradNorm_ > 0.0)
    return Status::error(Code::State,
                         why + "gradient-norm clipping (it needs every "
                               "gradient first)");
  if (peers_)
    return Status::error(Code::State,
                         why + "externally reduced data parallelism (every "
                               "rank steps through step_external)");
  if (dp_)
    return Status::error(Code::State,
                         why + (dp_->sharded() ? "sharded" : "replicated") +
                             " data parallelism (the gradients are averaged "
                             "over the ranks in a whole step)");
  const std::vector<int64_t> one{i};
  if (Status s = checkReady(one); !s)
    return s;
  if (policy_ == NonFinitePolicy::Skip) {
    Expected<bool> finite = gradsFinite(one);
    if (!finite)
      return finite.status();
    if (!*finite) {
      ++skipped_;
      return Status::success();
    }
  }
  Counters &c = counters_[size_t(i)];
  if (Status s = opt_.step_tensors(one, c.step + 1); !s)
    return s;
  ++c.step;
  return Status::success();
}

Status Stepper::accumulate(const std::vector<int64_t> &indices) {
  sync();
  if (Status s = checkCanAccumulate(); !s)
    return s;
  if (Status s = checkReady(indices); !s)
    return s;
  if (Status s = opt_.accumulate_tensors(indices); !s)
    return s;
  for (int64_t i : indices)
    ++counters_[size_t(i)].accumulated;
  return Status::success();
}

//===----------------------------------------------------------------------===//
// Data parallelism
//===----------------------------------------------------------------------===//

Status Stepper::attach(std::shared_ptr<dist::Communicator> comm,
                       const std::vector<dist::LayoutEntry> &layout,
                       bool deterministic, size_t bucket_bytes, bool sharded) {
  if (dp_ || peers_)
    return Status::error(Code::State, "a communicator is already attached");
  const std::string where = "rank " + std::to_string(comm->rank()) + " of " +
                            std::to_string(comm->size()) + ": ";
  dist::OwnerFactory owner;
  if (sharded)
    owner = [this] { return opt_.create_sibling(); };
  Expected<std::unique_ptr<dist::DataParallel>> dp = dist::DataParallel::attach(
      std::move(comm), opt_, layout, deterministic, bucket_bytes, owner);
  if (!dp)
    return dp.status().prefixed(where);
  dp_ = std::move(dp.value());
  return Status::success();
}

Status Stepper::reduce_bucket(int b) {
  sync();
  if (!dp_)
    return Status::error(Code::State, "no communicator is attached");
  const std::vector<dist::Bucket> &buckets = dp_->buckets();
  if (b < 0 || b >= int(buckets.size()))
    return Status::error(Code::InvalidArgument,
                         "bucket " + std::to_string(b) +
                             " does not exist (there are " +
                             std::to_string(buckets.size()) + ")");
  if (accumulation_pending())
    return Status::error(
        Code::State,
        "bucket " + std::to_string(b) +
            ": micro-batches are accumulated, so the step reduces the "
            "accumulators (the last micro-batch included) in every bucket; "
            "an early bucket reduction is for the gradients of a step "
            "without accumulation");
  const dist::Bucket &bk = buckets[size_t(b)];
  for (int64_t i = bk.first; i < bk.first + bk.count; ++i)
    if (!opt_.tensor(i).grad)
      return Status::error(Code::State, name(i) + " has no gradient");
  dp_->set_full_grads(maxGradNorm_ > 0.0);
  return dp_->reduce_bucket(opt_, b);
}

} // namespace flashopt::train
