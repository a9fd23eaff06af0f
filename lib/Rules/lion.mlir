// Lion (decoupled weight decay), docs/NUMERICS.md §4.
flashopt.optimizer @lion param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
  %lr = flashopt.hyper "lr" default(1.000000e-04) : f32
  %beta1 = flashopt.hyper "beta1" default(9.000000e-01) : f32
  %beta2 = flashopt.hyper "beta2" default(9.900000e-01) : f32
  %weight_decay = flashopt.hyper "weight_decay" default(0.000000e+00) : f32
  %decouple_lr = flashopt.hyper "decouple_lr" default(0.000000e+00) : f32
  %initial_lr = flashopt.hyper "initial_lr" default(1.000000e-04) : f32
  %one = arith.constant 1.000000e+00 : f32
  %zero = arith.constant 0.000000e+00 : f32
  %minus_one = arith.constant -1.000000e+00 : f32
  %omb1 = arith.subf %one, %beta1 : f32
  %omb2 = arith.subf %one, %beta2 : f32
  %ratio = arith.divf %lr, %initial_lr : f32
  %w_rel = arith.mulf %weight_decay, %ratio : f32
  %w_abs = arith.mulf %weight_decay, %lr : f32
  %is_rel = arith.cmpf une, %decouple_lr, %zero : f32
  %w = arith.select %is_rel, %w_rel, %w_abs : f32
  %dec = arith.subf %one, %w : f32
  flashopt.state "exp_avg" : #flashopt.quant<i8, group = 32, compand = softsign, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %m_b1 = arith.mulf %m, %beta1 : f32
    %g_b1 = arith.mulf %g, %omb1 : f32
    %c = arith.addf %m_b1, %g_b1 : f32
    %pos = arith.cmpf ogt, %c, %zero : f32
    %neg = arith.cmpf olt, %c, %zero : f32
    %s_neg = arith.select %neg, %minus_one, %zero : f32
    %u_num = arith.select %pos, %one, %s_neg : f32
    // sign(c) + (c - c): NaN for a NaN or infinite c (docs/NUMERICS.md §5),
    // so that a non-finite gradient makes its weight NaN in the same step,
    // visibly, instead of leaving it finite while its group's states are
    // not; c - c is +0 for every finite c.
    %c_nf = arith.subf %c, %c : f32
    %u = arith.addf %u_num, %c_nf : f32
    %m_b2 = arith.mulf %m, %beta2 : f32
    %g_b2 = arith.mulf %g, %omb2 : f32
    %m_new = arith.addf %m_b2, %g_b2 : f32
    %theta_d = arith.mulf %theta, %dec : f32
    %step = arith.mulf %u, %lr : f32
    %theta_new = arith.subf %theta_d, %step : f32
    flashopt.yield %theta_new, %m_new : f32, f32
  }
}
