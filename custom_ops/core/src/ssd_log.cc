#include "ssd_log.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "heterps/table.h"
#include "io.h"
#include "layout.h"

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

namespace {

// CRC-32C (Castagnoli), not the checkpoints' zlib CRC-32: x86-64 computes it in hardware (SSE 4.2, 8 bytes an
// instruction), and every spilled row is checksummed once when written and once per read.  With zlib's
// CRC-32 (slicing-by-8, ~4 instructions a byte) the checksums were 11% of the instructions of an SSD-heavy
// pull/push run (dim 16, three quarters of the rows on SSD).
uint32_t crc32c_soft(uint32_t crc, const uint8_t* p, size_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  while (n--) crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_hw(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
const bool kHaveHwCrc = __builtin_cpu_supports("sse4.2");
#endif

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (kHaveHwCrc) return crc32c_hw(crc, p, n);
#endif
  return crc32c_soft(crc, p, n);
}

}  // namespace

uint32_t record_crc(const char* rec, size_t rb) {
  uint32_t crc = crc32c(0xFFFFFFFFu, rec, 12);
  return ~crc32c(crc, rec + kRecordHeader, rb - kRecordHeader);
}

const char* SsdLog::checked(uint64_t recno, size_t rb, int64_t key, uint64_t* known_size, std::string* fault) {
  const uint64_t off = recno * rb;
  auto fail = [&](const std::string& why) -> const char* {
    *fault = "SSD tier file '" + file + "', record at byte " + std::to_string(off) + " for id " + std::to_string(key) +
             ": " + why;
    return nullptr;
  };
  if (off + rb > *known_size) {
    struct stat st;
    if (::fstat(fd, &st) != 0) return fail(std::string("cannot stat the file: ") + std::strerror(errno));
    *known_size = static_cast<uint64_t>(st.st_size);
    if (off + rb > *known_size) return fail("the file ends at byte " + std::to_string(*known_size) + " (truncated)");
  }
  const char* rec;
  try {
    rec = record(recno, rb);
  } catch (const TableError& e) {
    return fail(e.what());
  }
  int64_t stored;
  std::memcpy(&stored, rec, 8);
  uint32_t crc;
  std::memcpy(&crc, rec + 12, 4);
  if (crc != record_crc(rec, rb)) return fail("checksum mismatch (the record is corrupted)");
  if (stored != key) return fail("the record holds id " + std::to_string(stored));
  return rec;
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
