#include "tests/helpers.hpp"

#include "qkv/optim/schedule.hpp"
#include "qkv/optim/sgd.hpp"

using namespace qkv;
using namespace qkv::optim;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("schedules give their closed-form learning rates") {
  CHECK(Schedule::constant(0.3).lr_at(1000) == 0.3);
  const Schedule warm = Schedule::linear_warmup(1.0, 4);
  for (auto [step, lr] : std::vector<std::pair<std::size_t, double>>{{0, 0.25}, {1, 0.5}, {3, 1.0}, {9, 1.0}})
    CHECK(warm.lr_at(step) == Approx(lr));
  // min + (max − min)(1 + cos(π s / S)) / 2 with max 1, min 0.1, S 10.
  const Schedule cosine = Schedule::cosine(1.0, 10, 0.1);
  CHECK(cosine.lr_at(0) == Approx(1.0));
  CHECK(cosine.lr_at(5) == Approx(0.55));
  CHECK(cosine.lr_at(10) == Approx(0.1));
  CHECK(cosine.lr_at(50) == Approx(0.1));
  CHECK(cosine.lr_at(2) == Approx(0.1 + 0.9 * (1 + std::cos(M_PI * 0.2)) / 2));
  // Warmup over 4 steps to 2, then the cosine over steps 4 … 12 down to 0.2.
  const Schedule both = Schedule::warmup_cosine(2.0, 4, 12, 0.2);
  CHECK(both.lr_at(0) == Approx(0.5));
  CHECK(both.lr_at(3) == Approx(2.0));
  CHECK(both.lr_at(4) == Approx(2.0));
  CHECK(both.lr_at(8) == Approx(1.1));
  CHECK(both.lr_at(12) == Approx(0.2));
}

TEST_CASE("a schedule drives an optimizer's learning rate") {
  SGD opt({f64({1.0}, true)}, {.lr = 1.0});
  Schedule::linear_warmup(0.8, 4).apply(opt, 1);
  CHECK(opt.lr() == Approx(0.4));
}

TEST_CASE("schedules reject impossible settings") {
  CHECK_THAT(invalid_argument_message([] { Schedule::warmup_cosine(1.0, 10, 10); }),
             Contains("total_steps 10 must exceed warmup_steps 10"));
  CHECK_THAT(invalid_argument_message([] { Schedule::cosine(1.0, 10, 2.0); }), Contains("min_lr 2 must be in [0, lr = 1]"));
  CHECK_THAT(invalid_argument_message([] { Schedule::linear_warmup(1.0, 0); }), Contains("warmup_steps must be positive"));
}
