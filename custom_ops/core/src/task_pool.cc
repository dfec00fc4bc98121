#include "task_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <exception>

namespace heterps {

unsigned usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

// One run: its tasks are claimed from `next` by the caller and by every worker holding a ticket; a worker
// whose ticket comes after the run's tasks are all claimed finds none and never touches fn (the job itself
// is kept alive by the ticket's shared_ptr).
struct TaskPool::Job {
  const std::function<void(size_t)>* fn = nullptr;
  size_t n = 0;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::condition_variable finished;
  size_t done = 0;           // tasks returned (under mu)
  std::exception_ptr error;  // the first exception (under mu)

  void work() {
    size_t ran = 0;
    std::exception_ptr err;
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      try {
        (*fn)(i);
      } catch (...) {
        if (!err) err = std::current_exception();
      }
      ++ran;
    }
    if (ran == 0) return;
    std::lock_guard<std::mutex> lock(mu);
    done += ran;
    if (err && !error) error = err;
    if (done == n) finished.notify_all();
  }
};

TaskPool::TaskPool(unsigned threads) : threads_(std::max(1u, threads)) {}

TaskPool::~TaskPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void TaskPool::work_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || !tickets_.empty(); });
    if (tickets_.empty()) return;  // stop_, nothing left to help with
    std::shared_ptr<Job> job = std::move(tickets_.front());
    tickets_.pop_front();
    lock.unlock();
    job->work();
    lock.lock();
  }
}

void TaskPool::run(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  const size_t helpers = std::min<size_t>(threads_ - 1, n - 1);
  if (helpers == 0) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (workers_.empty()) {
      workers_.reserve(threads_ - 1);
      for (unsigned w = 0; w + 1 < threads_; ++w) workers_.emplace_back([this] { work_loop(); });
    }
    for (size_t h = 0; h < helpers; ++h) tickets_.push_back(job);
  }
  if (helpers == 1)
    wake_.notify_one();
  else
    wake_.notify_all();
  job->work();
  std::unique_lock<std::mutex> lock(job->mu);
  job->finished.wait(lock, [&] { return job->done == n; });
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace heterps
