// How every C entry point turns C++ exceptions into an error code plus a message the caller can fetch
// (the core's heterps_last_error and the CUDA table's heterps_gpu_last_error each keep their own message).
#pragma once

#include <exception>
#include <string>

namespace heterps {

// Runs f; returns 0, or -1 with the exception's message stored in `error` (exceptions never cross the C ABI).
template <class F>
int guarded(std::string& error, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "unknown error";
  }
  return -1;
}

}  // namespace heterps
