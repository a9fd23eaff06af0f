// Adam (coupled L2 weight decay), docs/NUMERICS.md §4.
flashopt.optimizer @adam param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  %beta1 = flashopt.hyper "beta1" default(9.000000e-01) : f32
  %beta2 = flashopt.hyper "beta2" default(9.990000e-01) : f32
  %eps = flashopt.hyper "eps" default(1.000000e-08) : f32
  %weight_decay = flashopt.hyper "weight_decay" default(0.000000e+00) : f32
  %step = flashopt.step_count : i64
  %one = arith.constant 1.000000e+00 : f32
  %omb1 = arith.subf %one, %beta1 : f32
  %omb2 = arith.subf %one, %beta2 : f32
  %p1 = flashopt.powi %beta1, %step : f32, i64
  %p2 = flashopt.powi %beta2, %step : f32, i64
  %bc1 = arith.subf %one, %p1 : f32
  %bc2 = arith.subf %one, %p2 : f32
  // The bound of the bounded numerics (docs/NUMERICS.md §8): exact Adam
  // has |m| <= K * sqrt(v), K^2 = (1 - beta1)^2 * S / (1 - beta2),
  // S = sum_{j<t} (beta1^2 / beta2)^j, so |update| <= lr * K * sqrt(bc2) /
  // bc1; 1 + 2^-8 keeps rounding from ever touching an exact step.
  %b1sq = arith.mulf %beta1, %beta1 : f32
  %r = arith.divf %b1sq, %beta2 : f32
  %pr = flashopt.powi %r, %step : f32, i64
  %num_s = arith.subf %one, %pr : f32
  %den_s = arith.subf %one, %r : f32
  %s_geo = arith.divf %num_s, %den_s : f32
  %t_f = arith.sitofp %step : i64 to f32
  %r_is_one = arith.cmpf oeq, %r, %one : f32
  %s_sum = arith.select %r_is_one, %t_f, %s_geo : f32
  %omb1_sq = arith.mulf %omb1, %omb1 : f32
  %k2_num = arith.mulf %omb1_sq, %s_sum : f32
  %k2 = arith.divf %k2_num, %omb2 : f32
  %k2_bc = arith.mulf %k2, %bc2 : f32
  %k_bc = math.sqrt %k2_bc : f32
  %k_t = arith.divf %k_bc, %bc1 : f32
  %margin = arith.constant 1.00390625 : f32
  %lr_abs = math.absf %lr : f32
  %lr_m = arith.mulf %lr_abs, %margin : f32
  %max_upd = arith.mulf %lr_m, %k_t : f32
  flashopt.state "exp_avg" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
  flashopt.state "exp_avg_sq" : #flashopt.quant<ui8, group = 32, compand = sqrt, scale = f16>
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
