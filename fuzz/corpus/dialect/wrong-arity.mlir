// A rule whose update region forgets its state argument.
flashopt.optimizer @wrong param(#flashopt.master<f32>) grad(f32) {
  flashopt.state "m" : #flashopt.plain<f32>
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta, %g : f32, f32
  }
}
