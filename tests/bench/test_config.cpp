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
  CHECK(bench::config_names() == std::vector<std::string>{"tiny", "small", "medium", "long", "longer", "wide"});
  // long: V 64, D 128, H 4, L 2, T 512, B 8, N = 4096. Per layer: QKV 2·4096·128·384 = 402,653,184;
  // Q Kᵀ and P V 2·(2·8·512·512·128) = 1,073,741,824; output 2·4096·128·128 = 134,217,728. Two
  // layers and the head 2·4096·128·64 = 67,108,864: 3,288,334,336 forward.
  CHECK(bench::step_flops(bench::config("long")) == 3.0 * 3288334336.0);
  // longer holds the same tokens, twice as long: the same projections, twice attention's work.
  CHECK(bench::step_flops(bench::config("longer")) == 3.0 * (3288334336.0 + 2 * 1073741824.0));
  CHECK_THROWS_WITH(bench::config("huge"), Catch::Matchers::Contains("unknown config 'huge'"));
}
