// _sluice: the Python client's native part (the package `sluice`, client/python/sluice/, wraps
// it). Encoding, compression and gRPC run in C++ with the GIL released; Python objects are
// turned into msgpack and back in C++ (py_msgpack.h). Errors are raised as sluice.Error with
// `code` (the gRPC status name, "NOT_FOUND", ...) and `message`.
// The Client is here; the Writer and Reader in py_writer.cc and py_reader.cc, how they call the
// C++ client in py_call.h.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/python/py_arrow.h"
#include "client/python/py_call.h"
#include "client/python/py_column_decoder.h"
#include "client/python/py_columns.h"
#include "client/python/py_msgpack.h"
#include "client/python/py_reader.h"
#include "client/python/py_writer.h"
#include "client/shuffle_client.h"
#include "rpc/error_reason.h"

namespace sluice::py {
namespace {

namespace pb = pybind11;

class Client {
 public:
  Client(const std::string& servers, double call_timeout_s, bool tls, const std::string& tls_ca,
         const std::string& tls_cert, const std::string& tls_key,
         const std::string& tls_server_name, const std::string& token, double keepalive_s,
         double keepalive_timeout_s, double placement_ttl_s, double unhealthy_for_s,
         double stream_timeout_s, const std::string& object_store,
         const std::string& object_endpoint) {
    ClientOptions o;
    o.object_store = object_store;
    o.object_endpoint = object_endpoint;
    o.server = servers;
    o.call_deadline = Millis(call_timeout_s);
    o.keepalive_time = Millis(keepalive_s);
    o.keepalive_timeout = Millis(keepalive_timeout_s);
    o.placement_ttl = Millis(placement_ttl_s);
    o.unhealthy_for = Millis(unhealthy_for_s);
    if (stream_timeout_s != 0) o.stream_deadline = Millis(stream_timeout_s);  // 0: none
    o.tls.enabled = tls;
    o.tls.ca_file = tls_ca;
    o.tls.cert_file = tls_cert;
    o.tls.key_file = tls_key;
    o.tls.server_name = tls_server_name;
    o.token = token;
    absl::StatusOr<std::unique_ptr<ShuffleClient>> c =
        CallWithoutGil([&] { return ShuffleClient::Connect(o); });
    client_ = Check(std::move(c));
  }

  bool CreateShuffle(const std::string& id, uint32_t partitions, uint32_t mappers,
                     uint32_t replication) {
    absl::StatusOr<bool> r = CallWithoutGil(
        [&] { return client_->CreateShuffle(id, partitions, mappers, replication); });
    return Check(std::move(r));
  }

  void DeleteShuffle(const std::string& id) {
    absl::Status st = CallWithoutGil([&] { return client_->DeleteShuffle(id); });
    Check(st);
  }

  pb::dict GetShuffle(const std::string& id, uint32_t hot_keys) {
    StatusOptions options;
    options.hot_keys = hot_keys;
    absl::StatusOr<ShuffleStatus> r =
        CallWithoutGil([&] { return client_->GetShuffle(id, options); });
    ShuffleStatus s = Check(std::move(r));
    pb::dict d;
    d["shuffle_id"] = s.shuffle_id;
    d["num_partitions"] = s.num_partitions;
    d["num_mappers"] = s.num_mappers;
    d["committed_mappers"] = s.committed_mappers;
    pb::list parts;
    for (const auto& p : s.partitions) {
      pb::dict pd;
      pd["records"] = p.records;
      pd["bytes"] = p.bytes;
      pd["frames"] = p.frames;
      if (hot_keys > 0) {
        pb::list hot;
        for (const auto& h : p.hot_keys) {
          pb::dict hd;
          hd["key"] = pb::bytes(h.key);
          hd["cut"] = h.cut;
          hd["records"] = h.records;
          hd["bytes"] = h.bytes;
          hd["error"] = h.error;
          hot.append(hd);
        }
        pd["hot_keys"] = hot;
      }
      parts.append(pd);
    }
    d["partitions"] = parts;
    d["damaged"] = s.damaged;
    d["unavailable_partitions"] = s.unavailable_partitions;
    d["under_replicated_partitions"] = s.under_replicated_partitions;
    pb::dict lost;  // partition -> the mappers whose records of it no server holds
    for (const auto& l : s.lost_partitions) lost[pb::int_(l.partition)] = l.mappers;
    d["lost_partitions"] = lost;
    d["placement_epoch"] = s.placement_epoch;
    return d;
  }

  pb::dict GetSplits(const std::string& id, uint32_t partition, uint32_t slices) {
    absl::StatusOr<SplitKeys> r =
        CallWithoutGil([&] { return client_->GetSplits(id, partition, slices); });
    SplitKeys s = Check(std::move(r));
    pb::dict d;
    pb::list keys;
    for (const std::string& k : s.keys) keys.append(pb::bytes(k));
    d["keys"] = keys;
    d["slice_bytes"] = s.slice_bytes;
    d["partition_bytes"] = s.partition_bytes;
    d["frames"] = s.frames;
    d["frames_without_bounds"] = s.frames_without_bounds;
    return d;
  }

  pb::dict RevokeMappers(const std::string& id, const std::vector<uint32_t>& mappers,
                         uint32_t placement_epoch) {
    absl::StatusOr<ShuffleClient::Revocation> r =
        CallWithoutGil([&] { return client_->RevokeMappers(id, mappers, placement_epoch); });
    ShuffleClient::Revocation done = Check(std::move(r));
    pb::dict d;
    d["placement_epoch"] = done.placement_epoch;
    d["attempts"] = done.attempts;
    return d;
  }

  pb::object OpenWriter(const std::string& id, uint32_t mapper, uint64_t attempt, bool sort_by_key,
                        size_t buffer_bytes, int zstd_level, bool pickle_fallback) {
    WriterOptions o;
    o.sort_by_key = sort_by_key;
    o.buffer_bytes = buffer_bytes;
    o.zstd_level = zstd_level;
    absl::StatusOr<std::unique_ptr<ShuffleWriter>> w =
        CallWithoutGil([&] { return client_->OpenWriter(id, mapper, attempt, o); });
    return NewWriter(Check(std::move(w)), pickle_fallback);
  }

  pb::object OpenReader(const std::string& id, uint32_t partition, bool key_order,
                        bool require_complete, bool raw, bool allow_pickle,
                        std::optional<std::string> from_key, std::optional<std::string> to_key) {
    ReaderOptions o;
    o.order = key_order ? FetchOrder::kKey : FetchOrder::kUnordered;
    o.require_complete = require_complete;
    o.from_key = from_key.value_or("");
    o.to_key = std::move(to_key);
    absl::StatusOr<std::unique_ptr<ShuffleReader>> r =
        CallWithoutGil([&] { return client_->OpenReader(id, partition, o); });
    return NewReader(Check(std::move(r)), raw, allow_pickle);
  }

 private:
  std::unique_ptr<ShuffleClient> client_;
};

}  // namespace
}  // namespace sluice::py

PYBIND11_MODULE(_sluice, m) {
  namespace pb = pybind11;
  using namespace sluice::py;
  m.doc() = "Sluice's native client (use the `sluice` package)";
  PyObject* error = PyErr_NewExceptionWithDoc(
      "sluice.Error",
      "A Sluice call failed: `code` is the gRPC status name (NOT_FOUND, UNAVAILABLE, ...), "
      "`message` what happened, `retryable` whether a retry (of a mapper: a new attempt) can "
      "succeed, `retry_after` the seconds the server suggests waiting (or None), `reason` why "
      "when the server says (ETCD_UNAVAILABLE, DRAINING, JOINING, NOT_KEPT, SETTLING, "
      "PLACEMENT_CHANGED, INCOMPLETE, REVOKED, NOT_COMMITTED; or None).",
      nullptr, nullptr);
  SetErrorType(error);
  m.attr("Error") = pb::handle(error);

  pb::class_<Client>(m, "Client")
      .def(pb::init<const std::string&, double, bool, const std::string&, const std::string&,
                    const std::string&, const std::string&, const std::string&, double, double,
                    double, double, double, const std::string&, const std::string&>(),
           pb::arg("servers"), pb::arg("call_timeout_s") = 30.0, pb::arg("tls") = false,
           pb::arg("tls_ca") = "", pb::arg("tls_cert") = "", pb::arg("tls_key") = "",
           pb::arg("tls_server_name") = "", pb::arg("token") = "", pb::arg("keepalive_s") = 10.0,
           pb::arg("keepalive_timeout_s") = 10.0, pb::arg("placement_ttl_s") = 10.0,
           pb::arg("unhealthy_for_s") = 30.0, pb::arg("stream_timeout_s") = 0.0,
           pb::arg("object_store") = "", pb::arg("object_endpoint") = "")
      .def("create_shuffle", &Client::CreateShuffle, pb::arg("shuffle_id"), pb::arg("partitions"),
           pb::arg("mappers") = 0, pb::arg("replication") = 0)
      .def("delete_shuffle", &Client::DeleteShuffle, pb::arg("shuffle_id"))
      .def("get_shuffle", &Client::GetShuffle, pb::arg("shuffle_id"), pb::arg("hot_keys") = 0)
      .def("get_splits", &Client::GetSplits, pb::arg("shuffle_id"), pb::arg("partition"),
           pb::arg("slices"))
      .def("revoke_mappers", &Client::RevokeMappers, pb::arg("shuffle_id"), pb::arg("mappers"),
           pb::arg("placement_epoch"))
      .def("open_writer", &Client::OpenWriter, pb::keep_alive<0, 1>(), pb::arg("shuffle_id"),
           pb::arg("mapper"), pb::arg("attempt"), pb::arg("sort_by_key"), pb::arg("buffer_bytes"),
           pb::arg("zstd_level"), pb::arg("pickle_fallback"))
      .def("open_reader", &Client::OpenReader, pb::keep_alive<0, 1>(), pb::arg("shuffle_id"),
           pb::arg("partition"), pb::arg("key_order"), pb::arg("require_complete"), pb::arg("raw"),
           pb::arg("allow_pickle"), pb::arg("from_key") = pb::none(),
           pb::arg("to_key") = pb::none());
  BindWriter(m);
  BindReader(m);
  m.def(
      "packb",
      [](pb::handle o, bool pickle_fallback) {
        std::string out;
        Pack(o, pickle_fallback, &out);
        return pb::bytes(out);
      },
      pb::arg("obj"), pb::arg("pickle_fallback") = false, "msgpack bytes of obj (as keys route)");
  m.def(
      "unpackb",
      [](pb::bytes b, bool allow_pickle) { return Unpack(std::string_view(b), allow_pickle); },
      pb::arg("data"), pb::arg("allow_pickle") = false);
  m.def(
      "partition_of",
      [](pb::handle key, uint32_t partitions) {
        std::string k;
        Pack(key, false, &k);
        return sluice::HashPartition(k, partitions);
      },
      pb::arg("key"), pb::arg("partitions"),
      "the partition a key goes to: xxh3-64 of its msgpack bytes, modulo the partition count");
}
