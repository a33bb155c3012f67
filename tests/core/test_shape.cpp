#include "tests/helpers.hpp"

using namespace qkv;

TEST_CASE("parse_count reads decimal digits alone, up to 2^64 - 1") {
  CHECK(parse_count("0") == std::optional<std::size_t>(0));
  CHECK(parse_count("00000040") == std::optional<std::size_t>(40));
  CHECK(parse_count("18446744073709551615") == std::optional<std::size_t>(18446744073709551615ULL));
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "1x", "0x10", "1e3", "18446744073709551616"}) {
    INFO("'" << bad << "'");
    CHECK_FALSE(parse_count(bad));
  }
}
