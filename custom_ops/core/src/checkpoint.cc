// Checkpoints of the whole table (resident and spilled rows): save() and load().
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "heterps/table.h"
#include "io.h"
#include "shard_ops.h"

namespace heterps {

// ---- checkpoints --------------------------------------------------------------------------------------
//
// File layout (little-endian): 64-byte header, row_count records of (key, score, pad, stride floats),
// 16-byte footer ("HPSTEND1", CRC-32 of every byte before the footer, 4 zero bytes).  The size is
// checked against row_count before anything else, so truncation is reported as such.

namespace {

constexpr char kMagic[8] = {'H', 'E', 'T', 'E', 'R', 'P', 'S', 'T'};
constexpr char kFooterMagic[8] = {'H', 'P', 'S', 'T', 'E', 'N', 'D', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kFooterBytes = 16;

struct Header {
  char magic[8];
  uint32_t version, dim, stride, optimizer;
  uint64_t seed, row_count;
  uint32_t record_bytes, eviction;
  char reserved[16];
};
static_assert(sizeof(Header) == kHeaderBytes, "header layout");

class CheckpointWriter {
 public:
  CheckpointWriter(int fd, std::string name) : fd_(fd), name_(std::move(name)) { buf_.reserve(1 << 20); }
  void write(const void* p, size_t n) {
    crc_ = crc32_update(crc_, p, n);
    const char* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
    if (buf_.size() >= (1 << 20)) flush();
  }
  void write_raw(const void* p, size_t n) {  // footer: not part of the checksum
    const char* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  void flush() {
    std::string err;
    if (!buf_.empty() && !io::pwrite_full(fd_, buf_.data(), buf_.size(), off_, &err))
      throw TableError("writing '" + name_ + "' failed: " + err);
    off_ += buf_.size();
    buf_.clear();
  }
  uint32_t crc() const { return crc_; }

 private:
  int fd_;
  std::string name_;
  std::vector<char> buf_;
  uint64_t off_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace

void SparseTable::save(const std::string& path) {
  // Hold every shard lock for a consistent snapshot (pushes wait; a checkpoint is a rare event).
  std::vector<std::unique_lock<std::mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  // A checkpoint written now would silently lack (or hold reset) rows lost to bad SSD records.
  uint64_t lost = 0;
  const std::string* first_lost = nullptr;
  for (auto& sh : shards_) {
    if (!sh->lost.empty() && first_lost == nullptr) first_lost = &sh->lost.front().second;
    lost += sh->lost.size();
  }
  if (lost > 0)
    throw TableError("saving table to '" + path + "' refused: " + std::to_string(lost) +
                     " row(s) were lost to unreadable SSD records (first: " + *first_lost +
                     "); call forget_lost() to accept the loss and save the other rows");
  uint64_t rows = 0;
  for (auto& sh : shards_) rows += sh->count + sh->ssd_index.size();
  const size_t st = config_.stride();
  const size_t rb = kRecordHeader + st * 4;

  io::remove_stale_temps(io::parent_dir(path), kMagic);  // of saves killed before their rename
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw TableError("saving table: cannot create '" + tmp + "': " + std::strerror(errno));
  try {
    CheckpointWriter w(fd, tmp);
    Header h{};
    std::memcpy(h.magic, kMagic, 8);
    h.version = kFormatVersion;
    h.dim = config_.dim;
    h.stride = config_.stride();
    h.optimizer = static_cast<uint32_t>(config_.optimizer);
    h.seed = config_.seed;
    h.row_count = rows;
    h.record_bytes = static_cast<uint32_t>(rb);
    h.eviction = static_cast<uint32_t>(config_.eviction);
    w.write(&h, sizeof h);
    std::vector<char> rec(rb, 0);
    uint64_t bad = 0;
    std::string first_bad;
    for (auto& shp : shards_) {
      Shard& sh = *shp;
      for (const Entry& e : sh.entries) {
        if (e.key == kEmptyKey) continue;
        std::memset(rec.data(), 0, kRecordHeader);
        std::memcpy(rec.data(), &e.key, 8);
        std::memcpy(rec.data() + 8, &e.score, 4);
        std::memcpy(rec.data() + kRecordHeader, sh.row(e.slot), st * 4);
        w.write(rec.data(), rb);
      }
      // Spilled rows are checked record by record: bad ones fail the save (the previous checkpoint at
      // `path` stays) and are listed as lost, never copied into a file whose checksum would then vouch for
      // them.  The scan goes on past a bad record so that one failed save lists them all (a cut log holds
      // thousands): forget_lost() then lets the next save write the rest.
      ShardOps ops{config_, sh, capacity_per_shard_};
      for (uint64_t i = 0; i < sh.ssd_index.capacity();) {
        const int64_t key = sh.ssd_index.key_at(i);
        if (key == kEmptyKey) {
          ++i;
          continue;
        }
        const char* src;
        try {
          src = ops.spilled(key, int64_t(i));
        } catch (const TableError& e) {
          if (bad++ == 0) first_bad = e.what();
          continue;  // dropping it shifted the next entry of its probe run into slot i: look at i again
        }
        ++i;
        if (bad > 0) continue;  // this file is going to be discarded: stop writing it
        std::memcpy(rec.data(), src, rb);
        std::memset(rec.data() + 12, 0, 4);
        w.write(rec.data(), rb);
      }
    }
    if (bad > 0)
      throw TableError("saving table to '" + path + "' failed: " + std::to_string(bad) +
                       " spilled row(s) could not be verified (first: " + first_bad +
                       "); the previous checkpoint is untouched");
    uint32_t crc = w.crc();
    char footer[kFooterBytes] = {0};
    std::memcpy(footer, kFooterMagic, 8);
    std::memcpy(footer + 8, &crc, 4);
    w.write_raw(footer, sizeof footer);
    w.flush();
    if (::fsync(fd) != 0) throw TableError("saving table: fsync of '" + tmp + "' failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());  // the previous checkpoint at `path`, if any, is untouched
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw TableError("saving table: closing '" + tmp + "' failed: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw TableError("saving table: renaming '" + tmp + "' to '" + path + "' failed: " + std::strerror(e));
  }
  io::fsync_parent_dir(path);
}

void SparseTable::load(const std::string& path) {
  io::remove_stale_temps(io::parent_dir(path), kMagic);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw TableError("loading table: cannot open '" + path + "': " + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat stt;
  if (::fstat(fd, &stt) != 0) throw TableError("loading table: cannot stat '" + path + "'");
  const uint64_t size = static_cast<uint64_t>(stt.st_size);
  std::string err;
  Header h{};
  if (size < kHeaderBytes + kFooterBytes || !io::pread_full(fd, &h, sizeof h, 0, &err))
    throw TableError("loading table: '" + path + "' is truncated (" + std::to_string(size) + " bytes)");
  if (std::memcmp(h.magic, kMagic, 8) != 0)
    throw TableError("loading table: '" + path + "' is not a heterps sparse table checkpoint");
  if (h.version != kFormatVersion)
    throw TableError("loading table: '" + path + "' has format version " + std::to_string(h.version) +
                     ", this build reads version " + std::to_string(kFormatVersion));
  const size_t st = config_.stride();
  const size_t rb = kRecordHeader + st * 4;
  if (h.dim != config_.dim || h.stride != st || h.optimizer != static_cast<uint32_t>(config_.optimizer) ||
      h.record_bytes != rb) {
    throw TableError("loading table: '" + path + "' holds dim " + std::to_string(h.dim) + " optimizer #" +
                     std::to_string(h.optimizer) + ", the table has dim " + std::to_string(config_.dim) +
                     " optimizer #" + std::to_string(static_cast<uint32_t>(config_.optimizer)));
  }
  const uint64_t expected = kHeaderBytes + h.row_count * rb + kFooterBytes;
  if (h.row_count > (size / rb) + 1 || size != expected) {
    throw TableError("loading table: '" + path + "' is truncated or corrupted (size " + std::to_string(size) +
                     " bytes, header promises " + std::to_string(expected) + ")");
  }
  // Pass 1: verify the checksum before touching the table, so a bad file never replaces good rows.
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  for (uint64_t off = 0; off < size - kFooterBytes;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - kFooterBytes - off));
    if (!io::pread_full(fd, buf.data(), n, off, &err))
      throw TableError("loading table: reading '" + path + "': " + err);
    crc = crc32_update(crc, buf.data(), n);
    off += n;
  }
  char footer[kFooterBytes];
  if (!io::pread_full(fd, footer, kFooterBytes, size - kFooterBytes, &err))
    throw TableError("loading table: reading '" + path + "': " + err);
  uint32_t stored_crc;
  std::memcpy(&stored_crc, footer + 8, 4);
  if (std::memcmp(footer, kFooterMagic, 8) != 0 || stored_crc != crc)
    throw TableError("loading table: '" + path + "' is corrupted (checksum mismatch)");
  // Pass 2: replace the contents.
  clear();
  std::vector<char> rec(rb);
  for (uint64_t r = 0; r < h.row_count; ++r) {
    if (!io::pread_full(fd, rec.data(), rb, kHeaderBytes + r * rb, &err))
      throw TableError("loading table: reading '" + path + "': " + err);
    int64_t key;
    uint32_t score;
    std::memcpy(&key, rec.data(), 8);
    std::memcpy(&score, rec.data() + 8, 4);
    if (key == kEmptyKey) throw TableError("loading table: '" + path + "' holds the reserved id INT64_MIN");
    Shard& sh = *shards_[shard_of(key)];
    std::lock_guard<std::mutex> lock(sh.mu);
    ShardOps ops{config_, sh, capacity_per_shard_};
    ops.put(key, score, reinterpret_cast<const float*>(rec.data() + kRecordHeader));
  }
  // The LRU clock continues past the loaded scores so new touches rank as newer.
  uint32_t max_score = 0;
  for (auto& sh : shards_) {
    std::lock_guard<std::mutex> lock(sh->mu);
    for (const Entry& e : sh->entries)
      if (e.key != kEmptyKey) max_score = std::max(max_score, e.score);
  }
  uint64_t c = __atomic_load_n(&clock_, __ATOMIC_RELAXED);
  if (c < max_score) __atomic_store_n(&clock_, uint64_t(max_score), __ATOMIC_RELAXED);
}

}  // namespace heterps
