// RUN: flashopt-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

func.func @f(%base: i64, %i: index) {
  // expected-error @+1 {{alignment must be a positive power of two, got 3}}
  %a = flashopt.raw_load %base[%i] {alignment = 3} : f32
  return
}

// -----

func.func @f(%base: i64, %i: index, %m: vector<4xi1>) {
  // expected-error @+1 {{mask length 4 does not match vector length 8}}
  %a = flashopt.raw_load %base[%i] mask(%m : vector<4xi1>) : vector<8xf32>
  return
}

// -----

func.func @f(%base: i64, %i: index, %m: vector<4xi1>) {
  // expected-error @+1 {{a mask requires a vector access}}
  %a = flashopt.raw_load %base[%i] mask(%m : vector<4xi1>) : f32
  return
}

// -----

func.func @f(%base: i64, %i: index, %v: vector<2x4xf32>) {
  // expected-error @+1 {{vector accesses must be 1-D and fixed-size}}
  flashopt.raw_store %v, %base[%i] : vector<2x4xf32>
  return
}

// -----

func.func @f(%base: i64, %i: index, %v: index) {
  // expected-error @+1 {{accessed type must be an integer or float scalar or vector, got 'index'}}
  flashopt.raw_store %v, %base[%i] : index
  return
}

// -----

func.func @short_table(%k: i8) -> f32 {
  // expected-error @+1 {{needs a table of 2^8 = 256 entries for a 8-bit index, got 'tensor<255xf32>'}}
  %v = flashopt.table_lookup %k {table = dense<1.0> : tensor<255xf32>} : i8 -> f32
  return %v : f32
}

// -----

func.func @table_type(%k: vector<4xi8>) -> vector<4xf32> {
  // expected-error @+1 {{table elements 'f16' differ from the result type 'vector<4xf32>'}}
  %v = flashopt.table_lookup %k {table = dense<1.0> : tensor<256xf16>} : vector<4xi8> -> vector<4xf32>
  return %v : vector<4xf32>
}
