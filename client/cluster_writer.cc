#include "client/cluster_writer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/error_reason.h"

namespace sluice::client_internal {

bool Unanswered(const absl::Status& st) {
  if (IsFromServer(st)) return false;
  return absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st);
}

absl::Status AfterRevive(const std::string& id, uint32_t epoch, const std::string& node_id,
                         const std::string& address, absl::Status cause,
                         const absl::StatusOr<ShuffleClient::Revive>& revive) {
  const std::string server = address.empty()
                                 ? absl::StrCat("server ", node_id, " (not registered now)")
                                 : absl::StrCat("server ", node_id, " at ", address);
  if (!revive.ok()) {
    return WithReason(absl::UnavailableError(
                          absl::StrCat(server, " of shuffle '", id, "' did not answer (",
                                       Describe(cause), ") and could not be taken out of it now (",
                                       Describe(revive.status()), "): retry the attempt")),
                      ReasonOf(revive.status()), RetryAfterOf(revive.status()));
  }
  if (revive->placement_epoch <= epoch) return cause;  // (nothing moved: the retry tells)
  return WithReason(absl::UnavailableError(
                        absl::StrCat(server, " did not answer (", Describe(cause), "); shuffle '",
                                     id, "' moved to placement epoch ", revive->placement_epoch,
                                     " without it: retry the attempt")),
                    ErrorReason::kPlacementChanged);
}

absl::StatusOr<WriteResult> WatchedStream::FinishCommit() {
  absl::StatusOr<WriteResult> r = stream_->FinishCommit();
  if (!r.ok()) (void)Note(r.status());
  return r;
}

void WatchedStream::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  stream_->Cancel();
}

absl::Status WatchedStream::unanswered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unanswered_;
}

absl::Status WatchedStream::Note(absl::Status st) {
  if (st.ok() || !Unanswered(st)) return st;
  std::lock_guard<std::mutex> lock(mu_);
  if (!cancelled_ && unanswered_.ok()) unanswered_ = st;
  return st;
}

absl::Status ClusterWriter::Add(std::string_view key, std::string_view value) {
  absl::Status st = writer_->Add(key, value);
  if (st.ok()) return st;
  return Failed(std::move(st));
}

absl::StatusOr<WriteResult> ClusterWriter::Close() {
  auto r = writer_->Close();
  if (r.ok()) return r;
  return Failed(r.status());
}

absl::Status ClusterWriter::Failed(absl::Status st) {
  // A server that did not answer: taken out of the shuffle, and the retry routed without it.
  // (The first stream that broke unanswered: the others' failures followed from it, or from
  // the same loss.)
  if (Unanswered(st) && !revived_) {
    for (const Watched& w : watched_) {
      absl::Status why = w.stream->unanswered();
      if (why.ok()) continue;
      revived_ = true;
      return hooks_.revive(w.node_id, w.address, std::move(why));
    }
  }
  const ErrorReason reason = ReasonOf(st);
  if (reason == ErrorReason::kPlacementChanged) hooks_.forget();  // routed afresh next time
  if (reason != ErrorReason::kNotKept) return st;
  hooks_.forget();
  return WithReason(absl::UnavailableError(absl::StrCat(
                        st.message(),
                        "; the client's placement was stale (a server renamed or replaced at "
                        "its address): retry the attempt, it is routed afresh")),
                    ErrorReason::kNotKept);
}

}  // namespace sluice::client_internal
