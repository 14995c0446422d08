// The connection rule on its own (ConnectionGuard::Admit and Closed): no socket, descriptors are
// numbers. Its accept path and the daemon's shim run against real sockets in
// tests/server/connections_test.cc.
#include "server/net/connection_guard.h"

#include <gtest/gtest.h>
#include <netinet/in.h>

#include <string>

namespace sluice {
namespace {

using Refusal = ConnectionGuard::Refusal;

const std::string kA("\x0a\x00\x00\x01", 4);  // 10.0.0.1
const std::string kB("\x0a\x00\x00\x02", 4);  // 10.0.0.2

ConnectionLimits Limits(size_t total, size_t per_address, int descriptors = 1000) {
  ConnectionLimits l;
  l.max_connections = total;
  l.max_per_address = per_address;
  l.descriptor_limit = descriptors;
  l.descriptor_reserve = 64;
  return l;
}

TEST(ConnectionGuardTest, OneAddressIsHeldToItsShareAndOthersStillGetIn) {
  ConnectionGuard g(Limits(10, 3));
  EXPECT_FALSE(g.Admit(100, kA).has_value());
  EXPECT_FALSE(g.Admit(101, kA).has_value());
  EXPECT_FALSE(g.Admit(102, kA).has_value());
  EXPECT_EQ(g.Admit(103, kA), Refusal::kAddressLimit);
  EXPECT_FALSE(g.Admit(104, kB).has_value());
  EXPECT_EQ(g.open(), 4u);
  EXPECT_EQ(g.refused(Refusal::kAddressLimit), 1u);
  g.Closed(101);  // one of A's closes: A may have another
  EXPECT_FALSE(g.Admit(105, kA).has_value());
  g.Closed(101);  // (closed twice, or a descriptor that was never a connection: nothing)
  g.Closed(7);
  EXPECT_EQ(g.open(), 4u);
}

TEST(ConnectionGuardTest, TheServerLimitHoldsOverEveryAddress) {
  ConnectionGuard g(Limits(3, 3));
  EXPECT_FALSE(g.Admit(100, kA).has_value());
  EXPECT_FALSE(g.Admit(101, kB).has_value());
  EXPECT_FALSE(g.Admit(102, std::string("\x0a\x00\x00\x03", 4)).has_value());
  EXPECT_EQ(g.Admit(103, std::string("\x0a\x00\x00\x04", 4)), Refusal::kServerLimit);
  g.Closed(100);
  EXPECT_FALSE(g.Admit(103, std::string("\x0a\x00\x00\x04", 4)).has_value());
  EXPECT_EQ(g.open(), 3u);
  EXPECT_EQ(g.refused(Refusal::kServerLimit), 1u);
}

// Descriptors at the top of the limit stay free for the server's files and its listener.
TEST(ConnectionGuardTest, TheReservedDescriptorsAreNeverGivenToAConnection) {
  ConnectionGuard g(Limits(1000, 1000, /*descriptors=*/256));
  EXPECT_FALSE(g.Admit(191, kA).has_value());
  EXPECT_EQ(g.Admit(192, kA), Refusal::kDescriptors);
  EXPECT_EQ(g.Admit(5000, kA), Refusal::kDescriptors);
  EXPECT_EQ(g.Admit(-1, kA), Refusal::kDescriptors);
  EXPECT_EQ(g.refused(Refusal::kDescriptors), 3u);
}

// A descriptor closed where the guard did not see it (not through the shim), then accepted
// again: the connection it held is counted off, not leaked against its address.
TEST(ConnectionGuardTest, ADescriptorReusedUnseenIsCountedOnce) {
  ConnectionGuard g(Limits(10, 1));
  EXPECT_FALSE(g.Admit(100, kA).has_value());
  EXPECT_FALSE(g.Admit(100, kB).has_value());  // 100 was closed unseen, and is B's now
  EXPECT_EQ(g.open(), 1u);
  EXPECT_FALSE(g.Admit(101, kA).has_value()) << "A's old connection still counted";
  g.Closed(100);
  g.Closed(101);
  EXPECT_EQ(g.open(), 0u);
  EXPECT_FALSE(g.Admit(102, kB).has_value());
}

TEST(ConnectionGuardTest, PeersReadAsTheirAddresses) {
  EXPECT_EQ(PeerText(kA), "10.0.0.1");
  EXPECT_EQ(PeerText(""), "-");
  sockaddr_in6 mapped{};
  mapped.sin6_family = AF_INET6;
  mapped.sin6_addr.s6_addr[10] = 0xff;
  mapped.sin6_addr.s6_addr[11] = 0xff;
  mapped.sin6_addr.s6_addr[12] = 10;
  mapped.sin6_addr.s6_addr[15] = 1;
  EXPECT_EQ(PeerKey(reinterpret_cast<sockaddr*>(&mapped), sizeof(mapped)), kA)
      << "an IPv4-mapped peer is its IPv4 address";
}

}  // namespace
}  // namespace sluice
