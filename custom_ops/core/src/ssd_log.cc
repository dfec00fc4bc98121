#include "ssd_log.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "heterps/table.h"
#include "io.h"

namespace heterps {

void SsdLog::create(const std::string& path) {
  file = path;
  fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw TableError("cannot create SSD tier file '" + file + "': " + std::strerror(errno));
}

void SsdLog::remove() {
  unmap();
  if (fd >= 0) {
    ::close(fd);
    ::unlink(file.c_str());
    fd = -1;
  }
}

void SsdLog::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_len_);
  map_ = nullptr;
  map_len_ = 0;
}

bool SsdLog::remap(uint64_t need) {
  unmap();
  size_t len = static_cast<size_t>(std::max<uint64_t>(need * 2, uint64_t(64) << 20));
  len = (len + 4095) & ~size_t(4095);
  void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  map_ = static_cast<char*>(p);
  map_len_ = len;
  return true;
}

const char* SsdLog::record(uint64_t recno, size_t rb) {
  uint64_t off = recno * rb;
  if (off + rb <= map_len_ || remap(off + rb)) return map_ + off;
  scratch_.resize(rb);  // mmap refused (address space limits): fall back to pread
  std::string err;
  if (!io::pread_full(fd, scratch_.data(), rb, off, &err))
    throw TableError("reading SSD tier '" + file + "' failed: " + err);
  return scratch_.data();
}

bool SsdLog::append(const std::vector<char>& buf, size_t rb, std::string* err) {
  if (io::pwrite_full(fd, buf.data(), buf.size(), records_written * rb, err)) return true;
  if (::ftruncate(fd, off_t(records_written * rb)) != 0) { /* best effort: the records stay unreferenced */
  }
  return false;
}

void SsdLog::replace(int fd2, uint64_t records) {
  unmap();
  ::close(fd);
  fd = fd2;
  records_written = records;
}

void SsdLog::reset() {
  records_written = 0;
  if (fd >= 0 && ::ftruncate(fd, 0) != 0) { /* the log is rewritten from offset 0 anyway */
  }
}

}  // namespace heterps
