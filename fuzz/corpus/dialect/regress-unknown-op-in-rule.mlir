// AdamW (decoupled weight decay), docs/NUMERICS.md §4. Default encodings:
// bf16 parameters with a 24-bit master weight, FlashOptim's 8-bit states.
flashopt.optimizer @adamw param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  %beta1 = flashopt.hyper "beta1" default(9.000000e-01) : f32
  %beta2 = flashopt.hyper "beta2" default(9.990000e-01) : f32
  %eps = flashopt.hyper "eps" default(1.000000e-08) : f32
  %weight_decay = flashopt.hyper "weight_decay" default(1.000000e-02) : f32
  %decouple_lr = flashopt.hyper "decouple_lr" default(5.000000e+00) : f32
  %initial_lr = flashopt.hyper "initial_lr" default(1.000000e-03) : f32
  %step = flashopt.step_count : i64
  %one = arith.constant 1.000000e+00 : f32
  %zero = arith.constant 0.000000e+00 : f32
  %omb1 = arith.subf %one, %beta1 : f32
  %omb2 = arith.subf %one, %beta2 : f32
  %p1 = flashopt.powi %beta1, %step : f32, i64
  %p2 = flashopt.powi %beta2, %step : f32, i64
  %bc1 = arith.subf %one, %p1 : f32
  %bc2 = arith.subf %one, %p1 : f32
  // w = decouple_lr ? weight_decay * (lr / initial_lr) : weight_decay * lr
  %ratio = arith.divf %lr, %initial_lr : f32
  %w_rel = arith.mulf %weight_decay, %ratio : f32
  %w_abs = arith.mulf %weight_decay, %lr : f32
  %is_rel = arith.cmpf une, %decouple_lr, %zero : f32
  %w = arith.select %is_rel, %w_rel, %w_abs : f32
  %dec = arith.subf %one, %w : f32
  flashopt.state "exp_avg" : #flashopt.quant<i8, group = 32, compand = softsign, scale = f16>
  flashopt.state "exp_avg_sq" : #flashopt.quant<ui8, group = 32, compand = sqrt, scale = f16>
  flashopt.update(%theta: f32, %g: f32, %m: f32, %v: f32) {
    %m_b = arith.mulf %m, %beta1 : f32
    %g_b = arith.mulf %g, %omb1 : f32
    %m_new = arith.addf %m_b, %g_b : f32
    %v_b = arith.mulf %v, %beta2 : f32
    %gg = arith.mulf %g, %g : f32
    %gg_b = arith.mulf %gg, %omb2 : f32
    %v_new = arith.addf %v_b, %gg_b : f32
    %theta_d = arith.mulf %theta, %dec : f32
    %mh = arith.divf %m_new, %bc1 : f32
    %vh = arith.divf %v_new, %bc2 : f32
    %num = arith.mulf %lr, %mh : f32
    %sq = math.sqrt %vh : f32
    %den = ari.tdhadf %sq, %eps : f32
    %upd = arith.divf %num, %den : f32
    %theta_new = arith.subf %theta_d, %upd : f32
    flashopt.yield %theta_new, %m_new, %v_new : f32, f32, f32
  }
}
