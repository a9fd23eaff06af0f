// SGDW: SGD with decoupled weight decay, docs/NUMERICS.md §4.
flashopt.optimizer @sgdw param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  %momentum = flashopt.hyper "momentum" default(0.000000e+00) : f32
  %dampening = flashopt.hyper "dampening" default(0.000000e+00) : f32
  %weight_decay = flashopt.hyper "weight_decay" default(0.000000e+00) : f32
  %nesterov = flashopt.hyper "nesterov" default(0.000000e+00) : f32
  %decouple_lr = flashopt.hyper "decouple_lr" default(0.000000e+00) : f32
  %initial_lr = flashopt.hyper "initial_lr" default(1.000000e-03) : f32
  %one = arith.constant 1.000000e+00 : f32
  %zero = arith.constant 0.000000e+00 : f32
  %omd = arith.subf %one, %dampening : f32
  %no_momentum = arith.cmpf oeq, %momentum, %zero : f32
  %use_nesterov = arith.cmpf une, %nesterov, %zero : f32
  %ratio = arith.divf %lr, %initial_lr : f32
  %w_rel = arith.mulf %weight_decay, %ratio : f32
  %w_abs = arith.mulf %weight_decay, %lr : f32
  %is_rel = arith.cmpf une, %decouple_lr, %zero : f32
  %w = arith.select %is_rel, %w_rel, %w_abs : f32
  %dec = arith.subf %one, %w : f32
  flashopt.state "momentum_buffer" elidable("momentum") : #flashopt.quant<i8, group = 32, compand = softsign, scale = bf16>
  flashopt.update(%theta: f32, %g: f32, %m: f32) {
    %m_mu = arith.mulf %m, %momentum : f32
    %g_d = arith.mulf %g, %omd : f32
    %m_new = arith.addf %m_mu, %g_d : f32
    %theta_d = arith.mulf %theta, %dec : f32
    %mu_m = arith.mulf %momentum, %m_new : f32
    %nest = arith.addf %g, %mu_m : f32
    %with_m = arith.select %use_nesterov, %nest, %m_new : f32
    %u = arith.select %no_momentum, %g, %with_m : f32
    %step = arith.mulf %u, %lr : f32
    %theta_new = arith.subf %theta_d, %step : f32
    flashopt.yield %theta_new, %m_new : f32, f32
  }
}
