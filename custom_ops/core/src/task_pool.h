// A small pool of threads for the host tier's batch calls (SparseTable::take_rows / put_rows, table.cc):
// run(n, fn) calls fn(0), ..., fn(n - 1), each exactly once, on the calling thread and on up to threads - 1
// workers, and returns when every call has returned.  The caller always takes tasks too, so a run finishes
// even when every worker is busy with another caller's run (several threads may call run at once, and no
// run waits for another), and the workers hold no lock of the caller's while they wait.  Workers start on
// the first run that can use them and end with the pool.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace heterps {

// The CPUs this process may run on (sched_getaffinity: a container's cpuset or taskset narrows it), >= 1.
unsigned usable_cpus();

class TaskPool {
 public:
  explicit TaskPool(unsigned threads);  // threads >= 1 (1: every task on the caller's thread)
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  unsigned threads() const { return threads_; }
  // fn(i) for every i in [0, n).  An exception thrown by fn is rethrown here once every task has run (the
  // first one caught; the other tasks still run).
  void run(size_t n, const std::function<void(size_t)>& fn);

 private:
  struct Job;
  void work_loop();

  const unsigned threads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> tickets_;  // one per worker asked to help with a job
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

}  // namespace heterps
