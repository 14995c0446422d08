#include "server/metrics_scrape.h"

namespace sluice {

namespace {

double D(uint64_t v) { return static_cast<double>(v); }

}  // namespace

std::vector<prometheus::MetricFamily> CollectMetrics(const MetricsSources& s) {
  const ServerMetrics& m = *s.metrics;
  MetricFamilies t;
  t.Counter("sluice_push_frames_total", "Frames pushed: validated and appended to disk",
            D(m.push_frames.load()));
  t.Counter("sluice_push_records_total", "Records in the frames pushed", D(m.push_records.load()));
  t.Counter("sluice_push_bytes_total", "Bytes of the frames pushed, as stored",
            D(m.push_bytes.load()));
  t.Counter("sluice_commits_total", "Mapper attempts committed (prepared, in a cluster)",
            D(m.commits.load()));
  t.Counter("sluice_duplicate_commits_total",
            "Mapper attempts that committed after another attempt of their mapper: discarded",
            D(m.duplicate_commits.load()));
  t.Counter("sluice_aborted_attempts_total",
            "Mapper attempts ended without a commit (an error, a cancel, a timeout)",
            D(m.aborted_attempts.load()));
  t.Counter("sluice_fetch_chunks_total", "Chunks sent to readers", D(m.fetch_chunks.load()));
  t.Counter("sluice_fetch_records_total", "Records in the chunks sent", D(m.fetch_records.load()));
  t.Counter("sluice_fetch_bytes_total", "Bytes of the chunks sent", D(m.fetch_bytes.load()));
  t.Counter("sluice_merge_passes_total",
            "Intermediate merge passes of KEY fetches (more runs than --merge_fan_in, or more "
            "than the memory a merge may hold)",
            D(m.merge_passes.load()));
  t.Counter("sluice_scrub_bytes_total",
            "Committed bytes the background scrub read and checked (--scrub_mb_per_s)",
            D(m.scrub_bytes.load()));
  t.Counter("sluice_scrub_passes_total", "Scrub passes over every open shuffle completed",
            D(m.scrub_passes.load()));
  t.Counter("sluice_premerges_total",
            "Pre-merged runs made visible by the background pre-merge (--premerge_mb_per_s)",
            D(m.premerges.load()));
  t.Counter("sluice_premerges_dropped_total",
            "Pre-merges dropped because a mapper of their range was revoked or repaired meanwhile",
            D(m.premerges_dropped.load()));
  t.Counter("sluice_premerge_bytes_total", "Bytes the background pre-merge wrote",
            D(m.premerge_bytes.load()));
  t.Counter("sluice_premerge_read_bytes_total", "Stored bytes the background pre-merge read",
            D(m.premerge_read_bytes.load()));
  t.Counter("sluice_repair_bytes_total",
            "Bytes copied from other replicas to make this server's replicas whole "
            "(--repair_mb_per_s)",
            D(m.repair_bytes.load()));
  t.Counter("sluice_repair_copies_total",
            "A mapper's data for a partition copied from another replica (re-replication)",
            D(m.repair_copies.load()));
  t.Counter("sluice_restored_copies_total",
            "Of the re-replication's copies, those restored from the object store: no server "
            "held them any more",
            D(m.restored_copies.load()));
  t.Counter("sluice_objects_uploaded_total",
            "Partitions this server uploaded to the object store and recorded (--object_store)",
            D(m.objects_uploaded.load()));
  t.Counter("sluice_object_upload_bytes_total", "Bytes of the objects this server recorded",
            D(m.object_upload_bytes.load()));
  t.Counter("sluice_object_upload_failures_total",
            "Uploads of a partition that failed (retried in a later round)",
            D(m.object_upload_failures.load()));
  t.Counter("sluice_objects_deleted_total",
            "Objects this server deleted from the store: lost races, stale records, deleted "
            "shuffles",
            D(m.objects_deleted.load()));
  t.Counter("sluice_manifests_written_total",
            "Shuffle manifests this server wrote to the object store",
            D(m.manifests_written.load()));
  t.Counter("sluice_evicted_shuffles_total",
            "Shuffles whose data this server let go because their data directory passed "
            "--object_evict_pct: every partition of them is in the object store",
            D(m.evicted_shuffles.load()));
  t.Counter("sluice_evicted_bytes_total", "Bytes the evictions freed", D(m.evicted_bytes.load()));
  t.Counter("sluice_read_back_copies_total",
            "A mapper's data for a partition of an evicted shuffle read back from the object "
            "store for a read",
            D(m.read_back_copies.load()));
  t.Counter("sluice_read_back_bytes_total", "Bytes read back from the object store for reads",
            D(m.read_back_bytes.load()));
  t.Gauge("sluice_repair_backlog",
          "Committed (mapper, partition) pairs this server's replicas lack: taken over in a "
          "later placement epoch and not copied yet",
          D(m.repair_backlog.load()));
  t.Gauge("sluice_repair_backlog_bytes",
          "Bytes this server's replicas lack: a partition's frame bytes on a whole replica less "
          "those here, as of the repairer's last round, less the copies made since",
          D(m.repair_backlog_bytes.load()));
  t.Gauge("sluice_lost_mappers",
          "Committed (mapper, partition) pairs this server's replicas lack and no server holds "
          "any more: their records are gone (docs/cluster.md, \"Lost partitions\")",
          D(m.lost_mappers.load()));
  t.Family("sluice_partitions_damaged_total", prometheus::MetricType::Counter,
           "Partitions found damaged, by what found them",
           {{{{"found_by", "fetch"}}, D(m.damaged_by_fetch.load())},
            {{{"found_by", "scrub"}}, D(m.damaged_by_scrub.load())}});
  t.Counter("sluice_merges_parked_total",
            "KEY fetches whose reader took nothing for --merge_park_after_s that gave their merge "
            "slot and memory to a fetch waiting for one",
            D(m.merges_parked.load()));
  t.Counter("sluice_fetch_stored_bytes_total",
            "Stored frame bytes fetches read (a key range's fetch: only the frames whose key "
            "bounds meet it)",
            D(m.fetch_stored_bytes.load()));
  t.Counter("sluice_merge_spill_bytes_total",
            "Bytes intermediate merge passes wrote to temporary files",
            D(m.merge_spill_bytes.load()));
  t.Histo("sluice_commit_sync_seconds",
          "One commit batch's data sync, log write and log sync (group commit)",
          m.commit_sync_seconds.Read());
  t.Histo("sluice_commit_seconds",
          "A commit message's handling, from its arrival to its answer (its batch included)",
          m.commit_seconds.Read());
  std::vector<std::pair<MetricFamilies::Labels, double>> calls;
  for (const auto& [key, n] : m.calls.Read()) {
    calls.push_back({{{"method", key.first}, {"code", StatusCodeName(key.second)}}, D(n)});
  }
  t.Family("sluice_rpc_handled_total", prometheus::MetricType::Counter,
           "Calls finished, by method and status code (failures: code != \"OK\")", calls);

  if (s.object_store != nullptr) {
    const objstore::S3Counters c = s.object_store->counters();
    std::vector<std::pair<MetricFamilies::Labels, double>> requests;
    for (const auto& [request, n] : c.ByRequest()) {
      requests.push_back({{{"request", request}}, D(n)});
    }
    t.Family("sluice_object_requests_total", prometheus::MetricType::Counter,
             "Requests to the object store, by S3 request type (a retry counts again): what a "
             "bill counts",
             requests);
    t.Counter("sluice_object_retries_total", "Object-store requests retried", D(c.retries));
    t.Counter("sluice_object_sent_bytes_total", "Bytes sent to the object store", D(c.bytes_sent));
    t.Counter("sluice_object_received_bytes_total", "Bytes received from the object store",
              D(c.bytes_received));
  }
  t.Gauge("sluice_push_streams", "Push streams open", D(s.streams->push()));
  if (s.connections != nullptr) {
    t.Gauge("sluice_connections", "Client connections open (accepted and kept)",
            D(s.connections->open()));
    t.Gauge("sluice_connections_max", "Client connections the server keeps at most",
            D(s.connections->limits().max_connections));
    std::vector<std::pair<MetricFamilies::Labels, double>> refused;
    for (int r = 0; r < ConnectionGuard::kRefusals; ++r) {
      const auto why = static_cast<ConnectionGuard::Refusal>(r);
      refused.push_back(
          {{{"reason", ConnectionGuard::RefusalName(why)}}, D(s.connections->refused(why))});
    }
    if (s.listener_accepting >= 0) {
      t.Gauge("sluice_listener_accepting",
              "1 while the listener's last probe connection was accepted, 0 after one was not "
              "(three in a row: the server drains and exits 1 for a restart)",
              D(static_cast<uint64_t>(s.listener_accepting)));
    }
    t.Family("sluice_connections_refused_total", prometheus::MetricType::Counter,
             "Connections closed as they were accepted: past --max_connections (server_limit), "
             "--max_connections_per_address (address_limit), or the descriptors kept in reserve "
             "(descriptors)",
             refused);
  }
  t.Gauge("sluice_fetch_streams", "Fetch streams open", D(s.streams->fetch()));
  t.Gauge("sluice_memory_budget_used_bytes", "Memory counted against --memory_budget_mb",
          D(s.budget->used()));
  t.Gauge("sluice_memory_budget_bytes", "The memory budget (--memory_budget_mb)",
          D(s.budget->limit()));
  t.Counter("sluice_backpressure_waits_total",
            "Times a stream waited for the memory budget before reading on",
            D(s.budget->parked_total()));
  t.Gauge("sluice_memory_budget_tenants",
          "Tenants holding or waiting for memory now (each one's share is the budget over them)",
          D(s.budget->active_tenants()));
  t.Counter("sluice_memory_promises_revoked_total",
            "Times memory promised to a large frame of a tenant over its share, and not yet "
            "received, was taken back for a tenant under its share",
            D(s.budget->revoked_total()));
  std::vector<std::pair<MetricFamilies::Labels, double>> free, size, failed;
  // Labelled by position in --data_dir (1, 2, ...: "data directory N" in the log, GetNode and
  // `sluice nodes`), not by path: a scrape does not learn the host's file layout, and a series
  // keeps its name when a disk is mounted elsewhere.
  const auto dirs = s.registry->DataDirs();
  for (size_t i = 0; i < dirs.size(); ++i) {
    const auto& dir = dirs[i];
    const MetricFamilies::Labels labels = {{"dir", std::to_string(i + 1)}};
    failed.push_back({labels, dir.failed.ok() ? 0 : 1});
    if (!dir.space_known) continue;
    free.push_back({labels, D(dir.free_bytes)});
    size.push_back({labels, D(dir.total_bytes)});
  }
  t.Family("sluice_disk_free_bytes", prometheus::MetricType::Gauge,
           "Bytes free for the server on each data directory's file system", free);
  t.Family("sluice_disk_size_bytes", prometheus::MetricType::Gauge,
           "Size of each data directory's file system", size);
  t.Family("sluice_data_dir_failed", prometheus::MetricType::Gauge,
           "1 for a data directory that failed (it takes no new shuffles; its shuffles are "
           "unavailable until it is repaired and the server restarted)",
           failed);
  uint64_t partitions = 0, damaged = 0, open = 0;
  s.registry->ForEachOpen([&](const std::shared_ptr<ShuffleStore>& store) {
    ++open;
    partitions += store->params().num_partitions;
    damaged += store->DamagedPartitions().size();
  });
  t.Gauge("sluice_shuffles", "Shuffles held, open or not (damaged ones apart)",
          D(open + s.registry->unopened()));
  t.Gauge("sluice_shuffles_unopened",
          "Shuffles held and not open now: found at start and not opened yet, or closed while "
          "idle (each opens when asked for)",
          D(s.registry->unopened()));
  t.Gauge("sluice_partitions", "Partitions of the open shuffles", D(partitions));
  t.Gauge("sluice_index_bytes", "Memory the open shuffles' frame indexes take",
          D(s.registry->index_bytes()));
  t.Gauge("sluice_damaged_partitions",
          "Partitions of open shuffles found damaged (their fetches fail with DATA_LOSS here)",
          D(damaged));
  t.Gauge("sluice_damaged_shuffles", "Shuffles whose recovery failed (DATA_LOSS until deleted)",
          D(s.registry->ListDamaged().size()));
  t.Gauge("sluice_draining", "1 while the server drains (SIGTERM, the Drain RPC)",
          s.draining ? 1 : 0);
  t.Gauge("sluice_start_time_seconds", "When the server started, in Unix seconds",
          D(s.started_unix_ms) / 1000.0);
  if (s.tls_expiry_unix != 0) {
    t.Gauge("sluice_tls_certificate_expiry_seconds",
            "When the TLS certificate served expires, in Unix seconds (alert before it)",
            D(static_cast<uint64_t>(s.tls_expiry_unix)));
    t.Counter("sluice_tls_reloads_total",
              "Rotated TLS files taken since the start (a certificate pair, or client CAs)",
              D(s.tls_reloads));
  }
  return std::move(t.families());
}

}  // namespace sluice
