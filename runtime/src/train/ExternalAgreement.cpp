//===- ExternalAgreement.cpp - Steps of externally reduced gradients ------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// train::Stepper's externally reduced data parallelism: a framework (FSDP2
/// through the PyTorch binding) has reduced the gradients and each rank
/// holds its own tensors; the ranks agree on every step through a fixed
/// wire gathered over the communicator — errors, the NaN policy, the hyper
/// table, the caller's key, found_inf and non-finite gradients — and then
/// either all step their own tensors, all skip, or all fail alike. The
/// counters are the Stepper's, as in every other mode.
///
//===----------------------------------------------------------------------===//

#include "train/Stepper.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace flashopt::train {

namespace {

/// One rank's part of an externally reduced step's agreement.
struct Wire {
  uint8_t skipPolicy, finite, foundInf, clipping;
  int32_t code; ///< Code::Ok: this rank can step
  uint64_t hyperHash;
  uint64_t params;     ///< a hash of the caller's parameter ids
  uint32_t errorBytes; ///< of `error` used
  char error[228];
};
static_assert(sizeof(Wire) == 256, "a fixed wire layout");

} // namespace

Status Stepper::attach_external(std::shared_ptr<dist::Communicator> comm) {
  if (dp_ || peers_)
    return Status::error(Code::State, "a communicator is already attached");
  if (!comm)
    return Status::error(Code::InvalidArgument, "no communicator");
  peers_ = std::move(comm);
  return Status::success();
}

Expected<bool> Stepper::step_external(const std::vector<int64_t> &idx,
                                      const ExternalStep &mine) {
  sync();
  if (!peers_)
    return Status::error(Code::State,
                         "no externally reduced data parallelism is attached");
  // This rank's own checks join the agreement instead of failing here
  // alone: the other ranks are in the collective.
  Status local = mine.error;
  if (local.ok() && accumulation_pending())
    local = Status::error(Code::State,
                          "micro-batches are accumulated: externally reduced "
                          "steps take the framework's reduced gradients");
  if (local.ok() && maxGradNorm_ > 0.0)
    local =
        Status::error(Code::Unsupported,
                      "gradient-norm clipping is not available with "
                      "externally reduced data parallelism (clip with "
                      "the framework, e.g. torch.nn.utils.clip_grad_norm_)");
  if (local.ok())
    local = checkReady(idx);
  bool finite = true;
  if (local.ok() && policy_ == NonFinitePolicy::Skip) {
    Expected<bool> f = gradsFinite(idx);
    if (!f)
      local = f.status();
    else
      finite = *f;
  }

  Wire w{};
  w.skipPolicy = policy_ == NonFinitePolicy::Skip;
  w.finite = finite;
  w.foundInf = mine.found_inf;
  w.clipping = maxGradNorm_ > 0.0;
  w.code = int32_t(local.code());
  w.hyperHash = hyperHash();
  // FNV-1a over the parameter ids (and their number).
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](int64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= uint64_t(v >> (8 * b)) & 0xFF;
      h *= 0x100000001b3ULL;
    }
  };
  mix(int64_t(mine.params.size()));
  for (int64_t id : mine.params)
    mix(id);
  w.params = h;
  if (!local.ok()) {
    const std::string &m = local.message();
    w.errorBytes = uint32_t(std::min(m.size(), sizeof w.error));
    std::memcpy(w.error, m.data(), w.errorBytes);
  }
  const int W = peers_->size();
  std::vector<Wire> all(static_cast<size_t>(W));
  if (Status s = peers_->all_gather(&w, all.data(), sizeof w); !s)
    return s;

  // An error on any rank: every rank fails with the first one's.
  for (int r = 0; r < W; ++r) {
    const Wire &x = all[size_t(r)];
    if (Code(x.code) == Code::Ok)
      continue;
    const std::string text(x.error,
                           std::min<size_t>(x.errorBytes, sizeof x.error));
    return Status::error(Code(x.code), "rank " + std::to_string(r) + " of " +
                                           std::to_string(W) +
                                           " cannot step: " + text +
                                           "; nothing was stepped on any rank");
  }
  bool skipStep = false;
  for (int r = 0; r < W; ++r) {
    const Wire &x = all[size_t(r)], &z = all[0];
    std::string what;
    if (x.skipPolicy != z.skipPolicy)
      what = std::string("the NaN policy (") +
             (x.skipPolicy ? "SKIP" : "PROPAGATE") + " vs " +
             (z.skipPolicy ? "SKIP" : "PROPAGATE") + ")";
    else if (x.hyperHash != z.hyperHash)
      what = "the hyper-parameters (set the same values on every rank)";
    else if (x.params != z.params)
      what = "which parameters step (each rank steps the same parameters)";
    if (!what.empty())
      return Status::error(Code::Mismatch,
                           "the ranks disagree before this step: rank " +
                               std::to_string(r) + " differs from rank 0 in " +
                               what + "; nothing was stepped on any rank");
    skipStep = skipStep || x.foundInf || (x.skipPolicy && !x.finite);
  }
  if (skipStep) {
    ++skipped_;
    return false;
  }

  // Each rank steps its own tensors: one kernel call per distinct counter.
  std::map<int64_t, std::vector<int64_t>> byStep;
  for (int64_t i : idx)
    byStep[counters_[size_t(i)].step].push_back(i);
  for (const auto &kv : byStep)
    if (Status s = opt_.step_tensors(kv.second, kv.first + 1); !s)
      return s;
  for (int64_t i : idx)
    ++counters_[size_t(i)].step;
  for (int64_t id : mine.params)
    ++paramSteps_[id];
  if (int64_t(idx.size()) == opt_.num_tensors()) {
    ++step_;
    opt_.set_step_count(step_);
  }
  return true;
}

int64_t Stepper::external_step(int64_t id) const {
  auto it = paramSteps_.find(id);
  return it == paramSteps_.end() ? 0 : it->second;
}

void Stepper::set_external_step(int64_t id, int64_t step) {
  paramSteps_[id] = step;
}

} // namespace flashopt::train
