// RUN: flashopt-opt %s --flashopt-guarded-quantize --flashopt-to-gpu | FileCheck %s
// RUN: flashopt-opt %s --flashopt-guarded-quantize --flashopt-to-gpu | flashopt-opt --pass-pipeline='builtin.module(gpu.module(flashopt-convert-to-nvvm))' | FileCheck %s --check-prefix=NVVM

// A flashopt.guarded of two codes on the GPU (f32 streams: 4 lanes per
// thread): one compare per lane of the merged slack, and-ed into one branch;
// the fast vectors where every lane holds, else lane by lane the fallback's
// scalar code for the lanes whose guard fails.
// CHECK: %[[SLACK:.*]] = arith.maximumf %{{.*}}, %{{.*}} : vector<4xf32>
// CHECK: %[[S0:.*]] = vector.extract %[[SLACK]][0] : f32 from vector<4xf32>
// CHECK: %[[OK0:.*]] = arith.cmpf ole, %[[S0]], %[[LIMIT:.*]] : f32
// CHECK: %[[S1:.*]] = vector.extract %[[SLACK]][1] : f32 from vector<4xf32>
// CHECK: %[[OK1:.*]] = arith.cmpf ole, %[[S1]], %[[LIMIT]] : f32
// CHECK: arith.andi %[[OK0]], %[[OK1]] : i1
// CHECK: arith.andi %{{.*}}, %{{.*}} : i1
// CHECK: %[[ALL:.*]] = arith.andi %{{.*}}, %{{.*}} : i1
// CHECK: %{{.*}}:2 = scf.if %[[ALL]] -> (vector<4xi8>, vector<4xi8>) {
// CHECK-NEXT: scf.yield %[[FM:.*]], %[[FV:.*]] : vector<4xi8>, vector<4xi8>
// CHECK-NEXT: } else {
// CHECK-NEXT: %[[L0:.*]]:2 = scf.if %[[OK0]] -> (i8, i8) {
// CHECK: } else {
// CHECK: arith.divf
// CHECK: arith.fptosi %{{.*}} : f32 to i8
// CHECK: math.sqrt
// CHECK: arith.fptoui %{{.*}} : f32 to i8
// CHECK: vector.insert %[[L0]]#0, %[[FM]] [0] : i8 into vector<4xi8>
// CHECK: scf.if %[[OK1]] -> (i8, i8) {
// NVVM: llvm.call_intrinsic "llvm.nvvm.rcp.approx.ftz.f"
// NVVM: llvm.call_intrinsic "llvm.nvvm.sqrt.approx.ftz.f"
flashopt.kernel @codes group_size(32) buffers([#flashopt.buffer<"m", f32, element, read>, #flashopt.buffer<"v", f32, element, read>, #flashopt.buffer<"m.codes", i8, element, readwrite>, #flashopt.buffer<"v.codes", ui8, element, readwrite>, #flashopt.buffer<"v.scales", f16, group, readwrite>]) hypers([]) {
  flashopt.group_body {
    %m = flashopt.load_element 0 : f32
    %v = flashopt.load_element 1 : f32
    %am = math.absf %m : f32
    %gm = flashopt.group_max %am : f32
    %floor = arith.constant 9.99999996E-13 : f32
    %a = arith.maximumf %gm, %floor : f32
    %n = arith.divf %m, %a : f32
    %two = arith.constant 2.000000e+00 : f32
    %n2 = arith.mulf %two, %n : f32
    %an = math.absf %n : f32
    %one = arith.constant 1.000000e+00 : f32
    %den = arith.addf %one, %an : f32
    %t = arith.divf %n2, %den : f32
    %c127 = arith.constant 1.270000e+02 : f32
    %s = arith.mulf %t, %c127 : f32
    %half = arith.constant 5.000000e-01 : f32
    %h = arith.addf %s, %half : f32
    %f = math.floor %h : f32
    %nan = arith.cmpf uno, %f, %f : f32
    %zero = arith.constant 0.000000e+00 : f32
    %q = arith.select %nan, %zero, %f : f32
    %code = arith.fptosi %q : f32 to i8
    flashopt.store_element 2, %code : i8
    %y = math.sqrt %v : f32
    %ay = math.absf %y : f32
    %gv = flashopt.group_max %ay : f32
    %av = arith.maximumf %gv, %floor : f32
    %sc = arith.truncf %av : f32 to f16
    %nv = arith.divf %y, %av : f32
    %c255 = arith.constant 2.550000e+02 : f32
    %sv = arith.mulf %nv, %c255 : f32
    %hv = arith.addf %sv, %half : f32
    %fv = math.floor %hv : f32
    %nanv = arith.cmpf uno, %fv, %fv : f32
    %qv = arith.select %nanv, %zero, %fv : f32
    %codev = arith.fptoui %qv : f32 to i8
    flashopt.store_group 4, %sc : f16
    flashopt.store_element 3, %codev : i8
  }
}
