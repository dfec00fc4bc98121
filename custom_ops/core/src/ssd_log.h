// One shard's SSD tier: an append-only log of records (kRecordHeader bytes: key, score, pad; then the
// row's stride floats).  Which record holds which key is the shard's KeyIndex; eviction appends, promotion
// reads, compaction rewrites (eviction.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace heterps {

struct SsdLog {
  int fd = -1;
  std::string file;
  uint64_t records_written = 0;  // records in the file, live or dead

  // Create (or truncate) the log at `path`; throws TableError naming it.
  void create(const std::string& path);
  // Close the file and remove it (the table is going away).
  void remove();
  // Record `recno` (rb bytes): a pointer valid until the next remap or scratch use.
  const char* record(uint64_t recno, size_t rb);
  // Append `buf` (whole records) after the last record; false with `err` on a failed write.
  bool append(const std::vector<char>& buf, size_t rb, std::string* err);
  void unmap();
  // Replace the file with `fd2` (already holding `records` records, renamed over `file`).
  void replace(int fd2, uint64_t records);
  // Forget every record (clear()).
  void reset();

 private:
  bool remap(uint64_t need);
  // Reads go through a read-only shared mapping (no syscall per promoted row); the mapping reserves more
  // than the file holds and is only ever read below records_written, which is inside the file.
  char* map_ = nullptr;
  size_t map_len_ = 0;
  std::vector<char> scratch_;
};

}  // namespace heterps
