// CRC-32C against the RFC 3720 (iSCSI) test vectors, both implementations.
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/crc32c.h"

namespace drt {
namespace {

TEST_CASE("crc32c matches the RFC 3720 vectors", "[crc32c]") {
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<uint8_t>(i);
    descending[i] = static_cast<uint8_t>(31 - i);
  }
  const std::string digits = "123456789";
  for (auto crc : {&Crc32c, &Crc32cPortable}) {
    REQUIRE(crc(zeros.data(), 32, 0) == 0x8A9136AAu);
    REQUIRE(crc(ones.data(), 32, 0) == 0x62A8AB43u);
    REQUIRE(crc(ascending.data(), 32, 0) == 0x46DD794Eu);
    REQUIRE(crc(descending.data(), 32, 0) == 0x113FDB5Cu);
    REQUIRE(crc(digits.data(), digits.size(), 0) == 0xE3069283u);
    // Continuing from a prefix gives the CRC of the whole.
    REQUIRE(crc(digits.data() + 4, 5, crc(digits.data(), 4, 0)) == 0xE3069283u);
  }
}

}  // namespace
}  // namespace drt
