// The placement record's encoding in etcd, in one place: a shuffle's record as JSON and a
// mapper's decision as text, and back. A malformed record is DATA_LOSS naming what is wrong.
#ifndef SLUICE_CLUSTER_PLACEMENT_CODEC_H_
#define SLUICE_CLUSTER_PLACEMENT_CODEC_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cluster/shuffle_placement.h"

namespace sluice {

/// The record's JSON, and back (DATA_LOSS naming what is wrong with a malformed record).
/// Errors about a shuffle's record do not name the shuffle: the caller, who knows how its caller
/// names it, says which.
std::string EncodePlacement(const ShufflePlacement& p);
absl::StatusOr<ShufflePlacement> DecodePlacement(const std::string& shuffle_id,
                                                 const std::string& json);

/// A decision as etcd holds it ("<attempt>" for epoch 0, "<attempt>@<epoch>"), and back.
std::string EncodeDecision(const MapperDecision& d);
std::optional<MapperDecision> DecodeDecision(std::string_view value);

}  // namespace sluice

#endif  // SLUICE_CLUSTER_PLACEMENT_CODEC_H_
