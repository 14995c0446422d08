// What the in-process service tests share (tests/server/server*_test.cc): records and push
// messages of a mapper, and ServerTest, a real SluiceServer on 127.0.0.1:0 with a real
// temporary data directory called through the generated gRPC stub (create, push, fetch in
// either order, GetShuffle; restarts on the same directory).
#ifndef SLUICE_TESTS_SERVER_SERVER_FIXTURE_H_
#define SLUICE_TESTS_SERVER_SERVER_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codec/frame_decoder.h"
#include "codec/frame_encoder.h"
#include "codec/frame_format.h"
#include "server/sluice_server.h"
#include "sluice/v1/shuffle.grpc.pb.h"
#include "tests/harness/mini_server.h"
#include "tests/harness/status_matchers.h"
#include "tests/harness/stub.h"

namespace sluice::server_test {

using testing::MakeStub;
using testing::MiniServer;
using testing::MiniServerOptions;
namespace pb = sluice::v1;

// Records of mapper m for partition p: keys "m<m>-p<p>-<i>", values with `pad` extra bytes.
inline std::vector<std::pair<std::string, std::string>> Rows(uint32_t m, uint32_t p, int n,
                                                             size_t pad = 0) {
  std::vector<std::pair<std::string, std::string>> rows;
  uint64_t x = 0x9e3779b97f4a7c15ULL * (m + 1) + p;
  for (int i = 0; i < n; ++i) {
    std::string v = "v" + std::to_string(i);
    for (size_t k = 0; k < pad; ++k) {  // incompressible padding
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      v.push_back(static_cast<char>('a' + x % 26));
    }
    rows.emplace_back("m" + std::to_string(m) + "-p" + std::to_string(p) + "-" + std::to_string(i),
                      std::move(v));
  }
  return rows;
}

inline std::string Frame(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::vector<Record> records;
  for (const auto& [k, v] : rows) records.push_back(Record{k, v});
  FrameEncoder enc;
  std::string out;
  EXPECT_OK(enc.Encode(records, &out));
  return out;
}

inline pb::PushRequest OpenMsg(const std::string& id, uint32_t mapper, uint64_t attempt = 1) {
  pb::PushRequest open;
  open.mutable_open()->set_shuffle_id(id);
  open.mutable_open()->set_mapper_id(mapper);
  open.mutable_open()->set_attempt_id(attempt);
  return open;
}

inline pb::PushRequest FramesMsg(uint32_t partition, std::string frame) {
  pb::PushRequest msg;
  auto* f = msg.mutable_frames()->add_frames();
  f->set_partition_id(partition);
  f->set_frame(std::move(frame));
  return msg;
}

inline pb::PushRequest CommitMsg(uint64_t frames, uint64_t records) {
  pb::PushRequest commit;
  commit.mutable_commit()->set_frame_count(frames);
  commit.mutable_commit()->set_record_count(records);
  return commit;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  void StartServer(uint64_t budget = 256ull << 20, size_t fan_in = 64,
                   uint32_t max_frame_bytes = kDefaultMaxUncompressedBytes, size_t merges = 0) {
    MiniServerOptions opts;
    opts.server.max_concurrent_merges = merges;
    opts.server.limits.max_uncompressed_bytes = max_frame_bytes;
    opts.server.memory_budget_bytes = budget;
    opts.server.merge_fan_in = fan_in;
    opts.server.max_frames_per_attempt = max_frames_per_attempt_;
    // (These tests push through the plain Push stub, 36 streams at once in one of them.)
    opts.server.max_plain_push_streams = 64;
    if (server_ == nullptr) {
      ASSERT_OK_AND_ASSIGN(server_, MiniServer::Start(opts));
    } else {
      stub_.reset();
      ASSERT_OK(server_->Restart(opts));
    }
    stub_ = MakeStub(*server_);
  }
  // The same data directory, a new server process state.
  void RestartServer(uint64_t budget = 256ull << 20, size_t fan_in = 64,
                     uint32_t max_frame_bytes = kDefaultMaxUncompressedBytes, size_t merges = 0) {
    StartServer(budget, fan_in, max_frame_bytes, merges);
  }

  // One attempt made of the given frames (all for partition 0).
  grpc::Status PushFrames(const std::string& id, uint32_t mapper,
                          const std::vector<std::string>& frames, uint64_t records) {
    grpc::ClientContext ctx;
    pb::PushResponse resp;
    auto writer = stub_->Push(&ctx, &resp);
    writer->Write(OpenMsg(id, mapper, 1));
    for (const std::string& frame : frames) {
      writer->Write(FramesMsg(0, frame));
    }
    writer->Write(CommitMsg(frames.size(), records));
    writer->WritesDone();
    return writer->Finish();
  }

  // Partition 0 in KEY order, records in stream order, plus the frames' headers.
  grpc::Status FetchKeyOrder(const std::string& id,
                             std::vector<std::pair<std::string, std::string>>* out,
                             std::vector<FrameHeader>* headers = nullptr,
                             pb::FrameLayout layout = pb::LAYOUT_AUTO, bool uncompressed = false,
                             uint32_t chunk = 0) {
    grpc::ClientContext ctx;
    pb::FetchRequest req;
    req.set_shuffle_id(id);
    req.set_partition_id(0);
    req.set_order(pb::KEY);
    req.set_layout(layout);
    req.set_uncompressed(uncompressed);
    req.set_target_chunk_bytes(chunk);
    auto reader = stub_->Fetch(&ctx, req);
    pb::FetchResponse resp;
    FrameDecoder dec;
    DecodedFrame frame;
    while (reader->Read(&resp)) {
      EXPECT_OK(dec.Decode(resp.frame(), &frame));
      if (headers != nullptr) headers->push_back(frame.header());
      for (const Record& r : frame) out->emplace_back(std::string(r.key), std::string(r.value));
    }
    return reader->Finish();
  }

  grpc::Status Create(const std::string& id, uint32_t partitions, uint32_t mappers,
                      bool* created = nullptr) {
    grpc::ClientContext ctx;
    pb::CreateShuffleRequest req;
    req.set_shuffle_id(id);
    req.set_num_partitions(partitions);
    req.set_num_mappers(mappers);
    pb::CreateShuffleResponse resp;
    grpc::Status st = stub_->CreateShuffle(&ctx, req, &resp);
    if (created != nullptr) *created = resp.created();
    return st;
  }

  // One attempt: open, one message per partition, commit with the true (or given) counts.
  grpc::Status Push(const std::string& id, uint32_t mapper, uint64_t attempt, uint32_t partitions,
                    int rows_per_partition, pb::PushResponse* resp, int64_t frame_count = -1,
                    size_t pad = 0) {
    grpc::ClientContext ctx;
    auto writer = stub_->Push(&ctx, resp);
    writer->Write(OpenMsg(id, mapper, attempt));
    for (uint32_t p = 0; p < partitions; ++p) {
      if (!writer->Write(FramesMsg(p, Frame(Rows(mapper, p, rows_per_partition, pad))))) break;
    }
    writer->Write(CommitMsg(frame_count >= 0 ? frame_count : partitions,
                            static_cast<uint64_t>(partitions) * rows_per_partition));
    writer->WritesDone();
    return writer->Finish();
  }

  // All records of a partition, sorted, as "key=value".
  grpc::Status FetchAll(const std::string& id, uint32_t partition, std::vector<std::string>* out,
                        bool require_complete = false) {
    grpc::ClientContext ctx;
    pb::FetchRequest req;
    req.set_shuffle_id(id);
    req.set_partition_id(partition);
    req.set_order(pb::UNORDERED);
    req.set_require_complete(require_complete);
    auto reader = stub_->Fetch(&ctx, req);
    pb::FetchResponse resp;
    FrameDecoder dec;
    DecodedFrame frame;
    while (reader->Read(&resp)) {
      EXPECT_OK(dec.Decode(resp.frame(), &frame));
      for (const Record& r : frame) out->push_back(std::string(r.key) + "=" + std::string(r.value));
    }
    std::sort(out->begin(), out->end());
    return reader->Finish();
  }

  pb::ShuffleInfo Info(const std::string& id, grpc::Status* st = nullptr) {
    grpc::ClientContext ctx;
    pb::GetShuffleRequest req;
    req.set_shuffle_id(id);
    pb::ShuffleInfo info;
    grpc::Status s = stub_->GetShuffle(&ctx, req, &info);
    if (st != nullptr) *st = s;
    return info;
  }

  static std::vector<std::string> Expected(std::vector<uint32_t> mappers, uint32_t p, int n) {
    std::vector<std::string> out;
    for (uint32_t m : mappers) {
      for (const auto& [k, v] : Rows(m, p, n)) out.push_back(k + "=" + v);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  uint64_t max_frames_per_attempt_ = uint64_t{1} << 20;
  std::unique_ptr<MiniServer> server_;
  std::unique_ptr<pb::ShuffleService::Stub> stub_;
};

}  // namespace sluice::server_test

#endif  // SLUICE_TESTS_SERVER_SERVER_FIXTURE_H_
