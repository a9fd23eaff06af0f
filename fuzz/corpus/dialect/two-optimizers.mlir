flashopt.optimizer @a param(#flashopt.master<f32>) grad(f32) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}
flashopt.optimizer @b param(#flashopt.master<f32>) grad(f32) {
  flashopt.update(%theta: f32, %g: f32) {
    flashopt.yield %theta : f32
  }
}
