#include "codec/bench_datasets.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <msgpack.hpp>

namespace sluice::bench {
namespace {

// splitmix64: tiny, fast and identical everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return Next() % n; }
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  double Normal() {  // Box-Muller
    const double u1 = Uniform() + 1e-300, u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Zipf-like skew: index in [0, n) with small indices much more likely.
  uint64_t Skewed(uint64_t n) {
    const double u = Uniform();
    return static_cast<uint64_t>(std::pow(u, 3.0) * static_cast<double>(n)) % n;
  }

 private:
  uint64_t s_;
};

// A vocabulary of pronounceable words (names, cities...), 4-10 letters.
std::vector<std::string> Vocabulary(Rng& rng, size_t n, bool capitalise) {
  static const char* kSyllables[] = {"ka",  "lo",  "mi",  "ra", "ten", "sa", "vo",  "ne",  "li",
                                     "an",  "dor", "mar", "el", "is",  "ta", "ru",  "gen", "fa",
                                     "bel", "co",  "die", "ho", "pe",  "zu", "win", "ster"};
  std::vector<std::string> words;
  words.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string w;
    const size_t parts = 2 + rng.Below(3);
    for (size_t k = 0; k < parts; ++k) w += kSyllables[rng.Below(std::size(kSyllables))];
    if (capitalise) w[0] = static_cast<char>(w[0] - 'a' + 'A');
    words.push_back(std::move(w));
  }
  return words;
}

double Round2(double x) { return std::round(x * 100.0) / 100.0; }

using Packer = msgpack::packer<msgpack::sbuffer>;

// Always a float64 (0xcb), as Python and msgspec write floats. (msgpack-cxx's pack_double
// writes whole-number doubles as integers.)
void PackF64(msgpack::sbuffer& b, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  char out[9];
  out[0] = static_cast<char>(0xcb);
  for (int i = 0; i < 8; ++i) out[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
  b.write(out, 9);
}

void PackKeyStr(Packer& pk, const char* k) { pk.pack(std::string_view(k)); }

template <typename T>
std::string PackOne(const T& v) {
  msgpack::sbuffer b;
  msgpack::pack(b, v);
  return std::string(b.data(), b.size());
}

Dataset Ints3(uint64_t seed) {
  Rng rng(seed);
  Dataset d{
      "ints3", "3 int columns: id (sequential), user_id (uniform < 1e6), count (skewed)", {}, {}};
  const size_t n = 10000;
  const int64_t base = 1'700'000'000 + static_cast<int64_t>(rng.Below(1'000'000));
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = base + static_cast<int64_t>(i);
    const auto user = static_cast<int64_t>(rng.Below(1'000'000));
    const auto count = static_cast<int64_t>(std::floor(-std::log(rng.Uniform() + 1e-12) * 20));
    msgpack::sbuffer b;
    Packer pk(&b);
    pk.pack_map(3);
    PackKeyStr(pk, "id");
    pk.pack(id);
    PackKeyStr(pk, "user_id");
    pk.pack(user);
    PackKeyStr(pk, "count");
    pk.pack(count);
    d.keys.push_back(PackOne(user));
    d.values.emplace_back(b.data(), b.size());
  }
  return d;
}

Dataset IntFloatStr(uint64_t seed) {
  Rng rng(seed);
  Dataset d{"int_float_str",
            "id (sequential), score (float, 2 decimals), name (2,000-word vocab)",
            {},
            {}};
  const auto names = Vocabulary(rng, 2000, true);
  const size_t n = 10000;
  for (size_t i = 0; i < n; ++i) {
    const auto& name = names[rng.Skewed(names.size())];
    const double score = Round2(50.0 + 15.0 * rng.Normal());
    msgpack::sbuffer b;
    Packer pk(&b);
    pk.pack_map(3);
    PackKeyStr(pk, "id");
    pk.pack(static_cast<int64_t>(i));
    PackKeyStr(pk, "score");
    PackF64(b, score);
    PackKeyStr(pk, "name");
    pk.pack(name);
    d.keys.push_back(PackOne(name));
    d.values.emplace_back(b.data(), b.size());
  }
  return d;
}

Dataset Wide10(uint64_t seed) {
  Rng rng(seed);
  Dataset d{"wide10",
            "10 mixed columns: ints, timestamps, floats, a bool, vocab and random-hex strings",
            {},
            {}};
  static const char* kCountries[] = {"US", "DE", "FR", "GB", "IN", "BR", "JP", "CN", "PL", "ES",
                                     "IT", "NL", "SE", "CA", "AU", "MX", "KR", "TR", "AR", "ZA"};
  static const char* kDevices[] = {"android", "ios", "web", "desktop", "tv"};
  const auto users = Vocabulary(rng, 1000, false);
  const size_t n = 5000;
  int64_t ts = 1'730'000'000'000 + static_cast<int64_t>(rng.Below(1'000'000));
  for (size_t i = 0; i < n; ++i) {
    ts += static_cast<int64_t>(rng.Below(2000));
    const auto& user = users[rng.Skewed(users.size())];
    char session[17];
    std::snprintf(session, sizeof(session), "%016llx", static_cast<unsigned long long>(rng.Next()));
    msgpack::sbuffer b;
    Packer pk(&b);
    pk.pack_map(10);
    PackKeyStr(pk, "event_id");
    pk.pack(static_cast<int64_t>(i) * 7 + 3);
    PackKeyStr(pk, "ts_ms");
    pk.pack(ts);
    PackKeyStr(pk, "user");
    pk.pack(user);
    PackKeyStr(pk, "country");
    pk.pack(std::string_view(kCountries[rng.Skewed(std::size(kCountries))]));
    PackKeyStr(pk, "device");
    pk.pack(std::string_view(kDevices[rng.Skewed(std::size(kDevices))]));
    PackKeyStr(pk, "price");
    PackF64(b, Round2(std::exp(2.5 + rng.Normal())));
    PackKeyStr(pk, "qty");
    pk.pack(static_cast<int64_t>(1 + rng.Skewed(10)));
    PackKeyStr(pk, "member");
    if (rng.Below(3) == 0) {
      pk.pack_true();
    } else {
      pk.pack_false();
    }
    PackKeyStr(pk, "lat");
    PackF64(b, -60.0 + 130.0 * rng.Uniform());
    PackKeyStr(pk, "session");
    pk.pack(std::string_view(session, 16));
    d.keys.push_back(PackOne(user));
    d.values.emplace_back(b.data(), b.size());
  }
  return d;
}

Dataset Str3(uint64_t seed) {
  Rng rng(seed);
  Dataset d{
      "str3", "3 str columns: first (200 names), last (500 names), city (100 cities)", {}, {}};
  const auto first = Vocabulary(rng, 200, true);
  const auto last = Vocabulary(rng, 500, true);
  const auto city = Vocabulary(rng, 100, true);
  const size_t n = 5000;
  for (size_t i = 0; i < n; ++i) {
    const auto& l = last[rng.Skewed(last.size())];
    msgpack::sbuffer b;
    Packer pk(&b);
    pk.pack_map(3);
    PackKeyStr(pk, "first");
    pk.pack(first[rng.Skewed(first.size())]);
    PackKeyStr(pk, "last");
    pk.pack(l);
    PackKeyStr(pk, "city");
    pk.pack(city[rng.Skewed(city.size())]);
    d.keys.push_back(PackOne(l));
    d.values.emplace_back(b.data(), b.size());
  }
  return d;
}

// The item of zephyr's benchmark_shuffle.py, which `sluice bench` shuffles: not one of the
// seed's four micro-benchmark datasets, but the shape of its end-to-end workload.
Dataset Items(uint64_t seed) {
  Rng rng(seed);
  Dataset d{"items",
            "zephyr's shuffle item: key (int < 10,000), seq, src, 168-char alnum payload",
            {},
            {}};
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  const size_t n = 5000;
  std::string payload(168, ' ');
  for (size_t i = 0; i < n; ++i) {
    const auto key = static_cast<int64_t>(rng.Below(10000));
    for (char& c : payload) c = kAlnum[rng.Below(62)];
    msgpack::sbuffer b;
    Packer pk(&b);
    pk.pack_map(4);
    PackKeyStr(pk, "key");
    pk.pack(key);
    PackKeyStr(pk, "seq");
    pk.pack(static_cast<int64_t>(i));
    PackKeyStr(pk, "src");
    pk.pack(3);
    PackKeyStr(pk, "payload");
    pk.pack(payload);
    d.keys.push_back(PackOne(key));
    d.values.emplace_back(b.data(), b.size());
  }
  return d;
}

}  // namespace

std::vector<Dataset> MakeSeedDatasets(uint64_t seed) {
  std::vector<Dataset> out;
  out.push_back(Ints3(seed));
  out.push_back(IntFloatStr(seed + 1));
  out.push_back(Wide10(seed + 2));
  out.push_back(Str3(seed + 3));
  out.push_back(Items(seed + 4));
  return out;
}

}  // namespace sluice::bench
