// RUN: flashopt-opt %s --flashopt-to-gpu | FileCheck %s

// Packed 4-bit codes on the GPU (GroupBodyEnv::packedAsWords): a lane's W/2
// bytes are read as 32-bit words (bytes little-endian: lane j's nibble at
// bits 4j mod 32 of word 4j / 32), each lane's word shifted right and masked
// as i32 vector operations, then narrowed to i8 (NVPTX scalarizes byte
// shuffles into permutes); stores or each lane's low 4 bits, shifted to its
// place, into its word. Same bytes as the CPU's interleave
// (PtxEmulatorTests).
// CHECK-LABEL: gpu.func @packed(
// CHECK: %[[B:.*]] = flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 8 : i64} : vector<8xi8>
// CHECK: %[[W:.*]] = vector.bitcast %{{.*}} : vector<8xi8> to vector<2xi32>
// CHECK: %[[L:.*]] = vector.shuffle %[[W]], %[[W]] [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1] : vector<2xi32>, vector<2xi32>
// CHECK: %[[SH:.*]] = arith.constant dense<[0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28]> : vector<16xi32>
// CHECK: %[[S:.*]] = arith.shrui %[[L]], %[[SH]] : vector<16xi32>
// CHECK: %[[M:.*]] = arith.andi %[[S]], %{{.*}} : vector<16xi32>
// CHECK: arith.trunci %[[M]] : vector<16xi32> to vector<16xi8>
// CHECK: arith.extui %{{.*}} : vector<16xi8> to vector<16xi32>
// CHECK: %[[L0:.*]] = arith.andi %{{.*}}, %{{.*}} : i32
// CHECK: %[[L1:.*]] = arith.andi %{{.*}}, %{{.*}} : i32
// CHECK: %[[S1:.*]] = arith.shli %[[L1]], %{{.*}} : i32
// CHECK: arith.ori %[[L0]], %[[S1]] : i32
// CHECK: %[[WS:.*]] = vector.from_elements %{{.*}}, %{{.*}} : vector<2xi32>
// CHECK: %[[BS:.*]] = vector.bitcast %[[WS]] : vector<2xi32> to vector<8xi8>
// CHECK: flashopt.raw_store %[[BS]], %{{.*}}[%{{.*}}] {alignment = 8 : i64} : vector<8xi8>
flashopt.kernel @packed group_size(32) buffers([#flashopt.buffer<"m.codes", i4, element, readwrite>, #flashopt.buffer<"v.codes", ui4, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %m = flashopt.load_element 0 : i8
    %v = flashopt.load_element 1 : i8
    %s = arith.addi %m, %v : i8
    flashopt.store_element 0, %s : i8
    flashopt.store_element 1, %m : i8
  }
}
