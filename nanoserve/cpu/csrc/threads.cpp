// Pin each OpenMP thread of the calling thread's team to one CPU, as vLLM's CPU worker does.
//
// Why here and not in Python: os.sched_setaffinity reaches only the thread that calls it. The
// OpenMP workers that run every at::parallel_for of a forward (ours and ATen's: one runtime, the
// libgomp torch ships) are a team that belongs to the thread that started it, and the only way
// into each of them is a parallel region. So one region with one thread per CPU in the list,
// each thread binding itself: thread t to cpus[t]; thread 0 is the caller. libgomp keeps the
// team for that caller while its size stays the same, so the binding holds for later forwards.
#include <omp.h>
#include <sched.h>

#include <ATen/Parallel.h>

#include "ops.h"

namespace nanoserve {

std::vector<int64_t> bind_threads(const std::vector<int64_t>& cpus) {
  TORCH_CHECK(!cpus.empty(), "bind_threads: no CPUs given");
  const int n = static_cast<int>(cpus.size());
  at::set_num_threads(n);  // the team every later parallel_for of this caller uses
  std::vector<int64_t> got(n, -1);
  std::vector<int> err(n, 0);
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(cpus[t]), &set);
    err[t] = sched_setaffinity(0, sizeof(set), &set);  // 0: this thread
    got[t] = sched_getcpu();
  }
  for (int t = 0; t < n; ++t)
    TORCH_CHECK(err[t] == 0, "bind_threads: sched_setaffinity to CPU ", cpus[t], " failed");
  return got;  // where each thread ran right after binding: its own CPU
}

}  // namespace nanoserve
