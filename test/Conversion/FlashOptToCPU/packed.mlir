// RUN: flashopt-opt %s --flashopt-to-cpu | FileCheck %s

// Packed 4-bit codes (docs/KERNEL-ABI.md): a worker's W = 32 elements are
// W/2 = 16 bytes at byte index elementIndex / 2, element 2j in the low and
// 2j + 1 in the high nibble of byte j. Loads give i8 lanes, the raw nibbles
// (and 15 / shr 4) of i4 and ui4 codes alike (a signed decode sign-extends
// them), interleaved; stores take the even and odd lanes' low 4 bits.
// CHECK-LABEL: func.func @packed(
// CHECK: scf.if
// CHECK: %[[I2:.*]] = arith.shrui %[[E:.*]], %{{.*}} : index
// CHECK: %[[MB:.*]] = flashopt.raw_load %{{.*}}[%[[I2]]] : vector<16xi8>
// CHECK: %[[MLO:.*]] = arith.andi %[[MB]], %{{.*}} : vector<16xi8>
// CHECK: %[[MHI:.*]] = arith.shrui %[[MB]], %{{.*}} : vector<16xi8>
// CHECK: %[[M:.*]] = vector.shuffle %[[MLO]], %[[MHI]] [0, 16, 1, 17, 2, 18, {{.*}}, 15, 31] : vector<16xi8>, vector<16xi8>
// CHECK: %[[VB:.*]] = flashopt.raw_load %{{.*}}[%{{.*}}] : vector<16xi8>
// CHECK: %[[VLO:.*]] = arith.andi %[[VB]], %{{.*}} : vector<16xi8>
// CHECK: %[[VHI:.*]] = arith.shrui %[[VB]], %{{.*}} : vector<16xi8>
// CHECK: %[[V:.*]] = vector.shuffle %[[VLO]], %[[VHI]] [0, 16, 1, 17,
// CHECK: %[[S:.*]] = arith.addi %[[M]], %[[V]] : vector<32xi8>
// CHECK: %[[EV:.*]] = vector.shuffle %[[S]], %[[S]] [0, 2, 4, {{.*}}, 30] : vector<32xi8>, vector<32xi8>
// CHECK: %[[OD:.*]] = vector.shuffle %[[S]], %[[S]] [1, 3, 5, {{.*}}, 31] : vector<32xi8>, vector<32xi8>
// CHECK: %[[HI:.*]] = arith.shli %[[OD]], %{{.*}} : vector<16xi8>
// CHECK: %[[LO:.*]] = arith.andi %[[EV]], %{{.*}} : vector<16xi8>
// CHECK: %[[B:.*]] = arith.ori %[[LO]], %[[HI]] : vector<16xi8>
// CHECK: flashopt.raw_store %[[B]], %{{.*}}[%{{.*}}] : vector<16xi8>
// The partial last group: a byte is valid with its even element (element
// index + 2j < numel), and lanes past the end store 0, so the pad nibble of
// an odd-length tensor is 0.
// CHECK: } else {
// CHECK: %[[EVEN:.*]] = arith.constant dense<[0, 2, 4, 6, {{.*}}, 30]> : vector<16xindex>
// CHECK: %[[POS:.*]] = arith.addi %{{.*}}, %[[EVEN]] : vector<16xindex>
// CHECK: %[[BM:.*]] = arith.cmpi slt, %[[POS]], %{{.*}} : vector<16xindex>
// CHECK: flashopt.raw_load %{{.*}}[%{{.*}}] mask(%[[BM]] : vector<16xi1>) : vector<16xi8>
// CHECK: %[[EM:.*]] = arith.cmpi slt, %{{.*}}, %{{.*}} : vector<32xindex>
// CHECK: %[[KEPT:.*]] = arith.select %[[EM]], %{{.*}}, %{{.*}} : vector<32xi1>, vector<32xi8>
// CHECK: vector.shuffle %[[KEPT]], %[[KEPT]] [0, 2,
// CHECK: flashopt.raw_store %{{.*}}, %{{.*}}[%{{.*}}] mask(%{{.*}} : vector<16xi1>) : vector<16xi8>
flashopt.kernel @packed group_size(32) buffers([#flashopt.buffer<"m.codes", i4, element, readwrite>, #flashopt.buffer<"v.codes", ui4, element, readwrite>]) hypers([]) {
  flashopt.group_body {
    %m = flashopt.load_element 0 : i8
    %v = flashopt.load_element 1 : i8
    %s = arith.addi %m, %v : i8
    flashopt.store_element 0, %s : i8
    flashopt.store_element 1, %m : i8
  }
}
