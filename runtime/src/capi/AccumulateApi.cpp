//===- AccumulateApi.cpp - The C ABI: gradient accumulation ---------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_accumulate / flashopt_accumulate_param (the bundle's generated
/// accumulate kernel: accum = encode(decode(accum) + grad)), the normalizer
/// and the micro-batch counters, each one call on the optimizer's
/// train::Stepper. The step that ends an accumulation is flashopt_step's
/// (train/Stepper.h: StepKind::Fused or Accumulated; docs/RUNTIME.md
/// "Gradient accumulation").
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "Errors.h"
#include "Handles.h"
#include "Objects.h"

#include <vector>

using namespace flashopt::capi;

extern "C" {

flashopt_status flashopt_accumulate(flashopt_optimizer opt) {
  return guard("flashopt_accumulate", [&] {
    Locked o(opt);
    std::vector<int64_t> all(o->params.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = int64_t(i);
    o->check(o->stepper->accumulate(all));
  });
}

flashopt_status flashopt_accumulate_param(flashopt_optimizer opt,
                                          int64_t index) {
  return guard("flashopt_accumulate_param", [&] {
    Locked o(opt);
    checkIndex(*o, index);
    o->check(o->stepper->accumulate({index}));
  });
}

flashopt_status flashopt_set_accumulation_normalizer(flashopt_optimizer opt,
                                                     double normalizer) {
  return guard("flashopt_set_accumulation_normalizer", [&] {
    Locked o(opt);
    o->check(o->stepper->set_accumulation_normalizer(normalizer));
  });
}

flashopt_status flashopt_get_accumulated(flashopt_optimizer opt, int64_t index,
                                         int64_t *out) {
  return guard("flashopt_get_accumulated", [&] {
    needOut(out, "out");
    Locked o(opt);
    checkIndex(*o, index);
    *out = o->stepper->accumulated(index);
  });
}

} // extern "C"
