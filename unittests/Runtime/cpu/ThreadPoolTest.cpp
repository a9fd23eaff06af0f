//===- ThreadPoolTest.cpp - The CPU backend's persistent threads ----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// runtime/src/cpu/ThreadPool.h: every job runs once; a pool whose threads
/// cannot all be started throws std::system_error (which set_threads turns
/// into a status) instead of terminating or hanging the process — the cause
/// of a SIGABRT "terminate called without an active exception" seen in a
/// loaded FSDP2 test run (issue 40): a rank whose CPU optimizer could not
/// start all its threads.
///
//===----------------------------------------------------------------------===//

#include "cpu/ThreadPool.h"

#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <system_error>
#include <vector>

#include <csignal>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

using flashopt::host::ThreadPool;

TEST_CASE("a thread pool runs every job once, on each run") {
  ThreadPool pool(3);
  CHECK(pool.workers() == 3);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::atomic<int>> hits(257);
    pool.run(257, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
    for (auto &h : hits)
      REQUIRE(h.load() == 1);
  }
}

TEST_CASE("a thread pool that cannot start its threads throws, and the "
          "process survives") {
  // In a child process whose address space leaves room for a few thread
  // stacks only (RLIMIT_AS binds root too), a pool of 64 threads fails
  // part way: the threads already started must be joined before the
  // std::system_error leaves the constructor, or the process aborts.
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    std::ifstream statm("/proc/self/statm");
    statm >> pages;
    rlim_t used = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE));
    rlimit lim{used + (48u << 20), used + (48u << 20)};
    if (setrlimit(RLIMIT_AS, &lim) != 0)
      _exit(3);
    try {
      ThreadPool pool(64); // 64 stacks of 8 MiB do not fit in 48 MiB
      _exit(2);
    } catch (const std::system_error &) {
      _exit(0);
    } catch (...) {
      _exit(4);
    }
  }
  // Before the fix the child either aborted (a joinable std::thread
  // destroyed) or hung (the condition variable destroyed under its waiting
  // workers): wait 60 s at most.
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 600 && done == 0; ++i) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0)
      usleep(100000);
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL("the child hung: the pool's started threads were not stopped");
  }
  REQUIRE(done == pid);
  INFO("child status " << status);
  REQUIRE_FALSE(WIFSIGNALED(status)); // SIGABRT: joinable threads destroyed
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
