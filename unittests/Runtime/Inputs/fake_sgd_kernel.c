/*===- fake_sgd_kernel.c - A hand-written kernel for the harness tests ----===*
 *
 * Part of flashopt.
 *
 *===----------------------------------------------------------------------===*
 *
 * Implements the kernel ABI (docs/KERNEL-ABI.md) for a trivial spec, so the
 * host harness can be tested without the compiler:
 *   param f32 (no correction), grad f32, one plain f32 state
 *   "momentum_buffer"; hypers (lr, momentum); G = 32;
 *   m = m * momentum + g;  theta = theta - lr * m.
 * Buffers: 0 param, 1 grad, 2 momentum_buffer; R = 7 words per record.
 *
 * It also checks what the ABI promises and aborts when a promise is broken
 * (records ordered and contiguous, reserved word 0, state slices 64-byte
 * aligned), so a harness bug fails loudly. FAKE_CPU names the flavour the
 * object was built for (fake_sgd_cpu()).
 *
 *===----------------------------------------------------------------------===*/

#include <stdint.h>
#include <stdlib.h>

#ifndef FAKE_CPU
#define FAKE_CPU "unknown"
#endif

enum { G = 32, R = 7, H = 2 };

const char *fake_sgd_cpu(void) { return FAKE_CPU; }

/* The ABI description the runtime checks against the manifest
 * (abi::kernel_abi_description; flashopt-gen emits it for its kernels). */
const char fake_sgd_step__abi[] =
    "flashopt-kernel-abi 1; group_size 32; hypers lr,momentum; buffers "
    "param:f32:element:readwrite,grad:f32:element:read,"
    "momentum_buffer:f32:element:readwrite; record_words 7";

/* Number of kernel calls so far (tests read it to see the chunking). */
static int64_t calls;
int64_t fake_sgd_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }

void fake_sgd_step(const int64_t *table, int64_t ntensors, const float *hypers,
                   int64_t step, int64_t group_begin, int64_t group_end) {
  __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
  if (step < 1 || group_begin < 0 || group_end < group_begin)
    abort();
  int64_t expect_first = 0;
  for (int64_t t = 0; t < ntensors; ++t) {
    const int64_t *rec = table + t * R;
    int64_t numel = rec[0], first = rec[1], slot = rec[2];
    int64_t groups = (numel + G - 1) / G;
    if (numel <= 0 || first != expect_first || rec[3] < 0 || slot < 0)
      abort();
    if ((rec[4 + 2] & 63) != 0) /* runtime-owned state: 64-byte aligned */
      abort();
    expect_first = first + groups;
    int64_t lo = group_begin > first ? group_begin : first;
    int64_t hi = group_end < first + groups ? group_end : first + groups;
    if (lo >= hi)
      continue;
    float *p = (float *)(intptr_t)rec[4 + 0];
    const float *g = (const float *)(intptr_t)rec[4 + 1];
    float *m = (float *)(intptr_t)rec[4 + 2];
    float lr = hypers[slot * H + 0], momentum = hypers[slot * H + 1];
    int64_t e0 = (lo - first) * G, e1 = (hi - first) * G;
    if (e1 > numel)
      e1 = numel;
    for (int64_t i = e0; i < e1; ++i) {
      float mi = m[i] * momentum;
      mi = mi + g[i];
      m[i] = mi;
      float u = lr * mi;
      p[i] = p[i] - u;
    }
  }
}
