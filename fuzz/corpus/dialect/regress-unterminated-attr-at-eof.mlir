// Adam (coupled L2 weight decay), docs/NUMERICS.md hopt.hyper "eps" default(1.000000e-08) : f32
  %weight_decay = flashopt.hyper "weight_decay" default(0.000000e+00) : f32
  %step = flashopt.step_count : i64
  %one = arith.constant 1.000000e+00 : f32
  %omb1 = arith.subf %one, %beta1 : f32
  %omb2 = arith.subf %one, %beta2 : f32
  %p1 = flashopt.powi %beta1, %step : f32, i64
  %p2 = flashopt.powi %beta2, %step : f32, i64
  %bc1 = arith.subf %one, %p1 : f32
  %bc2 = arith.subf %one, %p2 : f32
  flashopt.state "exp_avg" : #flashopt.quant