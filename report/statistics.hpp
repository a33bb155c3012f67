#pragma once
// Statistics of runs over seeds, as the experiments' tables and the docs print them: mean and
// sample standard deviation, the median, a 95% Wilson interval for a count of runs, and a 95%
// percentile bootstrap interval for a mean.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace qkv::report {

struct Stats {
  double mean = 0, sd = 0;  // sd: sample standard deviation; 0 for one value
  std::size_t n = 0;
};
Stats stats(const std::vector<double>& values);

// The middle value (the mean of the two middle ones for an even count); std::invalid_argument
// when there is none.
double median(std::vector<double> values);

// The 95% Wilson score interval of a rate of k in n, as fractions; [0, 1] for n = 0;
// std::invalid_argument for k > n.
std::pair<double, double> wilson_interval(std::size_t k, std::size_t n);

// The 95% percentile bootstrap interval of the mean of `values`: the 2.5th and 97.5th percentiles
// (linearly interpolated) of the means of `resamples` resamples drawn with replacement. The draws
// come from a Generator seeded by `seed` alone, so the same values give the same interval.
// One value, or values all equal, give that value twice; std::invalid_argument for none.
std::pair<double, double> bootstrap_mean_interval(const std::vector<double>& values, std::size_t resamples = 10000,
                                                  std::uint64_t seed = 0);

}  // namespace qkv::report
