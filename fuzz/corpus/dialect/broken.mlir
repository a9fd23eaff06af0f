// A rule file with a syntax error on line 4.
flashopt.optimizer @broken param(#flashopt.master<f32>) grad(f32) {
  flashopt.update(%theta: f32, %g: f32) {
    %t = arith.subf %theta, %g f32
    flashopt.yield %t : f32
  }
}
