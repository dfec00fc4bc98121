#include "io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <ctime>
#include <utility>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "heterps/table.h"

namespace heterps {
namespace io {

namespace {
std::atomic<int64_t> g_fail_after{0};  // 0 = off; k > 0: the k-th write from now fails

bool injected_failure() {
  int64_t v = g_fail_after.load(std::memory_order_relaxed);
  while (v > 0) {
    if (g_fail_after.compare_exchange_weak(v, v - 1)) return v == 1 ? (g_fail_after.store(-1), true) : false;
  }
  return v < 0;  // once triggered, every later write fails too (a full disk stays full)
}
}  // namespace

void inject_write_failure_after(int64_t n) {
  g_fail_after.store(n < 0 ? 0 : n);
}

bool pwrite_full(int fd, const void* buf, size_t len, uint64_t offset, std::string* err) {
  if (injected_failure()) {
    *err = std::strerror(ENOSPC);
    return false;
  }
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t w = ::pwrite(fd, p, len, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      *err = std::strerror(errno);
      return false;
    }
    if (w == 0) {
      *err = "short write";
      return false;
    }
    p += w;
    len -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return true;
}

bool pread_full(int fd, void* buf, size_t len, uint64_t offset, std::string* err) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t r = ::pread(fd, p, len, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      *err = std::strerror(errno);
      return false;
    }
    if (r == 0) {
      *err = "unexpected end of file";
      return false;
    }
    p += r;
    len -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

namespace {
constexpr const char* kDirPrefix = "heterps-table-";
constexpr int kReclaimMinAgeS = 5;

void reclaim_orphans(const std::string& base) {
  DIR* d = ::opendir(base.c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d))
    if (std::strncmp(e->d_name, kDirPrefix, std::strlen(kDirPrefix)) == 0) names.emplace_back(e->d_name);
  ::closedir(d);
  for (const std::string& name : names) {
    std::string dir = base + "/" + name;
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (::time(nullptr) - st.st_mtime < kReclaimMinAgeS) continue;
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // nobody holds it: its table's process is gone
      uint64_t bytes = remove_dir_files(dir);
      std::fprintf(stderr,
                   "heterps sparse table: reclaimed '%s', the spill directory of a table whose process is gone "
                   "(%llu bytes)\n",
                   dir.c_str(), static_cast<unsigned long long>(bytes));
    }
    ::close(fd);
  }
}
}  // namespace

uint64_t remove_dir_files(const std::string& dir) {
  uint64_t bytes = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> files;
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) files.emplace_back(e->d_name);
    ::closedir(d);
    for (const std::string& f : files) {
      std::string p = dir + "/" + f;
      struct stat st;
      if (::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::unlink(p.c_str()) == 0)
        bytes += static_cast<uint64_t>(st.st_size);
    }
  }
  ::rmdir(dir.c_str());
  return bytes;
}

void remove_stale_temps(const std::string& dir, const char* magic) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::pair<std::string, long>> stale;
  while (dirent* e = ::readdir(d)) {
    const char* dot = std::strstr(e->d_name, ".tmp.");
    if (dot == nullptr) continue;
    while (const char* next = std::strstr(dot + 1, ".tmp.")) dot = next;
    const char* digits = dot + 5;
    char* end = nullptr;
    long pid = std::strtol(digits, &end, 10);
    if (*digits == '\0' || *end != '\0' || pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to ask)
    stale.emplace_back(e->d_name, pid);
  }
  ::closedir(d);
  for (const auto& [name, pid] : stale) {
    std::string p = dir + "/" + name;
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    char head[8] = {0};
    ssize_t n = ::pread(fd, head, sizeof head, 0);
    ::close(fd);
    if (n == 0 || (n == 8 && std::memcmp(head, magic, 8) == 0)) {
      if (::unlink(p.c_str()) == 0)
        std::fprintf(stderr, "heterps sparse table: removed '%s', a checkpoint left half-written by process %ld\n",
                     p.c_str(), pid);
    }
  }
}

std::string make_private_dir(const std::string& base, int* lock_fd) {
  std::string path;
  for (size_t i = 0; i <= base.size(); ++i) {
    if (i == base.size() || (base[i] == '/' && i > 0)) {
      path = base.substr(0, i);
      if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
        throw TableError("cannot create ssd_dir '" + path + "': " + std::strerror(errno));
    }
  }
  reclaim_orphans(base);
  std::string tmpl = base + "/" + kDirPrefix + "XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    throw TableError("cannot create a directory in ssd_dir '" + base + "': " + std::strerror(errno));
  std::string dir(buf.data());
  *lock_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (*lock_fd < 0 || ::flock(*lock_fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    if (*lock_fd >= 0) ::close(*lock_fd);
    ::rmdir(dir.c_str());
    throw TableError("cannot lock the spill directory '" + dir + "': " + std::strerror(e));
  }
  return dir;
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

void fsync_parent_dir(const std::string& path) {
  std::string dir = parent_dir(path);
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);  // makes the rename durable; failure here does not undo it
    ::close(fd);
  }
}

}  // namespace io
}  // namespace heterps
