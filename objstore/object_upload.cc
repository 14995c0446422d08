#include "objstore/object_upload.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace sluice::objstore {

void RateLimiter::Take(uint64_t bytes) {
  if (rate_ <= 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  tokens_ = std::min(rate_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
  last_ = now;
  tokens_ -= static_cast<double>(bytes);  // (may go below zero: this caller waits it off)
  if (tokens_ >= 0) return;
  const auto wait = std::chrono::duration<double>(-tokens_ / rate_);
  lock.unlock();
  std::this_thread::sleep_for(wait);
}

ObjectUpload::ObjectUpload(S3Store* store, std::string key, UploadOptions options)
    : store_(store), key_(std::move(key)), options_(options) {}

absl::StatusOr<std::unique_ptr<ObjectUpload>> ObjectUpload::Start(S3Store* store, std::string key,
                                                                  UploadOptions options) {
  if (options.part_bytes < kMinPartBytes || options.part_bytes > (uint64_t{5} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("object upload: parts of ", options.part_bytes, " bytes (5 MiB to 5 GiB)"));
  }
  if (options.parallel_parts < 1 || options.parallel_parts > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("object upload: ", options.parallel_parts, " parallel parts (1 to 64)"));
  }
  if (!ValidObjectKey(key)) {
    return absl::InvalidArgumentError(absl::StrCat("object upload: key '", key, "'"));
  }
  std::unique_ptr<ObjectUpload> up(new ObjectUpload(store, std::move(key), options));
  up->buffer_.reserve(options.part_bytes);
  return up;
}

ObjectUpload::~ObjectUpload() {
  if (!finished_) Abort();
  StopSenders();
}

int ObjectUpload::parts_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(
      std::count_if(etags_.begin(), etags_.end(), [](const std::string& e) { return !e.empty(); }));
}

absl::Status ObjectUpload::FirstError() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void ObjectUpload::StopSenders() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  work_.notify_all();
  for (std::thread& t : senders_) t.join();  // (each ends the part it sends, if any)
  senders_.clear();
}

void ObjectUpload::Sender() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    auto [part, bytes] = std::move(queue_.front());
    queue_.erase(queue_.begin());
    ++in_flight_;
    lock.unlock();
    if (options_.limiter != nullptr) options_.limiter->Take(bytes.size());
    absl::StatusOr<std::string> etag = store_->UploadPart(key_, upload_id_, part, bytes);
    bytes = std::string();  // (its memory goes before the next part's wait)
    lock.lock();
    if (etag.ok()) {
      etags_[part - 1] = *std::move(etag);
    } else if (error_.ok()) {
      error_ = etag.status();
    }
    --in_flight_;
    room_.notify_all();
  }
}

absl::Status ObjectUpload::SendPart() {
  if (upload_id_.empty()) {
    SLUICE_ASSIGN_OR_RETURN(upload_id_, store_->StartUpload(key_));
    for (int i = 0; i < options_.parallel_parts; ++i) senders_.emplace_back([this] { Sender(); });
  }
  std::unique_lock<std::mutex> lock(mu_);
  room_.wait(lock, [&] {
    return !error_.ok() || static_cast<int>(queue_.size()) + in_flight_ < options_.parallel_parts;
  });
  if (!error_.ok()) return error_;
  if (etags_.size() >= static_cast<size_t>(kMaxParts)) {
    return absl::FailedPreconditionError(absl::StrCat("object upload ", key_, ": more than ",
                                                      kMaxParts, " parts of ", options_.part_bytes,
                                                      " bytes"));
  }
  etags_.emplace_back();
  queue_.emplace_back(static_cast<int>(etags_.size()), std::move(buffer_));
  lock.unlock();
  work_.notify_one();
  // (A new buffer a part: parts are megabytes, and at most parallel_parts + 1 live at once.)
  buffer_ = std::string();
  buffer_.reserve(options_.part_bytes);
  return absl::OkStatus();
}

absl::Status ObjectUpload::Append(absl::string_view bytes) {
  if (finished_ || aborted_) {
    return absl::FailedPreconditionError(absl::StrCat("object upload ", key_, " is over"));
  }
  if (absl::Status st = FirstError(); !st.ok()) {
    Abort();
    return st;
  }
  while (!bytes.empty()) {
    const size_t take = std::min<size_t>(bytes.size(), options_.part_bytes - buffer_.size());
    buffer_.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (buffer_.size() == options_.part_bytes) {
      if (absl::Status st = SendPart(); !st.ok()) {
        Abort();
        return st;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ObjectInfo> ObjectUpload::Finish() {
  if (finished_ || aborted_) {
    return absl::FailedPreconditionError(absl::StrCat("object upload ", key_, " is over"));
  }
  if (upload_id_.empty()) {
    // Smaller than a part: one PUT.
    if (options_.limiter != nullptr) options_.limiter->Take(buffer_.size());
    if (absl::Status st = store_->Put(key_, buffer_); !st.ok()) {
      aborted_ = true;
      return st;
    }
    finished_ = true;
    return store_->Head(key_);
  }
  // The last part may be short; an empty one is not sent.
  if (!buffer_.empty()) {
    if (absl::Status st = SendPart(); !st.ok()) {
      Abort();
      return st;
    }
  }
  std::vector<std::string> etags;
  {
    std::unique_lock<std::mutex> lock(mu_);
    room_.wait(lock, [&] { return !error_.ok() || (queue_.empty() && in_flight_ == 0); });
    etags = etags_;
  }
  if (absl::Status st = FirstError(); !st.ok()) {
    Abort();
    return st;
  }
  StopSenders();
  if (absl::Status st = store_->CompleteUpload(key_, upload_id_, etags); !st.ok()) {
    Abort();
    return st;
  }
  finished_ = true;
  return store_->Head(key_);
}

void ObjectUpload::Abort() {
  if (aborted_ || finished_) return;
  aborted_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok())
      error_ = absl::CancelledError(absl::StrCat("object upload ", key_, " aborted"));
  }
  room_.notify_all();
  StopSenders();
  if (!upload_id_.empty()) (void)store_->AbortUpload(key_, upload_id_);
}

}  // namespace sluice::objstore
