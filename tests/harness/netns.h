// A network namespace for one server, made and removed by the test (docs/cluster.md, "Revive":
// partitions). Two veth pairs join it to the host: link A carries its clients and the other
// servers (the server listens on a_inside), link B carries etcd (etcd also answers on b_host).
// Taking a link's host end down cuts the server off from those peers alone, in both directions;
// up again heals it. Needs root and `ip` (iproute2): Make says why not.
//
//   ASSERT_OK_AND_ASSIGN(auto ns, ServerNetns::Make());
//   cluster->AddIn({ns->name(), ns->a_inside(), ns->b_host() + ":" + port});
//   ns->Cut(ServerNetns::kClients);  ...  ns->Heal(ServerNetns::kClients);
#ifndef SLUICE_TESTS_HARNESS_NETNS_H_
#define SLUICE_TESTS_HARNESS_NETNS_H_

#include <unistd.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/harness/run_command.h"

namespace sluice::testing {

class ServerNetns {
 public:
  enum Link { kClients, kEtcd };

  static absl::StatusOr<std::unique_ptr<ServerNetns>> Make() {
    std::unique_ptr<ServerNetns> ns(new ServerNetns(static_cast<int>(::getpid() % 120)));
    const std::string& n = ns->name_;
    const std::string cmds[] = {
        "ip netns add " + n,
        "ip -n " + n + " link set lo up",
        absl::StrCat("ip link add ", ns->Host(kClients), " type veth peer name ",
                     ns->Inside(kClients), " netns ", n),
        absl::StrCat("ip link add ", ns->Host(kEtcd), " type veth peer name ", ns->Inside(kEtcd),
                     " netns ", n),
        absl::StrCat("ip addr add ", ns->a_host(), "/24 dev ", ns->Host(kClients)),
        absl::StrCat("ip addr add ", ns->b_host(), "/24 dev ", ns->Host(kEtcd)),
        absl::StrCat("ip -n ", n, " addr add ", ns->a_inside(), "/24 dev ", ns->Inside(kClients)),
        absl::StrCat("ip -n ", n, " addr add ", ns->b_inside(), "/24 dev ", ns->Inside(kEtcd)),
        absl::StrCat("ip link set ", ns->Host(kClients), " up"),
        absl::StrCat("ip link set ", ns->Host(kEtcd), " up"),
        absl::StrCat("ip -n ", n, " link set ", ns->Inside(kClients), " up"),
        absl::StrCat("ip -n ", n, " link set ", ns->Inside(kEtcd), " up"),
    };
    for (const std::string& c : cmds) {
      std::string out;
      if (RunCommand(c, &out) != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot make a network namespace (root and iproute2 needed): ", c, ": ", out));
      }
    }
    return ns;
  }
  ~ServerNetns() {
    std::string out;
    (void)RunCommand("ip netns del " + name_, &out);  // (its veth ends go, and their peers)
    (void)RunCommand("ip link del " + Host(kClients), &out);
    (void)RunCommand("ip link del " + Host(kEtcd), &out);
  }

  const std::string& name() const { return name_; }
  std::string a_host() const { return absl::StrCat("10.213.", 2 * k_, ".1"); }
  std::string a_inside() const { return absl::StrCat("10.213.", 2 * k_, ".2"); }
  std::string b_host() const { return absl::StrCat("10.213.", 2 * k_ + 1, ".1"); }
  std::string b_inside() const { return absl::StrCat("10.213.", 2 * k_ + 1, ".2"); }

  /// The host end of `link` down: the server and those peers no longer reach each other.
  bool Cut(Link link) { return Set(link, "down"); }
  bool Heal(Link link) { return Set(link, "up"); }

 private:
  explicit ServerNetns(int k) : k_(k), name_(absl::StrCat("sluice-t", ::getpid())) {}
  std::string Host(Link link) const {
    return absl::StrCat(link == kClients ? "sa" : "sb", k_, "h");
  }
  std::string Inside(Link link) const {
    return absl::StrCat(link == kClients ? "sa" : "sb", k_, "x");
  }
  bool Set(Link link, const char* state) {
    std::string out;
    return RunCommand(absl::StrCat("ip link set ", Host(link), " ", state), &out) == 0;
  }

  const int k_;
  const std::string name_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_HARNESS_NETNS_H_
