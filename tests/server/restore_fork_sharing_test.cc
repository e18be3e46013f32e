// A restart restores each fork with its own copy of the chunks it shared in
// memory with its parent or siblings (review-serverfix F2): the store says
// how many restored sessions that is (RestoreReport::
// sessions_sharing_chunk_logs), so start-up can name the cause when the
// restored sessions pass the host budget (server/main.cc).
#include <string>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using testing::DurableServer;
using testing::FixtureModel;
using testing::RandomTokens;

TEST_CASE("start-up counts the restored forks that no longer share their chunks",
          "[state_store][memory][fork]") {
  drt::testing::TempDir dir;
  const int64_t chunk = FixtureModel::Get().chunk_size();
  std::string parent, first, second, alone, empty_parent, empty_fork;
  {
    DurableServer server(dir.path());
    parent = server.Create();
    server.Append(parent, RandomTokens(10 * chunk + 3, 61));
    first = server.Fork(parent);
    second = server.Fork(parent);
    server.Append(second, RandomTokens(2 * chunk, 62));
    alone = server.Create();
    server.Append(alone, RandomTokens(3 * chunk + 1, 63));
    // A fork of a session with no closed chunk shares no chunk log.
    empty_parent = server.Create();
    server.Append(empty_parent, RandomTokens(chunk / 2, 64));
    empty_fork = server.Fork(empty_parent);
  }
  {
    DurableServer server(dir.path());
    REQUIRE(server.Tokens().size() == 6);
    // The parent and its two forks; not the unrelated session nor the pair
    // without closed chunks.
    CHECK(server.report.sessions_sharing_chunk_logs == 3);
    // Each holds its chunks in full again: nothing is shared in memory.
    for (const std::string& id : {parent, first, second}) {
      auto entry = server.sessions->Find(id);
      REQUIRE(entry.ok());
      CHECK((*entry)->shared_bytes() == 0);
    }
    REQUIRE(server.sessions->Delete(parent).ok());
    REQUIRE(server.sessions->Delete(second).ok());
  }
  {
    // The first fork alone names its deleted parent's log: it shares with
    // no restored session.
    DurableServer server(dir.path());
    REQUIRE(server.Tokens().size() == 4);
    CHECK(server.report.sessions_sharing_chunk_logs == 0);
  }
}

}  // namespace
}  // namespace drt::server
