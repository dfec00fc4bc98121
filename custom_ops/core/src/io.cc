#include "io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

std::string make_private_dir(const std::string& base) {
  std::string path;
  for (size_t i = 0; i <= base.size(); ++i) {
    if (i == base.size() || (base[i] == '/' && i > 0)) {
      path = base.substr(0, i);
      if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
        throw TableError("cannot create ssd_dir '" + path + "': " + std::strerror(errno));
    }
  }
  std::string tmpl = base + "/heterps-table-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    throw TableError("cannot create a directory in ssd_dir '" + base + "': " + std::strerror(errno));
  return std::string(buf.data());
}

void fsync_parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);  // makes the rename durable; failure here does not undo it
    ::close(fd);
  }
}

}  // namespace io
}  // namespace heterps
