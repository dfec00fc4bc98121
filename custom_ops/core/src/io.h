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
// A table's own directory under an ssd_dir: created fresh (mkdir -p base, then heterps-table-XXXXXX),
// flock()ed through `lock_fd` for the table's lifetime.  The lock is what tells a live owner from a dead
// one (the kernel drops it when the process dies, kill -9 included): before creating its own, the call
// reclaims every other heterps-table-* directory whose lock it can take, i.e. whose owner is gone, and
// says so on stderr.  Directories younger than a few seconds are left alone (an owner may be between
// creating and locking its directory).
std::string make_private_dir(const std::string& base, int* lock_fd);
// Remove `dir`'s regular files, then the directory (best effort).  Returns the bytes the files held.
uint64_t remove_dir_files(const std::string& dir);
// Stale temporary checkpoints in `dir`: "<name>.tmp.<pid>" files whose process no longer exists and
// that are empty or start with `magic` (8 bytes; so a user's file of that name is never touched).
void remove_stale_temps(const std::string& dir, const char* magic);
std::string parent_dir(const std::string& path);  // "." for a bare name
void fsync_parent_dir(const std::string& path);
void inject_write_failure_after(int64_t n);

}  // namespace io
}  // namespace heterps
