#include "codec/msgpack_scan.h"

namespace sluice::mp {

const char* ScanErrorName(ScanError e) {
  switch (e) {
    case ScanError::kOk:
      return "ok";
    case ScanError::kTruncated:
      return "truncated msgpack object";
    case ScanError::kReservedByte:
      return "reserved msgpack byte 0xc1";
  }
  return "unknown";
}

const uint8_t* SkipObject(const uint8_t* p, const uint8_t* end, ScanError* err) {
  // `pending` counts objects still to skip. Each needs at least one byte, so bounding it by
  // the bytes left both rejects impossible counts early and keeps it far from overflow.
  uint64_t pending = 1;
  while (pending > 0) {
    if (pending > static_cast<uint64_t>(end - p)) {
      *err = ScanError::kTruncated;
      return nullptr;
    }
    const uint8_t b = *p++;
    --pending;
    if (b <= 0x7f || b >= 0xe0) continue;  // fixint
    if (b <= 0x8f) {                       // fixmap
      pending += uint64_t{2} * (b & 0x0f);
      continue;
    }
    if (b <= 0x9f) {  // fixarray
      pending += b & 0x0f;
      continue;
    }
    const size_t avail = static_cast<size_t>(end - p);
    uint64_t skip = UINT64_MAX;  // bytes after the header byte; MAX = a length was cut off
    if (b <= 0xbf) {             // fixstr
      skip = b & 0x1f;
    } else {
      switch (b) {
        case 0xc0:
        case 0xc2:
        case 0xc3:
          continue;
        case 0xc1:
          *err = ScanError::kReservedByte;
          return nullptr;
        case 0xc4:  // bin8
        case 0xd9:  // str8
          if (avail < 1) break;
          skip = 1u + p[0];
          break;
        case 0xc5:
        case 0xda:
          if (avail < 2) break;
          skip = 2u + LoadBE16(p);
          break;
        case 0xc6:
        case 0xdb:
          if (avail < 4) break;
          skip = 4ull + LoadBE32(p);
          break;
        case 0xc7:  // ext8: len, type, data
          if (avail < 1) break;
          skip = 2u + p[0];
          break;
        case 0xc8:
          if (avail < 2) break;
          skip = 3u + LoadBE16(p);
          break;
        case 0xc9:
          if (avail < 4) break;
          skip = 5ull + LoadBE32(p);
          break;
        case 0xca:
          skip = 4;
          break;
        case 0xcb:
          skip = 8;
          break;
        case 0xcc:
        case 0xd0:
          skip = 1;
          break;
        case 0xcd:
        case 0xd1:
          skip = 2;
          break;
        case 0xce:
        case 0xd2:
          skip = 4;
          break;
        case 0xcf:
        case 0xd3:
          skip = 8;
          break;
        case 0xd4:  // fixext 1..16: type byte + data
          skip = 2;
          break;
        case 0xd5:
          skip = 3;
          break;
        case 0xd6:
          skip = 5;
          break;
        case 0xd7:
          skip = 9;
          break;
        case 0xd8:
          skip = 17;
          break;
        case 0xdc:  // array16
          if (avail < 2) break;
          skip = 2;
          pending += LoadBE16(p);
          break;
        case 0xdd:
          if (avail < 4) break;
          skip = 4;
          pending += LoadBE32(p);
          break;
        case 0xde:  // map16
          if (avail < 2) break;
          skip = 2;
          pending += 2ull * LoadBE16(p);
          break;
        case 0xdf:
          if (avail < 4) break;
          skip = 4;
          pending += 2ull * LoadBE32(p);
          break;
        default:
          break;
      }
    }
    if (skip > avail) {
      *err = ScanError::kTruncated;
      return nullptr;
    }
    p += skip;
  }
  *err = ScanError::kOk;
  return p;
}

}  // namespace sluice::mp
