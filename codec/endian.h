// Little- and big-endian loads and stores on unaligned bytes. The frame header is
// little-endian; msgpack is big-endian.
#ifndef SLUICE_CODEC_ENDIAN_H_
#define SLUICE_CODEC_ENDIAN_H_

#include <cstdint>
#include <cstring>
#include <string>

namespace sluice {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "Sluice assumes a little-endian host");

inline uint16_t LoadLE16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadLE32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void StoreLE32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void StoreLE64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

inline uint16_t LoadBE16(const uint8_t* p) { return __builtin_bswap16(LoadLE16(p)); }
inline uint32_t LoadBE32(const uint8_t* p) { return __builtin_bswap32(LoadLE32(p)); }
inline uint64_t LoadBE64(const uint8_t* p) { return __builtin_bswap64(LoadLE64(p)); }
inline void StoreBE16(uint8_t* p, uint16_t v) {
  v = __builtin_bswap16(v);
  std::memcpy(p, &v, 2);
}
inline void StoreBE32(uint8_t* p, uint32_t v) { StoreLE32(p, __builtin_bswap32(v)); }
inline void StoreBE64(uint8_t* p, uint64_t v) { StoreLE64(p, __builtin_bswap64(v)); }

/// Appends v little-endian (records the server writes to its files).
inline void AppendLE32(std::string* s, uint32_t v) { s->append(reinterpret_cast<char*>(&v), 4); }
inline void AppendLE64(std::string* s, uint64_t v) { s->append(reinterpret_cast<char*>(&v), 8); }

}  // namespace sluice

#endif  // SLUICE_CODEC_ENDIAN_H_
