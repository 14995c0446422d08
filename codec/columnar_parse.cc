// The COLUMNAR encoder's parse loops (columnar_column.h): one tight loop per field and type,
// over a block of records at a time, each record's cursor advanced past its field.
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "codec/columnar_column.h"
#include "codec/varint.h"

namespace sluice::columnar_internal {
namespace {

// True when [p, p+len) equals [q, q+len).
inline bool SameBytes(const uint8_t* p, const uint8_t* q, size_t len) {
  if (ABSL_PREDICT_TRUE(len >= 4 && len <= 16)) {  // the four windows of KeyShort
    const size_t last = len - 4;
    const size_t o1 = last < 4 ? last : 4;
    const size_t o2 = last < 8 ? last : 8;
    return ((LoadLE32(p) ^ LoadLE32(q)) | (LoadLE32(p + o1) ^ LoadLE32(q + o1)) |
            (LoadLE32(p + o2) ^ LoadLE32(q + o2)) | (LoadLE32(p + last) ^ LoadLE32(q + last))) == 0;
  }
  if (len < 4) {
    const ShortKey x = KeyShort(p, static_cast<uint32_t>(len));
    const ShortKey y = KeyShort(q, static_cast<uint32_t>(len));
    return x.a == y.a && x.b == y.b;
  }
  return std::memcmp(p, q, len) == 0;
}

// A field prefix's words, copied into a parse loop's locals (the prefix's members would be
// reloaded after every store the loop makes), and the comparisons the loops make with them:
// 8 to 16 bytes as two overlapping 64-bit loads from either end, 4 to 7 as two 32-bit loads,
// fewer through KeyShort, more with memcmp.
struct PrefixCheck {
  explicit PrefixCheck(const Prefix& pr)
      : len(pr.len),
        data(pr.data()),
        key(pr.key),
        head64(pr.head64),
        tail64(pr.tail64),
        head32(pr.head32),
        tail32(pr.tail32),
        is8to16(len >= 8 && len <= 16),
        is4to7(len >= 4 && len < 8) {}

  // Whether q does not start with the prefix, known to be 8 to 16 bytes long (kLong) or 4 to 7:
  // no branch on the length. The hints are on each comparison, where the loops had them: on
  // the result of an inlined call they lead the compiler to lay the loops out differently.
  template <bool kLong>
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool DiffersAt(const uint8_t* q) const {
    if constexpr (kLong) {
      return ABSL_PREDICT_FALSE(LoadLE64(q) != head64) ||
             ABSL_PREDICT_FALSE(LoadLE64(q + len - 8) != tail64);
    } else {
      return ABSL_PREDICT_FALSE(LoadLE32(q) != head32) ||
             ABSL_PREDICT_FALSE(LoadLE32(q + len - 4) != tail32);
    }
  }

  // The same for a prefix of under 4 or over 16 bytes.
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool DiffersAtOther(const uint8_t* q) const {
    if (len < 4) {
      const ShortKey k = KeyShort(q, static_cast<uint32_t>(len));
      return ABSL_PREDICT_FALSE(k.a != key.a) || ABSL_PREDICT_FALSE(k.b != key.b);
    }
    return std::memcmp(q, data, len) != 0;
  }

  size_t len;
  const uint8_t* data;
  ShortKey key;
  uint64_t head64, tail64;
  uint32_t head32, tail32;
  bool is8to16, is4to7;
};

// Whether `key` is exactly the `size` bytes at `value` (a field's encoded value): the check a
// key reference makes for each record.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool KeyIs(std::string_view key, const uint8_t* value,
                                               size_t size) {
  return size == key.size() &&
         SameBytes(value, reinterpret_cast<const uint8_t*>(key.data()), key.size());
}

// The same for a fixstr value with header byte h and len (<= 16) bytes whose KeyShort words are
// k: the key must be the header, then the same bytes. (One result set in one branch: written
// with an early return, it made GCC spill the str loop's cursor array instead.)
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool KeyIsShortStr(std::string_view key, uint8_t h,
                                                       const ShortKey& k, uint32_t len) {
  bool same = false;
  if (key.size() == len + 1 && static_cast<uint8_t>(key[0]) == h) {
    const ShortKey kk = KeyShort(reinterpret_cast<const uint8_t*>(key.data()) + 1, len);
    same = kk.a == k.a && kk.b == k.b;
  }
  return same;
}

// Parses one field (prefix `pr`, then a value of type T) for records [begin, n), advancing
// each record's cursor. Returns n, or the index of the first record that does not fit
// (*failure says how). One function per type, not inlined into the dispatch: each loop keeps
// its own registers and alignment, so changing one type's loop does not move another's.
template <ColumnType T>
ABSL_ATTRIBUTE_NOINLINE size_t ParseColumn(BuildColumn& col, const Prefix& pr,
                                           const uint8_t** __restrict cur,
                                           const uint8_t* const* __restrict ends, size_t begin,
                                           size_t n, ColumnChecks* checks, ParseFailure* failure) {
  const PrefixCheck prefix(pr);
  const size_t plen = prefix.len;
  const bool last_field = checks->last_field;
  const Record* const key_records = checks->key_records;
  bool key_ref_holds = checks->key_ref_holds && key_records != nullptr;
  size_t i = begin;
  for (; i < n; ++i) {
    const uint8_t* q = cur[i];
    const uint8_t* const end = ends[i];
    const auto avail = static_cast<size_t>(end - q);
    if (ABSL_PREDICT_FALSE(avail < plen)) break;
    // The same branch for every record, so these predict perfectly.
    if (prefix.is8to16) {
      if (prefix.DiffersAt<true>(q)) break;
    } else if (prefix.is4to7) {
      if (prefix.DiffersAt<false>(q)) break;
    } else if (prefix.DiffersAtOther(q)) {
      break;
    }
    const uint8_t* p = col.ParseAs<T>(i, q + plen, end);
    if (ABSL_PREDICT_FALSE(p == nullptr)) goto value_failed;
    if (last_field && ABSL_PREDICT_FALSE(p != end)) {
      checks->key_ref_holds = key_ref_holds;
      *failure = ParseFailure::kTrailing;
      return i;
    }
    if (key_ref_holds) {
      const uint8_t* value = q + plen;
      key_ref_holds = KeyIs(key_records[i].key, value, static_cast<size_t>(p - value));
    }
    cur[i] = p;
  }
  checks->key_ref_holds = key_ref_holds;
  *failure = i == n ? ParseFailure::kNone : ParseFailure::kPrefix;
  return i;
value_failed:
  checks->key_ref_holds = key_ref_holds;
  *failure = ParseFailure::kValue;
  return i;
}

// The common case of a str column in a loop of its own: a field prefix of 4 to 16 bytes
// (kLongPrefix: 8 to 16) and a value of up to 255 bytes (fixstr or str8). Runs from record i while
// records take that path, and returns the first that does not, untouched, for ParseColumn to take;
// or returns after the record whose value turned the dictionary off (kDict), so the caller goes on
// without it. Which checks apply is fixed per instantiation, so the loop tests no flags.
template <bool kLongPrefix, bool kDict>
struct StrLoop {
  template <bool kKeyRef, bool kLastField>
  ABSL_ATTRIBUTE_NOINLINE static size_t Run(BuildColumn& col, const Prefix& pr,
                                            const uint8_t** __restrict cur,
                                            const uint8_t* const* __restrict ends, size_t i,
                                            size_t n, const Record* key_records,
                                            bool* key_ref_holds) {
    const PrefixCheck prefix(pr);
    const size_t plen = prefix.len;
    bool holds = *key_ref_holds;
    BuildColumn::Hot hot = col.LoadHot();
    while (i < n) {
      const uint8_t* q = cur[i];
      const auto avail = static_cast<size_t>(ends[i] - q);
      if (ABSL_PREDICT_FALSE(avail <= plen)) break;
      if (prefix.DiffersAt<kLongPrefix>(q)) break;
      // A fixstr, or a str8 (32 to 255 bytes).
      const uint8_t h = q[plen];
      uint32_t len;
      size_t header;
      if (ABSL_PREDICT_TRUE((h & 0xe0) == 0xa0)) {
        len = h & 0x1f;
        header = 1;
      } else if (h == 0xd9 && avail > plen + 1 && q[plen + 1] >= 32) {
        len = q[plen + 1];
        header = 2;
      } else {
        break;
      }
      const size_t used = plen + header + len;
      if (ABSL_PREDICT_FALSE(used > avail)) break;
      if (kLastField && ABSL_PREDICT_FALSE(used != avail)) break;
      const uint8_t* v = q + plen + header;
      hot.ptrs[i] = v;
      hot.lens[i] = len;
      hot.total_len += len;
      cur[i] = v + len;
      if (kDict && ABSL_PREDICT_TRUE(len <= 16)) {
        const ShortKey k = KeyShort(v, len);
        if (kKeyRef && holds) holds = KeyIsShortStr(key_records[i].key, h, k, len);
        if (ABSL_PREDICT_FALSE(
                !col.dict.LookupHot(hot.dict, i++, k, len, hot.ptrs, hot.total_len))) {
          break;
        }
        continue;
      }
      if (kKeyRef && holds) holds = KeyIs(key_records[i].key, v - header, header + len);
      if constexpr (kDict) {
        if (!col.dict.LookupLongHot(hot.dict, i++, v, len, hot.ptrs, hot.total_len)) break;
      } else {
        ++i;
      }
    }
    col.total_len = hot.total_len;
    *key_ref_holds = holds;
    return i;
  }
};

// Runs Loop::Run<kKeyRef, kLastField> (StrLoop or ScalarLoop) with the checks that
// apply to this field fixed at compile time.
template <typename Loop>
size_t RunFastLoop(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                   const uint8_t* const* ends, size_t i, size_t n, ColumnChecks* checks) {
  if (checks->key_records != nullptr) {
    return checks->last_field
               ? Loop::template Run<true, true>(col, pr, cur, ends, i, n, checks->key_records,
                                                &checks->key_ref_holds)
               : Loop::template Run<true, false>(col, pr, cur, ends, i, n, checks->key_records,
                                                 &checks->key_ref_holds);
  }
  bool unused = false;
  return checks->last_field
             ? Loop::template Run<false, true>(col, pr, cur, ends, i, n, nullptr, &unused)
             : Loop::template Run<false, false>(col, pr, cur, ends, i, n, nullptr, &unused);
}

// A str column: the fast loop while records take its path, ParseColumn for each one that does
// not (a value over 255 bytes, a prefix outside 4..16 bytes, or a record that does not fit).
size_t ParseStrColumn(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                      const uint8_t* const* ends, size_t begin, size_t n, ColumnChecks* checks,
                      ParseFailure* failure) {
  if (pr.len < 4 || pr.len > 16) {
    return ParseColumn<ColumnType::kStr>(col, pr, cur, ends, begin, n, checks, failure);
  }
  // A key reference that no longer holds needs no more checking.
  if (!checks->key_ref_holds) checks->key_records = nullptr;
  size_t i = begin;
  const bool long_prefix = pr.len >= 8;
  for (;;) {
    const bool dict = col.dict.active;
    const size_t from = i;
    if (dict) {
      i = long_prefix ? RunFastLoop<StrLoop<true, true>>(col, pr, cur, ends, i, n, checks)
                      : RunFastLoop<StrLoop<false, true>>(col, pr, cur, ends, i, n, checks);
    } else {
      i = long_prefix ? RunFastLoop<StrLoop<true, false>>(col, pr, cur, ends, i, n, checks)
                      : RunFastLoop<StrLoop<false, false>>(col, pr, cur, ends, i, n, checks);
    }
    if (i == n) {
      *failure = ParseFailure::kNone;
      return n;
    }
    if (!checks->key_ref_holds) checks->key_records = nullptr;
    if (dict && !col.dict.active) continue;  // record i-1 turned the dictionary off: go on
    // Record i does not take the fast path: the general loop takes it, or says why it fails.
    // When the fast loop took nothing, the general loop takes the rest of the block: a column
    // of values over 255 bytes would otherwise switch loops at every record.
    const size_t until = i == from ? n : i + 1;
    const size_t r = ParseColumn<ColumnType::kStr>(col, pr, cur, ends, i, until, checks, failure);
    if (*failure != ParseFailure::kNone) return r;
    if (until == n || ++i == n) return n;
  }
}

// The common case of an int, float64 or bool column in a loop of its own, as StrLoop: a
// field prefix of 4 to 16 bytes, the checks that apply fixed per instantiation, and the column's
// arrays in locals (a float's bytes are copied with memcpy, which may alias anything). Returns
// the first record that does not take the path, untouched.
template <ColumnType T, bool kLongPrefix>
struct ScalarLoop {
  template <bool kKeyRef, bool kLastField>
  ABSL_ATTRIBUTE_NOINLINE static size_t Run(BuildColumn& col, const Prefix& pr,
                                            const uint8_t** __restrict cur,
                                            const uint8_t* const* __restrict ends, size_t i,
                                            size_t n, const Record* key_records,
                                            bool* key_ref_holds) {
    const PrefixCheck prefix(pr);
    const size_t plen = prefix.len;
    bool holds = *key_ref_holds;
    int64_t* const ints = col.ints.data();
    uint8_t* const fixed = col.fixed.data();
    for (; i < n; ++i) {
      const uint8_t* q = cur[i];
      const uint8_t* const end = ends[i];
      const auto avail = static_cast<size_t>(end - q);
      if (ABSL_PREDICT_FALSE(avail <= plen)) break;
      if (prefix.DiffersAt<kLongPrefix>(q)) break;
      const uint8_t* const v = q + plen;
      const uint8_t* p;
      if constexpr (T == ColumnType::kInt) {
        int64_t x;
        p = mp::ReadCanonicalIntFast(v, end, &x);
        if (ABSL_PREDICT_FALSE(p == nullptr)) break;
        if (kLastField && ABSL_PREDICT_FALSE(p != end)) break;
        ints[i] = x;
      } else if constexpr (T == ColumnType::kFloat64) {
        if (ABSL_PREDICT_FALSE(avail - plen < 9 || *v != 0xcb)) break;
        p = v + 9;
        if (kLastField && ABSL_PREDICT_FALSE(p != end)) break;
        std::memcpy(fixed + i * 8, v + 1, 8);
      } else {
        static_assert(T == ColumnType::kBool);
        if (ABSL_PREDICT_FALSE((*v & 0xfe) != 0xc2)) break;
        p = v + 1;
        if (kLastField && ABSL_PREDICT_FALSE(p != end)) break;
        fixed[i] = *v & 1;
      }
      if (kKeyRef && holds) holds = KeyIs(key_records[i].key, v, static_cast<size_t>(p - v));
      cur[i] = p;
    }
    *key_ref_holds = holds;
    return i;
  }
};

// An int, float64 or bool column: the fast loop while records take its path, ParseColumn for
// each one that does not (and to say why it does not fit).
template <ColumnType T>
size_t ParseScalarColumn(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                         const uint8_t* const* ends, size_t begin, size_t n, ColumnChecks* checks,
                         ParseFailure* failure) {
  if (pr.len < 4 || pr.len > 16) {
    return ParseColumn<T>(col, pr, cur, ends, begin, n, checks, failure);
  }
  if (!checks->key_ref_holds) checks->key_records = nullptr;
  size_t i = begin;
  for (;;) {
    const size_t from = i;
    i = pr.len >= 8 ? RunFastLoop<ScalarLoop<T, true>>(col, pr, cur, ends, i, n, checks)
                    : RunFastLoop<ScalarLoop<T, false>>(col, pr, cur, ends, i, n, checks);
    if (i == n) {
      *failure = ParseFailure::kNone;
      return n;
    }
    if (!checks->key_ref_holds) checks->key_records = nullptr;
    // As for str columns: the general loop takes the rest when the fast one took nothing.
    const size_t until = i == from ? n : i + 1;
    const size_t r = ParseColumn<T>(col, pr, cur, ends, i, until, checks, failure);
    if (*failure != ParseFailure::kNone) return r;
    if (until == n || ++i == n) return n;
  }
}

}  // namespace

size_t ParseColumnOfType(BuildColumn& col, const Prefix& pr, const uint8_t** cur,
                         const uint8_t* const* ends, size_t begin, size_t n, ColumnChecks* checks,
                         ParseFailure* failure) {
  switch (col.type) {
    case ColumnType::kInt:
      return ParseScalarColumn<ColumnType::kInt>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kFloat64:
      return ParseScalarColumn<ColumnType::kFloat64>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kFloat32:
      return ParseColumn<ColumnType::kFloat32>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kBool:
      return ParseScalarColumn<ColumnType::kBool>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kNil:
      return ParseColumn<ColumnType::kNil>(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kStr:
      return ParseStrColumn(col, pr, cur, ends, begin, n, checks, failure);
    case ColumnType::kBin:
      return ParseColumn<ColumnType::kBin>(col, pr, cur, ends, begin, n, checks, failure);
    default:
      *failure = ParseFailure::kValue;
      return begin;
  }
}

}  // namespace sluice::columnar_internal
