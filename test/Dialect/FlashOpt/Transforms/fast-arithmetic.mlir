// RUN: flashopt-opt %s --flashopt-fast-arithmetic --split-input-file --verify-diagnostics | FileCheck %s

// A division by a per-tensor scalar of the prologue: one IEEE reciprocal
// there, a multiply per element; by a constant: the same (the canonicalizer
// folds 1/N later). Per-element divisors and square roots stay IEEE
// (docs/NUMERICS.md §7).
// CHECK-LABEL: flashopt.kernel @fast
// CHECK: %[[BC:.*]] = arith.subf
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[RBC:.*]] = arith.divf %[[ONE]], %[[BC]] : f32
// CHECK: flashopt.group_body
// CHECK: %[[X:.*]] = flashopt.load_element 0 : f32
// CHECK: %[[D:.*]] = flashopt.load_element 1 : f32
// CHECK: %[[N:.*]] = arith.constant 1.270000e+02 : f32
// CHECK-NEXT: %[[ONE2:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[RN:.*]] = arith.divf %[[ONE2]], %[[N]] : f32
// CHECK: %[[U:.*]] = arith.mulf %[[X]], %[[RBC]] : f32
// CHECK: %[[Q:.*]] = arith.divf %[[U]], %[[D]] : f32
// CHECK: %[[S:.*]] = math.sqrt %[[Q]] : f32
// The products that replace the divisions fuse with the adds that consume
// them; the same divisor twice: one reciprocal.
// CHECK: %[[A:.*]] = math.fma %[[X]], %[[RN]], %[[S]] : f32
// CHECK: math.fma %[[D]], %[[RBC]], %[[A]] : f32
// CHECK-NOT: arith.divf
// CHECK: flashopt.store_element
flashopt.kernel @fast group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"d", f32, element, read>]) hypers(["beta"]) arithmetic<fast> {
  %beta = flashopt.hyper "beta" default(9.000000e-01) : f32
  %one = arith.constant 1.000000e+00 : f32
  %bc = arith.subf %one, %beta : f32
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %d = flashopt.load_element 1 : f32
    %n = arith.constant 1.270000e+02 : f32
    %u = arith.divf %x, %bc : f32
    %v = arith.divf %x, %n : f32
    %q = arith.divf %u, %d : f32
    %s = math.sqrt %q : f32
    %w = arith.divf %d, %bc : f32
    %a = arith.addf %s, %v : f32
    %b = arith.addf %a, %w : f32
    flashopt.store_element 0, %b : f32
  }
}

// -----

// Uniform operands only (per tensor, per group): IEEE, untouched. A group's
// absmax divides each element through one reciprocal per group.
// CHECK-LABEL: flashopt.kernel @uniform
// CHECK: %[[M:.*]] = flashopt.group_max
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[R:.*]] = arith.divf %[[ONE]], %[[M]] : f32
// CHECK: math.sqrt %[[M]] : f32
// CHECK: arith.divf %{{.*}}, %[[M]] : f32
// CHECK: math.fma %{{.*}}, %[[R]], %{{.*}} : f32
flashopt.kernel @uniform group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>]) hypers([]) arithmetic<fast> {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %abs = math.absf %x : f32
    %m = flashopt.group_max %abs : f32
    %s = math.sqrt %m : f32
    %k = arith.divf %s, %m : f32
    %n = arith.divf %x, %m : f32
    %o = arith.addf %n, %k : f32
    flashopt.store_element 0, %o : f32
  }
}

// -----

// Exact kernels (no attribute, or "exact") keep their IEEE operations.
// CHECK-LABEL: flashopt.kernel @exact
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK-NOT: arith.mulf
flashopt.kernel @exact group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"d", f32, element, read>]) hypers([]) arithmetic<exact> {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %d = flashopt.load_element 1 : f32
    %q = arith.divf %x, %d : f32
    %c = arith.constant 3.000000e+00 : f32
    %s = arith.divf %q, %c : f32
    flashopt.store_element 0, %s : f32
  }
}

// -----

// (x * u1) * u2 with u1, u2 uniform and the inner product used once:
// x * (u1 * u2), the uniform product computed once, where both factors exist
// (after the group's scale inside the body; in the prologue when both come
// from there). Chains fold again; a product used twice does not fold.
// CHECK-LABEL: flashopt.kernel @fold
// CHECK: %[[B:.*]] = flashopt.hyper "beta"
// CHECK: %[[L:.*]] = flashopt.hyper "lr"
// CHECK: %[[BL:.*]] = arith.mulf %[[B]], %[[L]] : f32
// CHECK: flashopt.group_body
// CHECK: %[[X:.*]] = flashopt.load_element 0 : f32
// CHECK: %[[S:.*]] = flashopt.load_group 1 : f32
// CHECK-NEXT: %[[SB:.*]] = arith.mulf %[[S]], %[[B]] : f32
// CHECK-NEXT: %[[SBL:.*]] = arith.mulf %[[SB]], %[[L]] : f32
// CHECK: %[[A:.*]] = arith.mulf %[[X]], %[[SBL]] : f32
// CHECK: %[[Y:.*]] = flashopt.load_element 2 : f32
// CHECK: %[[YB:.*]] = arith.mulf %[[Y]], %[[BL]] : f32
// CHECK: %[[Z:.*]] = flashopt.load_element 3 : f32
// CHECK: %[[ZB:.*]] = arith.mulf %[[Z]], %[[B]] : f32
// CHECK: %[[ZBB:.*]] = arith.mulf %[[ZB]], %[[B]] : f32
// CHECK: %[[NZ:.*]] = arith.negf %[[ZBB]] : f32
// CHECK: math.fma %[[ZB]], %[[L]], %[[NZ]] : f32
flashopt.kernel @fold group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"s", f32, group, read>, #flashopt.buffer<"y", f32, element, readwrite>, #flashopt.buffer<"z", f32, element, readwrite>]) hypers(["beta", "lr"]) arithmetic<fast> {
  %beta = flashopt.hyper "beta" default(9.000000e-01) : f32
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %s = flashopt.load_group 1 : f32
    %xs = arith.mulf %x, %s : f32
    %xsb = arith.mulf %xs, %beta : f32
    %xsbl = arith.mulf %lr, %xsb : f32
    flashopt.store_element 0, %xsbl : f32
    %y = flashopt.load_element 2 : f32
    %yb = arith.mulf %y, %beta : f32
    %ybl = arith.mulf %yb, %lr : f32
    flashopt.store_element 2, %ybl : f32
    %z = flashopt.load_element 3 : f32
    %zb = arith.mulf %z, %beta : f32
    %zbl = arith.mulf %zb, %lr : f32
    %zbb = arith.mulf %zb, %beta : f32
    %w = arith.subf %zbl, %zbb : f32
    flashopt.store_element 3, %w : f32
  }
}

// -----

// sqrt(x * u), u uniform, next to sqrt(x) in the same body: sqrt(x) *
// sqrt(u), the uniform root once (AdamW's sqrt(v / bc2) beside the variance
// encoding's sqrt(v)). Without a sqrt(x) to share it stays as it is.
// CHECK-LABEL: flashopt.kernel @roots
// CHECK: %[[R:.*]] = flashopt.hyper "rbc"
// CHECK-NEXT: %[[SR:.*]] = math.sqrt %[[R]] : f32
// CHECK: %[[V:.*]] = flashopt.load_element 0 : f32
// CHECK: %[[SV:.*]] = math.sqrt %[[V]] : f32
// CHECK: math.fma %[[SV]], %[[SR]], %{{.*}} : f32
// CHECK: math.sqrt %[[V]] : f32
// CHECK: %[[W:.*]] = flashopt.load_element 1 : f32
// CHECK: %[[WR:.*]] = arith.mulf %[[W]], %[[R]] : f32
// CHECK: math.sqrt %[[WR]] : f32
flashopt.kernel @roots group_size(32) buffers([#flashopt.buffer<"v", f32, element, readwrite>, #flashopt.buffer<"w", f32, element, readwrite>]) hypers(["rbc", "eps"]) arithmetic<fast> {
  %rbc = flashopt.hyper "rbc" default(1.000000e+00) : f32
  %eps = flashopt.hyper "eps" default(1.000000e-08) : f32
  flashopt.group_body {
    %v = flashopt.load_element 0 : f32
    %vh = arith.mulf %v, %rbc : f32
    %den = math.sqrt %vh : f32
    %de = arith.addf %den, %eps : f32
    %root = math.sqrt %v : f32
    %o = arith.divf %root, %de : f32
    flashopt.store_element 0, %o : f32
    %w = flashopt.load_element 1 : f32
    %wh = arith.mulf %w, %rbc : f32
    %wr = math.sqrt %wh : f32
    flashopt.store_element 1, %wr : f32
  }
}

// -----

// A per-element product used once fuses with the add or subtract that
// consumes it: a*b + c, c + a*b, a*b - c = fma(a, b, -c), c - a*b =
// fma(-a, b, c); with two products the left one. A product used twice, or
// one that is uniform, stays a multiply.
// CHECK-LABEL: flashopt.kernel @contract
// CHECK: %[[A:.*]] = flashopt.load_element 0 : f32
// CHECK: %[[B:.*]] = flashopt.load_element 1 : f32
// CHECK: %[[P:.*]] = math.fma %[[A]], %[[B]], %[[B]] : f32
// CHECK: %[[N:.*]] = arith.negf %[[A]] : f32
// CHECK: %[[Q:.*]] = math.fma %[[N]], %[[B]], %[[P]] : f32
// CHECK: %[[BB:.*]] = arith.mulf %[[B]], %[[B]] : f32
// CHECK: %[[NQ:.*]] = arith.negf %[[BB]] : f32
// CHECK: %[[R:.*]] = math.fma %[[A]], %[[Q]], %[[NQ]] : f32
// CHECK: %[[T:.*]] = arith.mulf %[[A]], %[[A]] : f32
// CHECK: %[[U:.*]] = arith.addf %[[T]], %[[R]] : f32
// CHECK: arith.addf %[[U]], %[[T]] : f32
// CHECK: %[[G:.*]] = arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK: arith.addf %[[G]], %{{.*}} : f32
flashopt.kernel @contract group_size(32) buffers([#flashopt.buffer<"a", f32, element, readwrite>, #flashopt.buffer<"b", f32, element, read>]) hypers(["beta", "gamma"]) arithmetic<fast> {
  %beta = flashopt.hyper "beta" default(9.000000e-01) : f32
  %gamma = flashopt.hyper "gamma" default(9.000000e-01) : f32
  flashopt.group_body {
    %a = flashopt.load_element 0 : f32
    %b = flashopt.load_element 1 : f32
    %ab = arith.mulf %a, %b : f32
    %p = arith.addf %b, %ab : f32
    %ab2 = arith.mulf %a, %b : f32
    %q = arith.subf %p, %ab2 : f32
    %aq = arith.mulf %a, %q : f32
    %bb = arith.mulf %b, %b : f32
    %r = arith.subf %aq, %bb : f32
    %t = arith.mulf %a, %a : f32
    %u = arith.addf %t, %r : f32
    %v = arith.addf %u, %t : f32
    %bg = arith.mulf %beta, %gamma : f32
    %w = arith.addf %bg, %v : f32
    flashopt.store_element 0, %w : f32
  }
}

// -----

// Exact kernels keep every multiply and add.
// CHECK-LABEL: flashopt.kernel @exact_contract
// CHECK: arith.mulf
// CHECK-NEXT: arith.addf
// CHECK-NOT: math.fma
flashopt.kernel @exact_contract group_size(32) buffers([#flashopt.buffer<"a", f32, element, readwrite>]) hypers(["beta"]) arithmetic<exact> {
  %beta = flashopt.hyper "beta" default(9.000000e-01) : f32
  flashopt.group_body {
    %a = flashopt.load_element 0 : f32
    %ab = arith.mulf %a, %beta : f32
    %s = arith.addf %ab, %a : f32
    flashopt.store_element 0, %s : f32
  }
}

// -----

// A block argument of a region inside the body counts as per element
// (conservatively): a division by it stays IEEE.
// CHECK-LABEL: flashopt.kernel @region
// CHECK: scf.for
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK-NOT: arith.mulf
flashopt.kernel @region group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>]) hypers([]) arithmetic<fast> {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %r = scf.for %i = %c0 to %c4 step %c1 iter_args(%a = %x) -> (f32) {
      %n = arith.index_cast %i : index to i32
      %d = arith.sitofp %n : i32 to f32
      %q = arith.divf %x, %d : f32
      scf.yield %q : f32
    }
    flashopt.store_element 0, %r : f32
  }
}

// -----

// The arithmetic is a typed attribute: a value other than exact or fast is
// refused when parsed.
// expected-error @+2 {{expected ::mlir::flashopt::Arithmetic to be one of: exact, fast}}
// expected-error @+1 {{failed to parse FlashOpt_ArithmeticAttr parameter 'value'}}
flashopt.kernel @bad group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>]) hypers([]) arithmetic<approximate> {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    flashopt.store_element 0, %x : f32
  }
}

// -----

// The softsign quotients, one division each (docs/NUMERICS.md §7): the
// encode 2n / (1 + |n|), n = y / a, becomes y / fma(|y|, 0.5, a * 0.5)
// (a * 0.5 once per group); the decode t / (2 - |t|), t = q / N, becomes
// q / (2N - |q|) (2N a constant). Where the intermediate has another use, both
// stay as they were (the uniform division still becomes a multiply).
// CHECK-LABEL: flashopt.kernel @softsign
// CHECK: %[[Q:.*]] = arith.sitofp
// CHECK: %[[TWON:.*]] = arith.constant 2.540000e+02 : f32
// CHECK: %[[AQ:.*]] = math.absf %[[Q]] : f32
// CHECK: %[[DEN:.*]] = arith.subf %[[TWON]], %[[AQ]] : f32
// CHECK: %[[DEC:.*]] = arith.divf %[[Q]], %[[DEN]] : f32
// CHECK: %[[Y:.*]] = arith.mulf %[[DEC]], %{{.*}} : f32
// CHECK: %[[GM:.*]] = flashopt.group_max
// CHECK: %[[A:.*]] = arith.maximumf %[[GM]]
// CHECK: %[[H:.*]] = arith.mulf %[[A]], %{{.*}} : f32
// CHECK: %[[AY:.*]] = math.absf %[[Y]] : f32
// CHECK: %[[D:.*]] = math.fma %[[AY]], %{{.*}}, %[[H]] : f32
// CHECK: %[[T:.*]] = arith.divf %[[Y]], %[[D]] : f32
// CHECK: math.fma %[[T]], %{{.*}}, %{{.*}} : f32
// CHECK-NOT: arith.addf
// CHECK: flashopt.store_element 1
flashopt.kernel @softsign group_size(32) buffers([#flashopt.buffer<"x", f32, element, read>, #flashopt.buffer<"m.codes", i8, element, readwrite>]) hypers([]) arithmetic<fast> {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %code = flashopt.load_element 1 : i8
    %qf = arith.sitofp %code : i8 to f32
    %n127 = arith.constant 1.270000e+02 : f32
    %t = arith.divf %qf, %n127 : f32
    %at = math.absf %t : f32
    %two = arith.constant 2.000000e+00 : f32
    %den = arith.subf %two, %at : f32
    %dec = arith.divf %t, %den : f32
    %y = arith.mulf %dec, %x : f32
    %ay = math.absf %y : f32
    %gm = flashopt.group_max %ay : f32
    %floor = arith.constant 9.99999996E-13 : f32
    %a = arith.maximumf %gm, %floor : f32
    %n = arith.divf %y, %a : f32
    %n2 = arith.mulf %two, %n : f32
    %an = math.absf %n : f32
    %one = arith.constant 1.000000e+00 : f32
    %den2 = arith.addf %one, %an : f32
    %ts = arith.divf %n2, %den2 : f32
    %s = arith.mulf %ts, %n127 : f32
    %half = arith.constant 5.000000e-01 : f32
    %w = arith.addf %s, %half : f32
    %f = math.floor %w : f32
    %c = arith.fptosi %f : f32 to i8
    flashopt.store_element 1, %c : i8
  }
}

// -----

// n used elsewhere too: the encode keeps 2n / (1 + |n|).
// CHECK-LABEL: flashopt.kernel @softsign_shared
// CHECK: %[[R:.*]] = arith.divf %{{.*}}, %{{.*}} : f32
// CHECK: %[[N:.*]] = arith.mulf %{{.*}}, %[[R]] : f32
// CHECK: %[[AN:.*]] = math.absf %[[N]] : f32
// CHECK: arith.addf %{{.*}}, %[[AN]] : f32
// CHECK-NOT: math.fma %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK: flashopt.store_element 0, %[[N]]
flashopt.kernel @softsign_shared group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"m.codes", i8, element, readwrite>]) hypers([]) arithmetic<fast> {
  flashopt.group_body {
    %y = flashopt.load_element 0 : f32
    %ay = math.absf %y : f32
    %gm = flashopt.group_max %ay : f32
    %floor = arith.constant 9.99999996E-13 : f32
    %a = arith.maximumf %gm, %floor : f32
    %n = arith.divf %y, %a : f32
    %two = arith.constant 2.000000e+00 : f32
    %n2 = arith.mulf %two, %n : f32
    %an = math.absf %n : f32
    %one = arith.constant 1.000000e+00 : f32
    %den2 = arith.addf %one, %an : f32
    %ts = arith.divf %n2, %den2 : f32
    %f = math.floor %ts : f32
    %c = arith.fptosi %f : f32 to i8
    flashopt.store_element 1, %c : i8
    flashopt.store_element 0, %n : f32
  }
}

// -----

// A softsign decode quotient and the next per-element division whose divisor
// does not depend on it share one reciprocal: r = 1 / (d0 * d), the decode
// q * (d * r), the other x * (d0 * r). The decode's users move after r.
// CHECK-LABEL: flashopt.kernel @pair
// CHECK: %[[Q:.*]] = arith.sitofp
// CHECK: %[[D0:.*]] = arith.subf %{{.*}}, %{{.*}} : f32
// CHECK: %[[D:.*]] = flashopt.load_element 2 : f32
// CHECK: %[[P:.*]] = arith.mulf %[[D0]], %[[D]] : f32
// CHECK: %[[R:.*]] = arith.divf %{{.*}}, %[[P]] : f32
// CHECK: %[[S1:.*]] = arith.mulf %[[D]], %[[R]] : f32
// CHECK: %[[DEC:.*]] = arith.mulf %[[Q]], %[[S1]] : f32
// CHECK: %[[S0:.*]] = arith.mulf %[[D0]], %[[R]] : f32
// CHECK: %[[X:.*]] = arith.mulf %[[DEC]], %{{.*}} : f32
// CHECK: arith.mulf %[[X]], %[[S0]] : f32
// CHECK-NOT: arith.divf
// CHECK: flashopt.store_element 0
flashopt.kernel @pair group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"m.codes", i8, element, read>, #flashopt.buffer<"d", f32, element, read>]) hypers([]) arithmetic<fast> {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %code = flashopt.load_element 1 : i8
    %qf = arith.sitofp %code : i8 to f32
    %n127 = arith.constant 1.270000e+02 : f32
    %t = arith.divf %qf, %n127 : f32
    %at = math.absf %t : f32
    %two = arith.constant 2.000000e+00 : f32
    %den = arith.subf %two, %at : f32
    %dec = arith.divf %t, %den : f32
    %num = arith.mulf %dec, %x : f32
    %d = flashopt.load_element 2 : f32
    %u = arith.divf %num, %d : f32
    flashopt.store_element 0, %u : f32
  }
}

// -----

// The other division's divisor depends on the decode: no pair.
// CHECK-LABEL: flashopt.kernel @nopair
// CHECK: %[[DEC:.*]] = arith.divf
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK: flashopt.store_element 0
flashopt.kernel @nopair group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"m.codes", i8, element, read>]) hypers([]) arithmetic<fast> {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %code = flashopt.load_element 1 : i8
    %qf = arith.sitofp %code : i8 to f32
    %n127 = arith.constant 1.270000e+02 : f32
    %t = arith.divf %qf, %n127 : f32
    %at = math.absf %t : f32
    %two = arith.constant 2.000000e+00 : f32
    %den = arith.subf %two, %at : f32
    %dec = arith.divf %t, %den : f32
    %d = arith.addf %dec, %x : f32
    %u = arith.divf %x, %d : f32
    flashopt.store_element 0, %u : f32
  }
}

// -----

// An unsigned code up to 255 against 2N = 254: the divisor can be 0 or
// negative, so the decode is not paired.
// CHECK-LABEL: flashopt.kernel @nopair_unsigned
// CHECK: %[[Q:.*]] = arith.uitofp
// CHECK: arith.divf %[[Q]], %{{.*}} : f32
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK: flashopt.store_element 0
flashopt.kernel @nopair_unsigned group_size(32) buffers([#flashopt.buffer<"x", f32, element, readwrite>, #flashopt.buffer<"v.codes", ui8, element, read>, #flashopt.buffer<"d", f32, element, read>]) hypers([]) arithmetic<fast> {
  flashopt.group_body {
    %x = flashopt.load_element 0 : f32
    %code = flashopt.load_element 1 : i8
    %qf = arith.uitofp %code : i8 to f32
    %n127 = arith.constant 1.270000e+02 : f32
    %t = arith.divf %qf, %n127 : f32
    %at = math.absf %t : f32
    %two = arith.constant 2.000000e+00 : f32
    %den = arith.subf %two, %at : f32
    %dec = arith.divf %t, %den : f32
    %num = arith.mulf %dec, %x : f32
    %d = flashopt.load_element 2 : f32
    %u = arith.divf %num, %d : f32
    flashopt.store_element 0, %u : f32
  }
}
