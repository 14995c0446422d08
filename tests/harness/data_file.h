// A shuffle's data file as a test that damages it on purpose sees it (docs/storage.md, "Block"):
// its blocks in file order, holes punched out stepped over.
#ifndef SLUICE_TESTS_HARNESS_DATA_FILE_H_
#define SLUICE_TESTS_HARNESS_DATA_FILE_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace sluice::testing {

/// Each whole block of the data file at `path`: (its offset, its frame's size).
inline std::vector<std::pair<uint64_t, uint32_t>> DataFileBlocks(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  f.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  std::vector<std::pair<uint64_t, uint32_t>> out;
  for (uint64_t at = 0; at + 32 <= size;) {  // a 32-byte header ("SLBK", ..., u32 frame size)
    char h[32];
    f.seekg(static_cast<std::streamoff>(at));
    f.read(h, 32);
    const uint32_t frame = static_cast<uint8_t>(h[20]) | static_cast<uint8_t>(h[21]) << 8 |
                           static_cast<uint8_t>(h[22]) << 16 |
                           static_cast<uint32_t>(static_cast<uint8_t>(h[23])) << 24;
    if (std::string(h, 4) != "SLBK" || frame == 0) {  // a hole: the next page
      at += 4096 - at % 4096;
      continue;
    }
    out.emplace_back(at, frame);
    at += 32 + uint64_t{frame};
  }
  return out;
}

/// Overwrites the byte at `offset` of the file at `path` with `byte`.
inline void PutByte(const std::string& path, uint64_t offset, char byte) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(byte);
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_DATA_FILE_H_
