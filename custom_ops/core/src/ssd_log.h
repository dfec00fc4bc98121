// One shard's SSD tier: an append-only log of records (kRecordHeader bytes: key, score, CRC-32 of the rest
// of the record; then the row's stride floats).  Which record holds which key is the shard's KeyIndex;
// eviction appends, promotion reads, compaction rewrites (eviction.cc).  Every read that hands a row on
// (promotion, peek, compaction, save) goes through checked(): a flipped bit, a foreign record or a cut
// file is an error naming the file, the offset and the id, never a wrong row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace heterps {

// The checksum a record carries at byte 12: CRC-32C of its key, score and row (every byte but its own 4).
uint32_t record_crc(const char* rec, size_t rb);

struct SsdLog {
  int fd = -1;
  std::string file;
  uint64_t records_written = 0;  // records in the file, live or dead

  // Create (or truncate) the log at `path`; throws TableError naming it.
  void create(const std::string& path);
  // Close the file and remove it (the table is going away).
  void remove();
  // Record `recno` (rb bytes) after checking that the file holds it, that it is `key`'s and that its
  // checksum matches: a pointer valid until the next remap or scratch use, or nullptr with `fault` set
  // ("SSD tier file 'F', record at byte O for id K: why").  `known_size` caches the file's size for the
  // caller's call (one fstat per call and shard, not per row): reading a mapped page past the end of a
  // file that something truncated would be a SIGBUS, not an error.
  const char* checked(uint64_t recno, size_t rb, int64_t key, uint64_t* known_size, std::string* fault);
  // Append `buf` (whole records) after the last record; false with `err` on a failed write.
  bool append(const std::vector<char>& buf, size_t rb, std::string* err);
  void unmap();
  // Replace the file with `fd2` (already holding `records` records, renamed over `file`).
  void replace(int fd2, uint64_t records);
  // Forget every record (clear()).
  void reset();

 private:
  bool remap(uint64_t need);
  const char* record(uint64_t recno, size_t rb);
  // Reads go through a read-only shared mapping (no syscall per promoted row); the mapping reserves more
  // than the file holds and is only ever read below records_written, which is inside the file.
  char* map_ = nullptr;
  size_t map_len_ = 0;
  std::vector<char> scratch_;
};

}  // namespace heterps
