// RUN: flashopt-opt %s --flashopt-to-cpu | FileCheck %s

// flashopt.dither (docs/NUMERICS.md §8): h = i * (12367 << 18) + (H(t) << 18)
// in i32 (wrapping: the top 14 bits are (12367 i + H(t)) mod 2^14, H(t) the
// top 14 bits of the step's hash), i the element's index in its tensor (the
// record's element offset, word 3, plus the element's index in the record),
// one lane term per element of the group; bits (h >> 9) | 0x3F800000 are
// 1 + u, minus the offset.
// CHECK-LABEL: func.func @k(
// CHECK-SAME: %[[TABLE:[a-z0-9]+]]: i64, %{{[a-z0-9]+}}: i64, %{{[a-z0-9]+}}: i64, %[[STEP:[a-z0-9]+]]: i64,
// CHECK: %[[WORD3:.*]] = arith.addi %{{.*}}, %c3 : index
// CHECK: %[[OFF:.*]] = flashopt.raw_load %[[TABLE]][%[[WORD3]]] {alignment = 8 : i64} : i64
// CHECK: %[[FIRST:.*]] = arith.index_castui %{{.*}} : index to i32
// CHECK: %[[OFF32:.*]] = arith.trunci %[[OFF]] : i64 to i32
// CHECK: %[[I:.*]] = arith.addi %[[FIRST]], %[[OFF32]] : i32
// CHECK: %[[T:.*]] = arith.trunci %[[STEP]] : i64 to i32
// CHECK: %[[X1:.*]] = arith.shrui %[[T]], %{{.*}} : i32
// CHECK: %[[X2:.*]] = arith.xori %[[T]], %[[X1]] : i32
// CHECK: arith.muli %[[X2]], %{{.*}}569420461{{.*}} : i32
// CHECK: arith.muli %{{.*}}, %{{.*}}1935289751{{.*}} : i32
// CHECK: %[[X6:.*]] = arith.xori
// CHECK: %[[TM:.*]] = arith.andi %[[X6]], %{{.*}}-262144{{.*}} : i32
// CHECK: %[[IM:.*]] = arith.muli %[[I]], %{{.*}}-1053032448{{.*}} : i32
// CHECK: %[[H0:.*]] = arith.addi %[[IM]], %[[TM]] : i32
// CHECK: %[[LANES:.*]] = arith.constant dense<[0, -1053032448, -2106064896, 1135869952, 82837504,
// CHECK: %[[HB:.*]] = vector.broadcast %[[H0]] : i32 to vector<32xi32>
// CHECK: %[[H:.*]] = arith.addi %[[HB]], %[[LANES]] : vector<32xi32>
// CHECK-DAG: %[[ONE:.*]] = arith.constant dense<1065353216> : vector<32xi32>
// CHECK-DAG: %[[NINE:.*]] = arith.constant dense<9> : vector<32xi32>
// CHECK: %[[S:.*]] = arith.shrui %[[H]], %[[NINE]] : vector<32xi32>
// CHECK: %[[BITS:.*]] = arith.addi %[[S]], %[[ONE]] : vector<32xi32>
// CHECK: %[[W:.*]] = arith.bitcast %[[BITS]] : vector<32xi32> to vector<32xf32>
// CHECK: %[[OFFSET:.*]] = arith.constant dense<1.500000e+00> : vector<32xf32>
// CHECK: arith.subf %[[W]], %[[OFFSET]] : vector<32xf32>
flashopt.kernel @k group_size(32) buffers([#flashopt.buffer<"param", f32, element, readwrite>]) hypers([]) {
  %t = flashopt.step_count : i64
  flashopt.group_body {
    %p = flashopt.load_element 0 : f32
    %u = flashopt.dither %t {offset = 1.5 : f32} : f32
    %s = arith.addf %p, %u : f32
    flashopt.store_element 0, %s : f32
  }
}

// A state's phase (k * 3462 for the k-th quantized state) adds phase << 18
// to the worker's part; an i32 dither is the word h itself (the minifloat
// codes add it to the bits they round, docs/NUMERICS.md §2d).
// CHECK-LABEL: func.func @phase(
// CHECK: arith.muli %{{.*}}, %{{.*}}-1053032448{{.*}} : i32
// CHECK: %[[H0:.*]] = arith.addi %{{.*}}, %{{.*}} : i32
// CHECK: %[[P:.*]] = arith.addi %[[H0]], %{{.*}}907542528{{.*}} : i32
// CHECK: %[[HB:.*]] = vector.broadcast %[[P]] : i32 to vector<32xi32>
// CHECK: %[[H:.*]] = arith.addi %[[HB]], %{{.*}} : vector<32xi32>
// CHECK-NOT: arith.bitcast
// CHECK: %[[S:.*]] = arith.shrui %[[H]], %{{.*}} : vector<32xi32>
// CHECK: arith.trunci %[[S]] : vector<32xi32> to vector<32xi8>
flashopt.kernel @phase group_size(32) buffers([#flashopt.buffer<"codes", i8, element, readwrite>]) hypers([]) {
  %t = flashopt.step_count : i64
  flashopt.group_body {
    %w = flashopt.dither %t {offset = 0.0 : f32, phase = 3462 : i32} : i32
    %c24 = arith.constant 24 : i32
    %h = arith.shrui %w, %c24 : i32
    %b = arith.trunci %h : i32 to i8
    flashopt.store_element 0, %b : i8
  }
}
