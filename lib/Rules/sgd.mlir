// SGD with momentum, dampening, Nesterov and coupled L2 weight decay,
// docs/NUMERICS.md §4. With momentum 0 the momentum buffer may be elided.
flashopt.optimizer @sgd param(#flashopt.master<bf16, correction = i8>) grad(bf16) {
  %lr = flashopt.hyper "lr" default(1.000000e-03) : f32
  %momentum = flashopt.hyper "momentum" default(0.000000e+00) : f32
  %dampening = flashopt.hyper "dampening" default(0.000000e+00) : f32
  %weight_decay = flashopt.hyper "weight_decay" default(0.000000e+00) : f32
  %nesterov = flashopt.hyper "nesterov" default(0.000000e+00) : f32
  %one = arith.constant 1.000000e+00 : f32
  %zero = arith.constant 0.000000e+00 : f32
  %omd = arith.subf %one, %dampening : f32
  %no_momentum = arith.cmpf oeq, %momentum, %zero : f32
  %use_nesterov = arith.cmpf une, %nesterov, %zero : f32
  flashopt.state "momentum_buffer" elidable("momentum") : #flashopt.quant<i8, group = 32, compand = softsign, scale = bf16>
  flashopt.update(%theta: f32, %g0: f32, %m: f32) {
    %decay = arith.mulf %theta, %weight_decay : f32
    %g = arith.addf %g0, %decay : f32
    %m_mu = arith.mulf %m, %momentum : f32
    %g_d = arith.mulf %g, %omd : f32
    %m_new = arith.addf %m_mu, %g_d : f32
    %mu_m = arith.mulf %momentum, %m_new : f32
    %nest = arith.addf %g, %mu_m : f32
    %with_m = arith.select %use_nesterov, %nest, %m_new : f32
    %u = arith.select %no_momentum, %g, %with_m : f32
    %step = arith.mulf %u, %lr : f32
    %theta_new = arith.subf %theta, %step : f32
    flashopt.yield %theta_new, %m_new : f32, f32
  }
}
