// RUN: flashopt-opt %s --flashopt-to-gpu | FileCheck %s

// Packed 4-bit codes on the GPU (GroupBodyEnv::packedAsWords): a lane's W/2
// bytes are read as 32-bit words (bytes little-endian: lane j's nibble at
// bits 4j mod 32 of word 4j / 32), each word split once into its even
// lanes' codes (w & 0x0F0F0F0F = 252645135) and its odd lanes' ((w >> 4) &
// 0x0F0F0F0F), one code per byte, and lane j is byte j/2 of the one or the
// other (a PRMT each on NVPTX). Stores build a byte per lane pair, (lane 2k
// & 15) | (lane 2k+1 << 4), and the bytes into the stored vector. Same bytes
// as the CPU's interleave (PtxEmulatorTests). The body is emitted twice
// (flashopt-to-gpu{full-warp-path}): unpredicated for warps of full vectors,
// with the split inside each plain/masked arm otherwise.
// CHECK-LABEL: gpu.func @packed(
// CHECK: gpu.subgroup_reduce  and
// CHECK: scf.if
// CHECK: %[[B:.*]] = flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 8 : i64} : vector<8xi8>
// CHECK: %[[W:.*]] = vector.bitcast %[[B]] : vector<8xi8> to vector<2xi32>
// CHECK: %[[LO:.*]] = arith.andi %[[W]], %{{.*}} : vector<2xi32>
// CHECK: %[[SH:.*]] = arith.shrui %[[W]], %{{.*}} : vector<2xi32>
// CHECK: %[[HI:.*]] = arith.andi %[[SH]], %{{.*}} : vector<2xi32>
// CHECK: %[[BOTH:.*]] = vector.shuffle %[[LO]], %[[HI]] [0, 1, 2, 3] : vector<2xi32>, vector<2xi32>
// CHECK: %[[BYTES:.*]] = vector.bitcast %[[BOTH]] : vector<4xi32> to vector<16xi8>
// CHECK: vector.shuffle %[[BYTES]], %[[BYTES]] [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15] : vector<16xi8>, vector<16xi8>
// CHECK: arith.extui %{{.*}} : vector<16xi8> to vector<16xi32>
// CHECK: %[[L0:.*]] = arith.andi %{{.*}}, %{{.*}} : i32
// CHECK: %[[S1:.*]] = arith.shli %{{.*}}, %{{.*}} : i32
// CHECK: %[[P:.*]] = arith.ori %[[L0]], %[[S1]] : i32
// CHECK: arith.trunci %[[P]] : i32 to i8
// CHECK: %[[BS:.*]] = vector.from_elements %{{.*}} : vector<8xi8>
// CHECK: flashopt.raw_store %[[BS]], %{{.*}}[%{{.*}}] {alignment = 8 : i64} : vector<8xi8>
// CHECK: } else {
// CHECK: scf.if %{{.*}} -> (vector<4xi32>) {
// CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] {alignment = 8 : i64} : vector<8xi8>
// CHECK: arith.andi %{{.*}}, %{{.*}} : vector<2xi32>
// CHECK: } else {
// CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] mask(%{{.*}} : vector<8xi1>) : vector<8xi8>
flashopt.kernel @packed group_size(32) buffers([#flashopt.buffer<"m.codes", i4, element, readwrite>, #flashopt.buffer<"v.codes", ui4, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %m = flashopt.load_element 0 : i8
    %v = flashopt.load_element 1 : i8
    %s = arith.addi %m, %v : i8
    flashopt.store_element 0, %s : i8
    flashopt.store_element 1, %m : i8
  }
}
