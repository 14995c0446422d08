#include "server/rules/object_source.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/rules/frame_copy.h"

namespace sluice {

absl::StatusOr<std::map<uint32_t, ObjectRecord>> ObjectSource::Records(const std::string& id) {
  if (!node_->clustered() && registry_ != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<ShuffleStore> store, registry_->Get(id));
    SLUICE_ASSIGN_OR_RETURN(std::string json, store->ReadObjectsFile());
    SLUICE_ASSIGN_OR_RETURN(ShuffleManifest m, DecodeShuffleManifest(json, id));
    return m.objects;
  }
  const ClusterMembership::View view = node_->membership().view();
  SLUICE_RETURN_IF_ERROR(view.Joined());
  return view.placements->Objects(id);
}

absl::StatusOr<std::set<uint32_t>> ObjectSource::Read(
    const std::string& id, uint32_t partition, const ObjectRecord& record,
    const std::map<uint32_t, uint64_t>& want,
    const std::function<absl::Status(uint32_t, absl::string_view, absl::string_view)>& each) {
  SLUICE_ASSIGN_OR_RETURN(
      auto object, objstore::PartitionObjectReader::Open(store_, {record.key, record.size}, id,
                                                         partition, ranges_));
  const objstore::PartitionObjectFooter& footer = object->footer();
  if (WinnerSet(footer.winners) != record.winners) {
    return absl::DataLossError(absl::StrCat("object ", record.key, " of partition ", partition,
                                            " of shuffle '", id,
                                            "' holds other winners than its record names"));
  }
  std::set<uint32_t> held;
  for (const auto& [m, a] : footer.winners) {
    auto w = want.find(m);
    if (w != want.end() && w->second == a) held.insert(m);
  }
  // Their frames, in stretches of neighbours (a mapper's frames are together).
  size_t i = 0;
  while (i < footer.frames.size()) {
    if (held.count(footer.frames[i].mapper) == 0) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < footer.frames.size() && held.count(footer.frames[j].mapper) != 0) ++j;
    SLUICE_RETURN_IF_ERROR(object->ReadFrames(i, j, [&](size_t k, absl::string_view frame) {
      return each(footer.frames[k].mapper, frame, footer.frames[k].bounds);
    }));
    i = j;
  }
  return held;
}

ObjectSource::Restored ObjectSource::RestoreInto(ShuffleStore& store, const std::string& id,
                                                 uint32_t partition, const ObjectRecord& record,
                                                 const std::map<uint32_t, uint64_t>& want,
                                                 const std::function<bool(uint64_t)>& pace) {
  Restored out;
  std::unique_ptr<FrameCopy> copy;
  const auto finish = [&]() -> absl::Status {
    absl::Status st = copy->Commit();
    if (!st.ok() && !absl::IsAlreadyExists(st)) return st;
    out.mappers.insert(copy->mapper());
    out.bytes += copy->bytes();
    copy.reset();
    return absl::OkStatus();
  };
  absl::StatusOr<std::set<uint32_t>> held =
      Read(id, partition, record, want,
           [&](uint32_t m, absl::string_view frame, absl::string_view bounds) -> absl::Status {
             if (!pace(frame.size())) return absl::CancelledError("the server is stopping");
             if (copy != nullptr && copy->mapper() != m) SLUICE_RETURN_IF_ERROR(finish());
             if (copy == nullptr)
               copy = std::make_unique<FrameCopy>(&store, partition, m, want.at(m));
             return copy->Add(
                 absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(frame.data()), frame.size()),
                 name_, std::string_view(bounds.data(), bounds.size()));
           });
  out.status = held.status();
  if (out.status.ok() && copy != nullptr) out.status = finish();
  if (copy != nullptr) copy->Discard();
  // The mappers held with no frame in the partition: present, with nothing.
  for (uint32_t m : out.status.ok() ? *held : std::set<uint32_t>{}) {
    if (out.mappers.count(m) != 0) continue;
    absl::Status empty = store.Repair(m, want.at(m), partition, {});
    if (!empty.ok() && !absl::IsAlreadyExists(empty)) {
      out.status = empty;
      break;
    }
    out.mappers.insert(m);
  }
  return out;
}

}  // namespace sluice
