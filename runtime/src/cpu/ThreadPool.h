//===- ThreadPool.h - The CPU backend's persistent threads ------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CPU_THREADPOOL_H
#define FLASHOPT_CPU_THREADPOOL_H

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flashopt::host {

/// A persistent pool: `run(n, fn)` calls fn(0..n-1) once each on the workers
/// and the calling thread, and returns when all calls are done.
class ThreadPool {
public:
  /// Starts `workers` threads; throws std::system_error when one cannot be
  /// started (the system is out of threads or memory), after stopping and
  /// joining the ones that did start: a joinable std::thread destroyed
  /// while the exception unwinds would std::terminate the process
  /// ("terminate called without an active exception").
  explicit ThreadPool(int workers) {
    try {
      for (int i = 0; i < workers; ++i)
        threads_.emplace_back([this] { loop(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  ~ThreadPool() { stop(); }
  int workers() const { return int(threads_.size()); }

  void run(int64_t jobs, const std::function<void(int64_t)> &fn) {
    if (threads_.empty() || jobs <= 1) {
      for (int64_t i = 0; i < jobs; ++i)
        fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      jobs_ = jobs;
      next_.store(0, std::memory_order_relaxed);
      busy_ = int(threads_.size());
      ++generation_;
    }
    wake_.notify_all();
    work(fn, jobs);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return busy_ == 0; });
    job_ = nullptr;
  }

private:
  /// Stops and joins every started thread.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread &t : threads_)
      t.join();
    threads_.clear();
  }
  void work(const std::function<void(int64_t)> &fn, int64_t jobs) {
    for (;;) {
      int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= jobs)
        return;
      fn(i);
    }
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)> *fn;
      int64_t jobs;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_)
          return;
        seen = generation_;
        fn = job_;
        jobs = jobs_;
      }
      work(*fn, jobs);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--busy_ == 0)
          done_.notify_one();
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  const std::function<void(int64_t)> *job_ = nullptr;
  int64_t jobs_ = 0;
  std::atomic<int64_t> next_{0};
  int busy_ = 0;
};

/// std::thread::hardware_concurrency(), at least 1 and at most 1024.
int default_threads();

} // namespace flashopt::host

#endif // FLASHOPT_CPU_THREADPOOL_H
