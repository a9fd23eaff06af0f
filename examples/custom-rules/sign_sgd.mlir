// signSGD with decoupled weight decay: theta <- theta * (1 - lr*wd) - lr * sign(g).
// A rule written as a file: no C++ anywhere knows this optimizer.
flashopt.optimizer @sign_sgd param(#flashopt.master<f32>) grad(f32) {
  %lr = flashopt.hyper "lr" default(1.000000e-02) : f32
  %wd = flashopt.hyper "weight_decay" default(0.000000e+00) : f32
  %one = arith.constant 1.000000e+00 : f32
  %zero = arith.constant 0.000000e+00 : f32
  %minus_one = arith.constant -1.000000e+00 : f32
  %w = arith.mulf %lr, %wd : f32
  %dec = arith.subf %one, %w : f32
  flashopt.update(%theta: f32, %g: f32) {
    %pos = arith.cmpf ogt, %g, %zero : f32
    %neg = arith.cmpf olt, %g, %zero : f32
    %s_neg = arith.select %neg, %minus_one, %zero : f32
    %s = arith.select %pos, %one, %s_neg : f32
    %decayed = arith.mulf %theta, %dec : f32
    %step = arith.mulf %s, %lr : f32
    %theta_new = arith.subf %decayed, %step : f32
    flashopt.yield %theta_new : f32
  }
}
