// The partition tests' network (docs/cluster.md, "Revive": partitions), made and removed by the
// test. Two network namespaces, each joined to the host by a veth pair, the host routing
// between them (ip_forward on while it lives):
//
//   host: the test's clients (writers and readers), etcd on 127.0.0.1 and on etcd_host()
//    |-- peers namespace: the other servers, on peer_host(0..2)
//    `-- cut namespace: the server cut off, on cut_host()
//
// Cut(kind) drops every packet between the cut server and one kind of peer, both ways, with
// policy-routing blackhole rules (on the host, and in the cut namespace for its own packets):
// the other side of a connection hears nothing (a new connection from the host fails at
// once). Heal(kind) removes them. Needs root and `ip` (iproute2): Make says why not.
//
//   ASSERT_OK_AND_ASSIGN(auto net, PartitionNet::Make());
//   net->Cut(PartitionNet::kWriters);  ...  net->Heal(PartitionNet::kWriters);
#ifndef SLUICE_TESTS_HARNESS_NETNS_H_
#define SLUICE_TESTS_HARNESS_NETNS_H_

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/harness/run_command.h"

namespace sluice::testing {

class PartitionNet {
 public:
  /// kWriters: the host's clients (writers and readers); kServers: the other servers; kEtcd.
  enum Kind { kWriters, kServers, kEtcd };

  static absl::StatusOr<std::unique_ptr<PartitionNet>> Make() {
    std::unique_ptr<PartitionNet> net(new PartitionNet(static_cast<int>(::getpid() % 240)));
    net->Cleanup();  // (what a crashed run with the same number left)
    std::string forward;
    (void)RunCommand("cat /proc/sys/net/ipv4/ip_forward", &forward);
    net->forward_was_ = forward.empty() ? "0" : forward.substr(0, 1);
    const std::string p = net->Ns(kPeers), c = net->Ns(kCut);
    std::vector<std::string> cmds = {
        "ip netns add " + p,
        "ip netns add " + c,
        "ip -n " + p + " link set lo up",
        "ip -n " + c + " link set lo up",
        absl::StrCat("ip link add ", net->Veth(kPeers, 'h'), " type veth peer name ",
                     net->Veth(kPeers, 'x'), " netns ", p),
        absl::StrCat("ip link add ", net->Veth(kCut, 'h'), " type veth peer name ",
                     net->Veth(kCut, 'x'), " netns ", c),
        absl::StrCat("ip addr add ", net->Net(kPeers, 1), "/24 dev ", net->Veth(kPeers, 'h')),
        absl::StrCat("ip addr add ", net->Net(kCut, 1), "/24 dev ", net->Veth(kCut, 'h')),
        absl::StrCat("ip addr add ", net->etcd_host(), "/32 dev lo"),
        absl::StrCat("ip -n ", c, " addr add ", net->cut_host(), "/24 dev ", net->Veth(kCut, 'x')),
    };
    for (int i = 0; i < 3; ++i) {
      cmds.push_back(absl::StrCat("ip -n ", p, " addr add ", net->peer_host(i), "/24 dev ",
                                  net->Veth(kPeers, 'x')));
    }
    for (Side k : {kPeers, kCut}) {
      cmds.push_back(absl::StrCat("ip link set ", net->Veth(k, 'h'), " up"));
      cmds.push_back(absl::StrCat("ip -n ", net->Ns(k), " link set ", net->Veth(k, 'x'), " up"));
      cmds.push_back(absl::StrCat("ip -n ", net->Ns(k), " route add default via ", net->Net(k, 1)));
    }
    cmds.push_back("echo 1 > /proc/sys/net/ipv4/ip_forward");
    for (const std::string& cmd : cmds) {
      std::string out;
      if (RunCommand(cmd, &out) != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot make the test's network (root and iproute2 needed): ", cmd, ": ", out));
      }
    }
    net->made_ = true;
    return net;
  }
  ~PartitionNet() {
    Cleanup();
    if (made_) {
      std::string out;
      (void)RunCommand("echo " + forward_was_ + " > /proc/sys/net/ipv4/ip_forward", &out);
    }
  }

  /// The namespaces to run servers in (`ip netns exec`).
  std::string peers_netns() const { return Ns(kPeers); }
  std::string cut_netns() const { return Ns(kCut); }
  /// Addresses: the other servers (i < 3), the server cut off, etcd's second address.
  std::string peer_host(int i) const { return Net(kPeers, 8 + i); }
  std::string cut_host() const { return Net(kCut, 2); }
  std::string etcd_host() const { return absl::StrCat("10.215.", k_, ".1"); }

  bool Cut(Kind kind) { return Rules(kind, "add"); }
  bool Heal(Kind kind) { return Rules(kind, "del"); }

  /// Whether a TCP connection opens, within 2 s, between the cut server's side and `kind`:
  /// from the host (kWriters) or the peers' namespace (kServers) to the cut server's `port`, or
  /// from the cut namespace to etcd's `port` (kEtcd). What a test checks its cut by.
  bool Reaches(Kind kind, int port) {
    const std::string probe =
        absl::StrCat("timeout 2 bash -c 'exec 3<>/dev/tcp/",
                     kind == kEtcd ? etcd_host() : cut_host(), "/", port, "'");
    std::string out;
    switch (kind) {
      case kWriters:
        return RunCommand(probe, &out) == 0;
      case kServers:
        return RunCommand("ip netns exec " + Ns(kPeers) + " " + probe, &out) == 0;
      case kEtcd:
        return RunCommand("ip netns exec " + Ns(kCut) + " " + probe, &out) == 0;
    }
    return false;
  }

 private:
  explicit PartitionNet(int k) : k_(k) {}

  // The two namespaces: the other servers', and the cut server's (whose veth's host end is
  // also what the host's clients reach it from).
  enum Side { kPeers, kCut };
  std::string Ns(Side side) const {
    return absl::StrCat(side == kPeers ? "sluice-peers" : "sluice-cut", k_);
  }
  std::string Veth(Side side, char end) const {
    return absl::StrCat(side == kPeers ? "sp" : "sw", k_, std::string(1, end));
  }
  std::string Net(Side side, int host) const {
    return absl::StrCat(side == kPeers ? "10.213." : "10.214.", k_, ".", host);
  }
  std::string Pref() const { return absl::StrCat(" pref ", 20000 + k_); }

  bool Rules(Kind kind, const char* verb) {
    const std::string cut = cut_host();
    std::string peer;  // whom the cut server no longer reaches
    switch (kind) {
      case kWriters:
        peer = Net(kCut, 1);
        break;  // (the host's source towards it)
      case kServers:
        peer = Net(kPeers, 8) + "/30";
        break;
      case kEtcd:
        peer = etcd_host();
        break;
    }
    const std::string cmds[] = {
        absl::StrCat("ip rule ", verb, " from ", peer, " to ", cut, Pref(), " blackhole"),
        absl::StrCat("ip rule ", verb, " from ", cut, " to ", peer, Pref(), " blackhole"),
        absl::StrCat("ip -n ", cut_netns(), " rule ", verb, " to ", peer, Pref(), " blackhole"),
    };
    bool ok = true;
    for (const std::string& cmd : cmds) {
      std::string out;
      ok = RunCommand(cmd, &out) == 0 && ok;
    }
    return ok;
  }

  void Cleanup() {
    std::string out;
    while (RunCommand("ip rule del" + Pref(), &out) == 0) {
    }
    for (Side k : {kPeers, kCut}) {
      (void)RunCommand("ip netns del " + Ns(k), &out);  // (their veth ends go, and their peers)
      (void)RunCommand("ip link del " + Veth(k, 'h'), &out);
    }
    (void)RunCommand(absl::StrCat("ip addr del ", etcd_host(), "/32 dev lo"), &out);
  }

  const int k_;
  std::string forward_was_ = "0";
  bool made_ = false;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_NETNS_H_
