// Growable byte and POD buffers that never initialise what they hand out.
//
// Fresh memory is expensive to touch (every new page costs a fault), so codec objects keep
// these buffers across calls: Resize() only grows the capacity when needed and never
// zero-fills, and Clear() keeps the capacity. Invariant: size() <= capacity().
#ifndef SLUICE_CODEC_BUFFER_H_
#define SLUICE_CODEC_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

namespace sluice {

template <typename T>
class PodBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "PodBuffer holds trivially copyable types");

 public:
  PodBuffer() = default;
  PodBuffer(const PodBuffer&) = delete;
  PodBuffer& operator=(const PodBuffer&) = delete;
  PodBuffer(PodBuffer&& other) noexcept
      : data_(other.data_), size_(other.size_), capacity_(other.capacity_) {
    other.data_ = nullptr;
    other.size_ = other.capacity_ = 0;
  }
  PodBuffer& operator=(PodBuffer&& other) noexcept {
    if (this != &other) {
      std::free(data_);
      data_ = other.data_;
      size_ = other.size_;
      capacity_ = other.capacity_;
      other.data_ = nullptr;
      other.size_ = other.capacity_ = 0;
    }
    return *this;
  }
  ~PodBuffer() { std::free(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

  void Clear() { size_ = 0; }

  /// Makes room for at least `n` elements without changing size().
  void Reserve(size_t n) {
    if (n <= capacity_) return;
    size_t cap = capacity_ < 64 ? 64 : capacity_;
    while (cap < n) cap += cap / 2 + 1;
    // realloc keeps the prefix; the new tail is left untouched until written.
    void* p = std::realloc(data_, cap * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    data_ = static_cast<T*>(p);
    capacity_ = cap;
  }

  /// Sets size() to `n`; new elements are uninitialised.
  void Resize(size_t n) {
    Reserve(n);
    size_ = n;
  }

  /// Grows size() by `n` and returns a pointer to the (uninitialised) new tail.
  T* Extend(size_t n) {
    Reserve(size_ + n);
    T* tail = data_ + size_;
    size_ += n;
    return tail;
  }

  void PushBack(const T& v) { *Extend(1) = v; }

  void Append(const T* src, size_t n) {
    if (n == 0) return;
    std::memcpy(Extend(n), src, n * sizeof(T));
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

using ByteBuffer = PodBuffer<uint8_t>;

}  // namespace sluice

#endif  // SLUICE_CODEC_BUFFER_H_
