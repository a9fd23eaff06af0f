//===- NcclTest.cpp - The NCCL communicator over real MPI ranks -----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Run under mpirun (ctest: -np 1, 2, 3 against the stand-in libnccl and
/// the PTX-interpreting stand-in driver; scripts/device-check.sh: -np 1 on
/// a GPU with the real libnccl). Every rank steps CUDA optimizers whose
/// parameters and gradients are device memory, and checks
///  - an NCCL communicator (flashopt_comm_create_nccl) attached: replicas
///    bit-identical after every step (parameters, fp32 masters and the
///    averaged gradients, hashed and all-gathered), in both reduce modes,
///    from different initial values (rank 0's are copied to all);
///  - deterministic mode bit-identical to the same optimizer with the MPI
///    communicator (host path): parameters, masters and averaged gradients;
///  - the gradients went through NCCL (the stand-in counts the bytes);
///  - sizes 1, 31, 33, 100, 4097 (divisible neither by W nor by 32, some
///    smaller than W x 32), several buckets, one reduced early;
///  - sharded (ZeRO-1) over NCCL and over MPI == replicated bit for bit
///    after every step, the memory report holding only this rank's shard;
///  - gradient accumulation on CUDA: == a CPU optimizer on its own;
///    replicated over NCCL == over MPI == sharded, the same on every rank;
///  - a layout that differs on one rank is FLASHOPT_ERROR_MISMATCH on every
///    rank, and so is a CPU optimizer on one rank among CUDA ones (the ranks
///    would reduce through different engines); a CPU optimizer on every rank
///    reduces over the communicator's MPI side, NCCL moving nothing.
/// With --expect-missing-library the NCCL library is expected not to load:
/// FLASHOPT_ERROR_UNSUPPORTED on every rank, naming the library.
/// Failures are summed over the ranks, so every rank exits the same way.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt_nccl.h"
#include "flashopt/host/CudaDriver.h"
#include "flashopt/host/Float16.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace flashopt::host;

#include "DistTestSupport.h"

namespace {

const CudaDriver *cuda = nullptr;


const std::vector<int64_t> kSizes = {1, 31, 33, 100, 4097};


size_t bytesOf(flashopt_dtype d) { return d == FLASHOPT_F32 ? 4 : 2; }

/// Random values of dtype `d`, host bytes.
std::vector<uint8_t> randomBytes(flashopt_dtype d, int64_t n, uint64_t seed,
                                 float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint8_t> out(size_t(n) * bytesOf(d));
  for (int64_t i = 0; i < n; ++i) {
    float v = dist(rng);
    if (d == FLASHOPT_F32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      uint16_t h = d == FLASHOPT_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

/// Device memory of `bytes`.
struct DeviceBuffer {
  cu::CUdeviceptr ptr = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t b) : bytes(b) {
    if (cuda->cuMemAlloc(&ptr, b) != cu::CUDA_SUCCESS)
      ptr = 0;
  }
  ~DeviceBuffer() {
    if (ptr)
      cuda->cuMemFree(ptr);
  }
  void *get() const { return reinterpret_cast<void *>(uintptr_t(ptr)); }
  void upload(const std::vector<uint8_t> &h) {
    cuda->cuMemcpyHtoD(ptr, h.data(), h.size());
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> h(bytes);
    cuda->cuMemcpyDtoH(h.data(), ptr, bytes);
    return h;
  }
};

/// A CUDA optimizer over device parameters and gradients.
struct Opt {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  std::vector<std::unique_ptr<DeviceBuffer>> params, grads;
  flashopt_dtype pdt = FLASHOPT_F32, gdt = FLASHOPT_F32;

  Opt(const std::string &spec, uint64_t seed, int64_t sizeDelta = 0) {
    OK(flashopt_context_create(FLASHOPT_DEVICE_CUDA, 0, &ctx));
    OK(flashopt_optimizer_create(ctx, (kernels + "/" + spec).c_str(), &opt));
    flashopt_optimizer_info info{};
    OK(flashopt_optimizer_get_info(opt, &info));
    pdt = info.param_dtype;
    gdt = info.grad_dtype;
    OK(flashopt_set_hyper(opt, -1, "lr", 0.01));
    for (size_t i = 0; i < kSizes.size(); ++i) {
      int64_t n = kSizes[i] + (i == 2 ? sizeDelta : 0);
      params.push_back(
          std::make_unique<DeviceBuffer>(size_t(n) * bytesOf(pdt)));
      grads.push_back(std::make_unique<DeviceBuffer>(size_t(n) * bytesOf(gdt)));
      params.back()->upload(randomBytes(pdt, n, seed * 31 + i, 1.0f));
      int64_t idx = -1;
      std::string name = "w" + std::to_string(i);
      OK(flashopt_add_param(opt, 0, name.c_str(), params.back()->get(), pdt, n,
                            grads.back()->get(), gdt, &idx));
    }
  }
  ~Opt() {
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
  }
  /// Rank r's gradients of step k.
  void setGrads(int r, int k) {
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i]->upload(randomBytes(
          gdt, kSizes[i], 7919u * uint64_t(r + 1) + 104729u * uint64_t(k) + i,
          0.5f + 0.25f * float(r)));
  }
  uint64_t hashParams() {
    OK(flashopt_synchronize(opt));
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<uint8_t> b = params[i]->download();
      h = fnv(b.data(), b.size(), h);
      std::vector<float> m(size_t(kSizes[i]));
      OK(flashopt_export_master_f32(opt, int64_t(i), m.data(), kSizes[i]));
      h = fnv(m.data(), m.size() * 4, h);
    }
    return h;
  }
  uint64_t hashGrads() {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const auto &g : grads) {
      std::vector<uint8_t> b = g->download();
      h = fnv(b.data(), b.size(), h);
    }
    return h;
  }
};


uint64_t ncclBytes() {
  // The stand-in's counter; 0 (never checked) with the real library.
  const char *lib = std::getenv("FLASHOPT_NCCL_LIBRARY");
  void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  auto *fn =
      h ? reinterpret_cast<uint64_t (*)()>(dlsym(h, "flashopt_mock_nccl_bytes"))
        : nullptr;
  return fn ? fn() : 0;
}

bool standIn() {
  const char *lib = std::getenv("FLASHOPT_NCCL_LIBRARY");
  return lib && std::strstr(lib, "mock_nccl");
}

void ncclMatchesMpi(flashopt_comm nccl, flashopt_comm mpi,
                    const std::string &spec, flashopt_reduce_mode mode) {
  std::string what =
      spec + (mode == FLASHOPT_REDUCE_FAST ? " (fast)" : " (deterministic)");
  // Different initial values on every rank: attach copies rank 0's.
  Opt a(spec, 11 + uint64_t(rank)), b(spec, 11 + uint64_t(rank));
  OK(flashopt_optimizer_attach_comm(a.opt, nccl, mode, /*bucket_bytes=*/256));
  OK(flashopt_optimizer_attach_comm(b.opt, mpi, mode, 256));
  int32_t buckets = 0;
  OK(flashopt_num_buckets(a.opt, &buckets));
  EXPECT(buckets > 1, what + ": several buckets");
  EXPECT(sameEverywhere(a.hashParams()), what + ": rank 0's state everywhere");
  EXPECT(a.hashParams() == b.hashParams(), what + ": same start");
  for (int k = 1; k <= 3; ++k) {
    a.setGrads(rank, k);
    b.setGrads(rank, k);
    uint64_t before = ncclBytes();
    if (k == 2) { // one bucket as soon as its gradients are final
      OK(flashopt_reduce_bucket(a.opt, 1));
      OK(flashopt_reduce_bucket(b.opt, 1));
    }
    OK(flashopt_step(a.opt));
    OK(flashopt_step(b.opt));
    const std::string at = what + ", step " + std::to_string(k);
    if (standIn() && world > 1)
      EXPECT(ncclBytes() > before, at + ": the gradients went through NCCL");
    uint64_t ha = a.hashParams(), ga = a.hashGrads();
    EXPECT(sameEverywhere(ha), at + ": replicas bit-identical");
    EXPECT(sameEverywhere(ga), at + ": averaged gradients identical");
    if (mode == FLASHOPT_REDUCE_DETERMINISTIC) {
      EXPECT(ha == b.hashParams(), at + ": NCCL == MPI (parameters, masters)");
      EXPECT(ga == b.hashGrads(), at + ": NCCL == MPI (averaged gradients)");
    }
  }
}

/// Sharded (ZeRO-1) on CUDA contexts, over the NCCL communicator and over
/// the MPI one: bit-identical to replicated mode after every step
/// (deterministic reduction), the same everywhere, and each rank's memory
/// report holds only its shard of the correction terms and states.
void shardedMatchesReplicated(flashopt_comm nccl, flashopt_comm mpi,
                              const std::string &spec) {
  Opt rep(spec, 11 + uint64_t(rank)), shN(spec, 11 + uint64_t(rank)),
      shM(spec, 11 + uint64_t(rank));
  flashopt_memory_report full{}, mine{};
  OK(flashopt_memory_report_get(shN.opt, &full));
  OK(flashopt_optimizer_attach_comm(rep.opt, mpi,
                                    FLASHOPT_REDUCE_DETERMINISTIC, 256));
  OK(flashopt_optimizer_attach_comm_sharded(
      shN.opt, nccl, FLASHOPT_REDUCE_DETERMINISTIC, 256));
  OK(flashopt_optimizer_attach_comm_sharded(
      shM.opt, mpi, FLASHOPT_REDUCE_DETERMINISTIC, 256));
  OK(flashopt_memory_report_get(shN.opt, &mine));
  const std::string what = spec + " sharded on CUDA";
  int64_t held[2] = {mine.correction_bytes, mine.state_bytes}, sum[2] = {};
  MPI_Allreduce(held, sum, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT(sum[0] == full.correction_bytes && sum[1] == full.state_bytes,
         what + ": the shards add up to the whole");
  if (world > 1 && full.correction_bytes + full.state_bytes > 0)
    EXPECT(mine.correction_bytes + mine.state_bytes <
               full.correction_bytes + full.state_bytes,
           what + ": each rank holds less than the whole");
  EXPECT(mine.param_bytes == full.param_bytes, what + ": parameters whole");
  EXPECT(rep.hashParams() == shN.hashParams() &&
             rep.hashParams() == shM.hashParams(),
         what + ": rank 0's state everywhere");
  for (int k = 1; k <= 3; ++k) {
    rep.setGrads(rank, k);
    shN.setGrads(rank, k);
    shM.setGrads(rank, k);
    OK(flashopt_step(rep.opt));
    OK(flashopt_step(shN.opt));
    OK(flashopt_step(shM.opt));
    const std::string at = what + ", step " + std::to_string(k);
    uint64_t hr = rep.hashParams(), hn = shN.hashParams(),
             hm = shM.hashParams();
    EXPECT(sameEverywhere(hn), at + ": the same on every rank");
    EXPECT(hn == hr, at + ": over NCCL == replicated");
    EXPECT(hm == hr, at + ": over MPI == replicated");
  }
  // A collective save from the device shards is the replicated file, and a
  // sharded optimizer that loads it holds the same state.
  const std::string path = "/tmp/flashopt-nccl-sharded-" +
                           std::to_string(getppid()) + "-" + spec;
  OK(flashopt_save_checkpoint(shN.opt, (path + ".safetensors").c_str(),
                              FLASHOPT_CHECKPOINT_COMPRESSED));
  if (rank == 0)
    OK(flashopt_save_checkpoint(rep.opt, (path + "-rep.safetensors").c_str(),
                                FLASHOPT_CHECKPOINT_COMPRESSED));
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT(!fileBytes(path + ".safetensors").empty() &&
             fileBytes(path + ".safetensors") ==
                 fileBytes(path + "-rep.safetensors"),
         what + ": the checkpoint is the replicated file, byte for byte");
  Opt back(spec, 77 + uint64_t(rank));
  OK(flashopt_optimizer_attach_comm_sharded(
      back.opt, nccl, FLASHOPT_REDUCE_DETERMINISTIC, 256));
  OK(flashopt_load_checkpoint(back.opt, (path + ".safetensors").c_str()));
  EXPECT(back.hashParams() == rep.hashParams(),
         what + ": loaded into a sharded optimizer");
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::remove((path + ".safetensors").c_str());
    std::remove((path + "-rep.safetensors").c_str());
  }
}

/// A CPU optimizer over host parameters and gradients.
struct HostOpt {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  std::vector<std::vector<uint8_t>> params, grads;

  HostOpt(const std::string &spec, uint64_t seed) {
    OK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx));
    OK(flashopt_context_set_threads(ctx, 1));
    OK(flashopt_optimizer_create(ctx, (kernels + "/" + spec).c_str(), &opt));
    flashopt_optimizer_info info{};
    OK(flashopt_optimizer_get_info(opt, &info));
    OK(flashopt_set_hyper(opt, -1, "lr", 0.01));
    for (size_t i = 0; i < kSizes.size(); ++i) {
      params.push_back(
          randomBytes(info.param_dtype, kSizes[i], seed * 31 + i, 1.0f));
      grads.push_back(randomBytes(info.grad_dtype, kSizes[i],
                                  uint64_t(rank + 1) * 977 + i, 0.5f));
      std::string name = "w" + std::to_string(i);
      int64_t idx = -1;
      OK(flashopt_add_param(opt, 0, name.c_str(), params.back().data(),
                            info.param_dtype, kSizes[i], grads.back().data(),
                            info.grad_dtype, &idx));
    }
  }
  ~HostOpt() {
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
  }
  uint64_t hash() const {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const auto &p : params)
      h = fnv(p.data(), p.size(), h);
    for (const auto &g : grads)
      h = fnv(g.data(), g.size(), h);
    return h;
  }
  /// Opt::setGrads's gradients, in place.
  void setGrads(int r, int k) {
    flashopt_optimizer_info info{};
    OK(flashopt_optimizer_get_info(opt, &info));
    for (size_t i = 0; i < grads.size(); ++i) {
      std::vector<uint8_t> b = randomBytes(
          info.grad_dtype, kSizes[i],
          7919u * uint64_t(r + 1) + 104729u * uint64_t(k) + i,
          0.5f + 0.25f * float(r));
      std::memcpy(grads[i].data(), b.data(), b.size());
    }
  }
};

/// Gradient accumulation on CUDA contexts (the generated GPU accumulate /
/// step_fused / step_accumulated kernels): on its own, three micro-batches
/// then a step equal a CPU optimizer of the same bundle bit for bit
/// (parameters and masters); over NCCL and MPI (replicated) and sharded,
/// the same bits as each other and on every rank after every step.
void accumulateOnCuda(flashopt_comm nccl, flashopt_comm mpi) {
  const std::string spec =
      "../kernels-accumulate-gpu/adamw_m24_acc_bf16_i8_gpu";
  {
    Opt g(spec, 5);
    HostOpt c(spec, 5);
    for (int k = 1; k <= 2; ++k) {
      for (int mb = 0; mb < 3; ++mb) {
        g.setGrads(rank, 10 * k + mb);
        c.setGrads(rank, 10 * k + mb);
        if (mb < 2) {
          OK(flashopt_accumulate(g.opt));
          OK(flashopt_accumulate(c.opt));
        }
      }
      OK(flashopt_step(g.opt));
      OK(flashopt_step(c.opt));
      OK(flashopt_synchronize(g.opt));
      bool same = true;
      for (size_t i = 0; i < kSizes.size(); ++i) {
        same = same && g.params[i]->download() == c.params[i];
        std::vector<float> mg(size_t(kSizes[i])), mc(size_t(kSizes[i]));
        OK(flashopt_export_master_f32(g.opt, int64_t(i), mg.data(), kSizes[i]));
        OK(flashopt_export_master_f32(c.opt, int64_t(i), mc.data(), kSizes[i]));
        same = same && std::memcmp(mg.data(), mc.data(), mg.size() * 4) == 0;
      }
      EXPECT(same, "accumulation on CUDA == CPU, step " + std::to_string(k));
    }
    flashopt_memory_report r{};
    OK(flashopt_memory_report_get(g.opt, &r));
    EXPECT(r.accumulator_bytes > 0, "the memory report counts the "
                                    "accumulator on CUDA");
  }
  Opt rn(spec, 11 + uint64_t(rank)), rm(spec, 11 + uint64_t(rank)),
      sh(spec, 11 + uint64_t(rank));
  OK(flashopt_optimizer_attach_comm(rn.opt, nccl,
                                    FLASHOPT_REDUCE_DETERMINISTIC, 256));
  OK(flashopt_optimizer_attach_comm(rm.opt, mpi,
                                    FLASHOPT_REDUCE_DETERMINISTIC, 256));
  OK(flashopt_optimizer_attach_comm_sharded(
      sh.opt, nccl, FLASHOPT_REDUCE_DETERMINISTIC, 256));
  for (int k = 1; k <= 3; ++k) {
    for (int mb = 0; mb < 3; ++mb) {
      for (Opt *o : {&rn, &rm, &sh})
        o->setGrads(rank, 10 * k + mb);
      if (mb < 2)
        for (Opt *o : {&rn, &rm, &sh})
          OK(flashopt_accumulate(o->opt));
    }
    for (Opt *o : {&rn, &rm, &sh})
      OK(flashopt_step(o->opt));
    const std::string at = "accumulation on CUDA with data parallelism, step " +
                           std::to_string(k);
    uint64_t hn = rn.hashParams(), hm = rm.hashParams(), hs = sh.hashParams();
    EXPECT(sameEverywhere(hn), at + ": replicas bit-identical");
    EXPECT(hn == hm, at + ": NCCL == MPI");
    EXPECT(hs == hn, at + ": sharded == replicated");
  }
}

/// A CPU optimizer with the NCCL communicator reduces over MPI in host
/// memory (NCCL moves nothing), and one CPU rank among CUDA ranks is a
/// layout mismatch (different engines), not a hang. Needs the stand-in
/// driver, whose device memory a CPU optimizer could also address.
void hostOptimizers(flashopt_comm nccl) {
  if (!standIn() || world == 1)
    return;
  {
    HostOpt h("sgd_bf16", 3 + uint64_t(rank));
    OK(flashopt_optimizer_attach_comm(h.opt, nccl,
                                      FLASHOPT_REDUCE_DETERMINISTIC, 256));
    uint64_t before = ncclBytes();
    OK(flashopt_step(h.opt));
    EXPECT(ncclBytes() == before, "a CPU optimizer's gradients skip NCCL");
    EXPECT(sameEverywhere(h.hash()), "CPU optimizer over NCCL's MPI side: "
                                     "replicas bit-identical");
  }
  flashopt_status s;
  std::string err; // read before the optimizer's destroy clears it
  if (rank == 0) {
    Opt a("sgd_bf16", 5);
    s = flashopt_optimizer_attach_comm(a.opt, nccl,
                                       FLASHOPT_REDUCE_DETERMINISTIC, 0);
    err = flashopt_last_error();
  } else {
    HostOpt h("sgd_bf16", 5);
    s = flashopt_optimizer_attach_comm(h.opt, nccl,
                                       FLASHOPT_REDUCE_DETERMINISTIC, 0);
    err = flashopt_last_error();
  }
  EXPECT(s == FLASHOPT_ERROR_MISMATCH, "CUDA and CPU ranks refused");
  EXPECT(err.find("gradients reduced in") != std::string::npos,
         "the error names the engines");
}

void mismatchedLayout(flashopt_comm nccl) {
  // The last rank registers one tensor one element longer.
  Opt a("sgd_bf16", 5, rank == world - 1 && world > 1 ? 1 : 0);
  flashopt_status s = flashopt_optimizer_attach_comm(
      a.opt, nccl, FLASHOPT_REDUCE_DETERMINISTIC, 0);
  if (world == 1) {
    EXPECT(s == FLASHOPT_OK, "one rank: nothing to mismatch");
    return;
  }
  EXPECT(s == FLASHOPT_ERROR_MISMATCH, "mismatched layout refused");
  EXPECT(std::strstr(flashopt_last_error(), "different layouts") &&
             std::strstr(flashopt_last_error(), "w2"),
         "the error names the first difference");
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  bool expectMissing = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--expect-missing-library") == 0)
      expectMissing = true;
    else
      kernels = argv[i];
  }
  if (expectMissing) {
    flashopt_comm c = nullptr;
    flashopt_status s = flashopt_comm_create_nccl(MPI_COMM_WORLD, 0, &c);
    EXPECT(s == FLASHOPT_ERROR_UNSUPPORTED, "a missing libnccl is UNSUPPORTED");
    EXPECT(std::strstr(flashopt_last_error(), "could not be loaded"),
           "the error names the library");
  } else {
    Expected<const CudaDriver *> d = CudaDriver::get();
    EXPECT(bool(d), d ? "" : d.error());
    if (d) {
      cuda = *d;
      cu::CUdevice dev = 0;
      cu::CUcontext ctx = nullptr;
      cuda->cuDeviceGet(&dev, 0);
      cuda->cuDevicePrimaryCtxRetain(&ctx, dev);
      cuda->cuCtxPushCurrent(ctx);
      flashopt_comm nccl = nullptr, mpi = nullptr;
      OK(flashopt_comm_create_nccl(MPI_COMM_WORLD, 0, &nccl));
      OK(flashopt_comm_create_mpi(MPI_COMM_WORLD, &mpi));
      if (nccl && mpi) {
        for (const char *spec : {"sgd_bf16", "adamw_bf16_m24", "sgd_f32"})
          ncclMatchesMpi(nccl, mpi, spec, FLASHOPT_REDUCE_DETERMINISTIC);
        ncclMatchesMpi(nccl, mpi, "adamw_bf16_m24", FLASHOPT_REDUCE_FAST);
        for (const char *spec : {"adamw_bf16_m24", "lion_bf16_m24", "sgd_f32"})
          shardedMatchesReplicated(nccl, mpi, spec);
        accumulateOnCuda(nccl, mpi);
        mismatchedLayout(nccl);
        hostOptimizers(nccl);
      }
      flashopt_comm_destroy(nccl);
      flashopt_comm_destroy(mpi);
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("NcclTests at %d ranks: %d checks, %d failed\n", world, checks,
                total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
