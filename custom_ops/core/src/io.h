// Small POSIX I/O helpers with one fault-injection point, so failed writes (full disk) can be tested
// without a tiny filesystem or root.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace heterps {
namespace io {

bool pwrite_full(int fd, const void* buf, size_t len, uint64_t offset, std::string* err);
bool pread_full(int fd, void* buf, size_t len, uint64_t offset, std::string* err);
// mkdir -p base, then a fresh private directory inside it.
std::string make_private_dir(const std::string& base);
void fsync_parent_dir(const std::string& path);
void inject_write_failure_after(int64_t n);

}  // namespace io
}  // namespace heterps
