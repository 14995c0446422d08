// A stored frame's key bounds (docs/storage.md, "Key bounds"): its least and greatest key,
// between them a few of its keys at even steps through its records, and its heaviest key (the
// one with the most records, and their count and bytes), taken when the push
// validates the frame, written with its block in the commit log (version 7) and kept in the
// partition's index. A KEY fetch of a key range reads only the frames whose least and greatest
// keys meet it; split keys are planned from all of them (server/rules/split_plan.h) without
// reading a frame; a partition's hot keys are summed from its frames' heaviest keys.
//
// Each key is cut to at most kMaxBoundKey bytes: a cut key is still at most the key it stands
// for, and a cut greatest key is marked, standing then for every key that starts with it. The
// encoding (self-delimiting, one per block, back to back in a commit record):
//
//   u8 n (2 to 2 + kMaxBoundSamples), then n keys in order, each a u8 length (bit 7 on the last
//   one: cut) and its bytes; the first is the least key, the last the greatest; then the
//   heaviest key: a u8 length (bit 7: cut) and its bytes, u32 its records, u32 their bytes
//   (keys and values; little-endian)
//
// An empty encoding means "not known" (a frame of an older log, or a large one copied by a
// repair): such a frame may hold any key.
#ifndef SLUICE_CODEC_KEY_BOUNDS_H_
#define SLUICE_CODEC_KEY_BOUNDS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "codec/frame_decoder.h"

namespace sluice {

inline constexpr size_t kMaxBoundKey = 32;
/// Keys kept between the least and the greatest: one per kBoundSampleBytes of the frame's
/// records (its uncompressed payload), at most kMaxBoundSamples.
inline constexpr size_t kMaxBoundSamples = 31;
inline constexpr size_t kBoundSampleBytes = 8u << 10;

/// The least and greatest key of a frame, as stored.
struct KeyBounds {
  std::string_view lo, hi;
  bool hi_cut = false;  ///< hi stands for every key starting with it
  bool known = false;   ///< false: any key
};

/// A frame's key with the most records (the first of equals), with their count and bytes.
struct HeavyKey {
  std::string_view key;
  bool cut = false;  ///< (read back) the key was longer than kMaxBoundKey: these are its first
  uint32_t records = 0;
  uint32_t bytes = 0;
};

/// Appends the encoding of `keys` (increasing; at least 2: the least, samples, the greatest)
/// and `heavy` to *out, cutting the keys as above.
void AppendKeyBounds(const std::vector<std::string_view>& keys, const HeavyKey& heavy,
                     std::string* out);
/// Appends the bounds of a decoded frame to *out (nothing for an empty frame: any key).
/// `scratch` is reused between calls.
void AppendFrameBounds(const DecodedFrame& frame, std::string* out,
                       std::vector<std::string_view>* scratch);
/// Appends the bounds of records in key order (a merge's output frame, whose payload takes
/// `uncompressed` bytes), as AppendFrameBounds would take them from that frame decoded.
void AppendSortedBounds(absl::Span<const Record> records, uint64_t uncompressed, std::string* out,
                        std::vector<std::string_view>* keys);
/// The size of the one encoding at the start of `bytes`, or 0 if it is not a valid one.
size_t KeyBoundsSize(std::string_view bytes);
/// The least and greatest keys of a valid encoding (KeyBoundsSize); empty: not known.
KeyBounds ReadKeyBounds(std::string_view encoded);
/// Every key of a valid encoding, in order (the heaviest key not among them); none when empty.
void ReadBoundKeys(std::string_view encoded, std::vector<std::string_view>* keys);
/// The heaviest key of a valid encoding (records 0 when empty).
HeavyKey ReadHeavyKey(std::string_view encoded);
/// Whether every key of a frame with bounds `next` is at or past every key of one with bounds
/// `prev` (both known): read one after the other, they are one run in key order.
bool FollowsInKeyOrder(std::string_view prev, std::string_view next);
/// Whether a frame with these bounds may hold a key in [from, to) (no `to`: no end).
bool MayHoldKeyIn(std::string_view encoded, std::string_view from,
                  const std::optional<std::string>& to);

}  // namespace sluice

#endif  // SLUICE_CODEC_KEY_BOUNDS_H_
