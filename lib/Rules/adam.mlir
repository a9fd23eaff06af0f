// Adam (coupled L2 weight decay), docs/NUMERICS.md §4.
flashopt.optimizer @adam param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  %beta1 = flashopt.hyper "beta1" default(9.000000e-01) : f32
  %beta2 = flashopt.hyper "beta2" default(9.990000e-01) : f32
  // The betas' extremes over the steps taken (kept by the runtime): Adam's
  // bound holds for every history of betas within them (§8.4).
  %beta1_max = flashopt.hyper "beta1_max" envelope(max of "beta1") : f32
  %beta1_min = flashopt.hyper "beta1_min" envelope(min of "beta1") : f32
  %beta2_max = flashopt.hyper "beta2_max" envelope(max of "beta2") : f32
  %beta2_min = flashopt.hyper "beta2_min" envelope(min of "beta2") : f32
  %eps = flashopt.hyper "eps" default(1.000000e-08) : f32
  %weight_decay = flashopt.hyper "weight_decay" default(0.000000e+00) : f32
  %step = flashopt.step_count : i64
  %one = arith.constant 1.000000e+00 : f32
  %zero = arith.constant 0.000000e+00 : f32
  %omb1 = arith.subf %one, %beta1 : f32
  %omb2 = arith.subf %one, %beta2 : f32
  %p1 = flashopt.powi %beta1, %step : f32, i64
  %p2 = flashopt.powi %beta2, %step : f32, i64
  %bc1 = arith.subf %one, %p1 : f32
  %bc2 = arith.subf %one, %p2 : f32
  // The bound of the bounded numerics (docs/NUMERICS.md §8.4): exact Adam
  // has |m| <= K * sqrt(v), K^2 = sum_k a_k^2 / b_k over the weights a_k of
  // m and b_k of v; with every beta1 in [beta1_min, beta1_max] and beta2 in
  // [beta2_min, beta2_max] so far, K^2 <= (1 - beta1_min)^2 * S /
  // (1 - beta2_max), S = sum_{j<t} r^j, r = beta1_max^2 / beta2_min (with
  // fixed betas: Adam's own bound). So |update| <= lr * K * sqrt(bc2) / bc1
  // (bc1, bc2: the bias corrections of the current betas, as torch takes
  // them); 1 + 2^-8 keeps rounding from ever touching an exact step.
  // Written to stay correct for every 0 <= beta < 1: 1 - r as
  // (beta2_min - beta1_max^2) / beta2_min, the difference in f64 (the square
  // exact there) rounded once to f32, r^t as q1^2 / q2 in f64 (q1, q2 the
  // correctly rounded powers), S = t (times 1 + 2^-6 when r > 1) where
  // t * |1 - r| < 2^-6 (no cancellation), S = 1 when beta1_max = 0, K = inf
  // when beta2_min = 0 < beta1_max (no bound) and K at most the largest f32,
  // so that lr = 0 gives a bound of 0, never NaN.
  %b1w = arith.extf %beta1_max : f32 to f64
  %b2w = arith.extf %beta2_min : f32 to f64
  %b1sqw = arith.mulf %b1w, %b1w : f64
  %dw = arith.subf %b2w, %b1sqw : f64
  %d = arith.truncf %dw : f64 to f32
  %omr = arith.divf %d, %beta2_min : f32
  %q1 = flashopt.powi %beta1_max, %step : f32, i64
  %q2 = flashopt.powi %beta2_min, %step : f32, i64
  %q1w = arith.extf %q1 : f32 to f64
  %q2w = arith.extf %q2 : f32 to f64
  %q1sqw = arith.mulf %q1w, %q1w : f64
  %rtw = arith.divf %q1sqw, %q2w : f64
  %rt0 = arith.truncf %rtw : f64 to f32
  %inf = arith.constant 0x7F800000 : f32
  %r_below_one = arith.cmpf ogt, %d, %zero : f32
  %rt_lim = arith.select %r_below_one, %zero, %inf : f32
  %q2_zero = arith.cmpf oeq, %q2, %zero : f32
  %rt = arith.select %q2_zero, %rt_lim, %rt0 : f32
  %num_s = arith.subf %one, %rt : f32
  %s_geo = arith.divf %num_s, %omr : f32
  %t_f = arith.sitofp %step : i64 to f32
  %abs_omr = math.absf %omr : f32
  %t_omr = arith.mulf %t_f, %abs_omr : f32
  %near_cut = arith.constant 1.562500e-02 : f32
  %near = arith.cmpf olt, %t_omr, %near_cut : f32
  %grow = arith.constant 1.015625 : f32
  %near_f = arith.select %r_below_one, %one, %grow : f32
  %s_near = arith.mulf %t_f, %near_f : f32
  %s_r = arith.select %near, %s_near, %s_geo : f32
  %b1_zero = arith.cmpf oeq, %beta1_max, %zero : f32
  %s_sum = arith.select %b1_zero, %one, %s_r : f32
  %omb1_lo = arith.subf %one, %beta1_min : f32
  %omb2_hi = arith.subf %one, %beta2_max : f32
  %omb1_sq = arith.mulf %omb1_lo, %omb1_lo : f32
  %k2_num = arith.mulf %omb1_sq, %s_sum : f32
  %k2 = arith.divf %k2_num, %omb2_hi : f32
  %k2_bc = arith.mulf %k2, %bc2 : f32
  %k_bc = math.sqrt %k2_bc : f32
  %k_t0 = arith.divf %k_bc, %bc1 : f32
  %b2_zero = arith.cmpf oeq, %beta2_min, %zero : f32
  %b1_pos = arith.cmpf une, %beta1_max, %zero : f32
  %unbounded = arith.andi %b2_zero, %b1_pos : i1
  %k_t1 = arith.select %unbounded, %inf, %k_t0 : f32
  %f32_max = arith.constant 3.40282347E+38 : f32
  %k_t = arith.minimumf %k_t1, %f32_max : f32
  %margin = arith.constant 1.00390625 : f32
  %lr_abs = math.absf %lr : f32
  %lr_m = arith.mulf %lr_abs, %margin : f32
  %max_upd = arith.mulf %lr_m, %k_t : f32
  flashopt.state "exp_avg" : #flashopt.quant<i8, group = 32, compand = softsign, scale = bf16>
  flashopt.state "exp_avg_sq" : #flashopt.quant<ui8, group = 32, compand = e4m4, scale = bf16>
  flashopt.update(%theta: f32, %g0: f32, %m: f32, %v: f32) {
    %decay = arith.mulf %theta, %weight_decay : f32
    %g = arith.addf %g0, %decay : f32
    %m_b = arith.mulf %m, %beta1 : f32
    %g_b = arith.mulf %g, %omb1 : f32
    %m_new = arith.addf %m_b, %g_b : f32
    %v_b = arith.mulf %v, %beta2 : f32
    %gg = arith.mulf %g, %g : f32
    %gg_b = arith.mulf %gg, %omb2 : f32
    %v_new = arith.addf %v_b, %gg_b : f32
    %mh = arith.divf %m_new, %bc1 : f32
    %vh = arith.divf %v_new, %bc2 : f32
    %num = arith.mulf %lr, %mh : f32
    %sq = math.sqrt %vh : f32
    %den = arith.addf %sq, %eps : f32
    %upd0 = arith.divf %num, %den : f32
    %upd = flashopt.bound %upd0, %max_upd : f32
    %theta_new = arith.subf %theta, %upd : f32
    flashopt.yield %theta_new, %m_new, %v_new : f32, f32, f32
  }
}
