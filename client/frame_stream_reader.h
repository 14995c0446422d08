// FrameStreamReader: the reducer side of the client, apart from the transport. It decodes the
// frames a FetchStream delivers (every byte validated: they come from the network) and hands
// out their records one at a time, as views into the current frame.
#ifndef SLUICE_CLIENT_FRAME_STREAM_READER_H_
#define SLUICE_CLIENT_FRAME_STREAM_READER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/shuffle_client.h"
#include "client/transport.h"
#include "codec/frame_decoder.h"

namespace sluice {

class FrameStreamReader final : public ShuffleReader {
 public:
  /// `source` names where the frames come from, in errors ("bad frame from <source>: ...").
  FrameStreamReader(std::unique_ptr<FetchStream> stream, const FrameLimits& limits,
                    std::string source);
  ~FrameStreamReader() override;  // cancels a fetch not read to its end

  absl::StatusOr<bool> Next(Record* out) override;

 private:
  std::unique_ptr<FetchStream> stream_;
  const std::string source_;
  FrameDecoder decoder_;
  DecodedFrame frame_;
  size_t pos_ = 0;
  bool done_ = false;
};

}  // namespace sluice

#endif  // SLUICE_CLIENT_FRAME_STREAM_READER_H_
