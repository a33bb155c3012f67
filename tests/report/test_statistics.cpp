#include "tests/helpers.hpp"

#include <cmath>
#include <vector>

#include "qkv/core/random.hpp"
#include "qkv/report/statistics.hpp"

using namespace qkv;
using namespace qkv::report;

TEST_CASE("statistics: mean, sample sd and median by hand") {
  const Stats s = stats({1, 2, 4, 9});
  CHECK(s.n == 4);
  CHECK(s.mean == 4);
  CHECK(s.sd == Approx(std::sqrt((9 + 4 + 0 + 25) / 3.0)));
  CHECK(stats({5}).sd == 0);
  CHECK(stats({}).n == 0);
  CHECK(median({9, 1, 4}) == 4);
  CHECK(median({9, 1, 4, 2}) == 3);
  CHECK_THROWS_WITH(median({}), Catch::Contains("no values"));
}

TEST_CASE("statistics: the 95 percent Wilson interval of a count, by hand") {
  // (p + z²/2n ± z √(p(1−p)/n + z²/4n²)) / (1 + z²/n): 0 of 10 → 0–27.75%, 2 of 10 → 5.67–50.98%,
  // 10 of 10 → 72.25–100%, 15 of 30 → 33.15–66.85%.
  auto [lo, hi] = wilson_interval(0, 10);
  CHECK(lo == 0);
  CHECK(hi == Approx(0.27753).margin(5e-5));
  std::tie(lo, hi) = wilson_interval(2, 10);
  CHECK(lo == Approx(0.05668).margin(5e-5));
  CHECK(hi == Approx(0.50984).margin(5e-5));
  std::tie(lo, hi) = wilson_interval(10, 10);
  CHECK(lo == Approx(0.72247).margin(5e-5));
  CHECK(hi == 1);
  std::tie(lo, hi) = wilson_interval(15, 30);
  CHECK(lo == Approx(0.33153).margin(5e-5));
  CHECK(hi == Approx(0.66847).margin(5e-5));
  std::tie(lo, hi) = wilson_interval(0, 0);
  CHECK((lo == 0 && hi == 1));
  CHECK_THROWS_WITH(wilson_interval(3, 2), Catch::Contains("3 of 2 is more than all"));
}

TEST_CASE("statistics: the bootstrap interval of a mean against numpy's, and the same interval every time") {
  // 30 values ((37 i mod 30) / 29)²: numpy's percentile bootstrap of the mean with 400,000
  // resamples (default_rng(7)) gives 0.23199–0.45303; ours, with 10,000, lands within its Monte
  // Carlo error (about 0.0015 at each end).
  std::vector<double> v;
  for (int i = 0; i < 30; ++i) v.push_back(std::pow((i * 37 % 30) / 29.0, 2));
  const auto [lo, hi] = bootstrap_mean_interval(v);
  CHECK(lo == Approx(0.23199).margin(0.006));
  CHECK(hi == Approx(0.45303).margin(0.006));
  CHECK(bootstrap_mean_interval(v) == std::pair{lo, hi});  // the same draws
  CHECK(bootstrap_mean_interval(v, 10000, 1) != std::pair{lo, hi});  // another seed, other draws
  // Equal values: no spread to resample.
  CHECK(bootstrap_mean_interval({0.5, 0.5, 0.5}) == std::pair{0.5, 0.5});
  CHECK(bootstrap_mean_interval({2.0}) == std::pair{2.0, 2.0});
  CHECK_THROWS_WITH(bootstrap_mean_interval({}), Catch::Contains("no values"));
}

TEST_CASE("statistics: the bootstrap interval covers the true mean about 95 percent of the time") {
  // 400 samples of 30 from an exponential distribution of mean 1 (skewed, as accuracies near a
  // bound are): the percentile interval misses a little more than 5% on skewed data; with 400
  // trials a coverage below 88% or at 100% would be a broken interval.
  Generator gen(11);
  std::size_t covered = 0;
  const std::size_t trials = 400;
  for (std::size_t t = 0; t < trials; ++t) {
    std::vector<double> sample;
    for (int i = 0; i < 30; ++i) sample.push_back(-std::log(1.0 - gen.uniform()));
    const auto [lo, hi] = bootstrap_mean_interval(sample, 2000, t);
    covered += lo <= 1.0 && 1.0 <= hi;
  }
  CHECK(covered >= std::size_t(0.88 * trials));
  CHECK(covered < trials);
}
