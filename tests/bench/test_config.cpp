#include "tests/helpers.hpp"

#include "bench/config.hpp"

using namespace qkv;

TEST_CASE("the benchmark's FLOP count of a step, by hand for tiny") {
  // tiny: V 8, D 32, H 4, L 2, T 32, B 64, so N = B·T = 2048 rows. Per layer, as multiply-adds × 2:
  //   QKV projection 2·2048·32·96 = 12,582,912;  Q Kᵀ and P V 2·(2·64·32·32·32) = 8,388,608;
  //   output projection 2·2048·32·32 = 4,194,304;  together 25,165,824.
  // Forward: 2 layers + the head 2·2048·32·8 = 1,048,576 -> 51,380,224. Backward doubles it.
  CHECK(bench::step_flops(bench::config("tiny")) == 3.0 * 51380224);
  CHECK(bench::config("medium").D == 256);
  CHECK(bench::config_names() == std::vector<std::string>{"tiny", "small", "medium"});
  CHECK_THROWS_WITH(bench::config("huge"), Catch::Matchers::Contains("unknown config 'huge'"));
}
