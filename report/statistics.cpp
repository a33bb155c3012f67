#include "qkv/report/statistics.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "qkv/core/random.hpp"

namespace qkv::report {

Stats stats(const std::vector<double>& v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / double(v.size() - 1));
  }
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) throw std::invalid_argument("median: no values");
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::pair<double, double> wilson_interval(std::size_t k, std::size_t n) {
  if (k > n) throw std::invalid_argument(fmt::format("wilson_interval: {} of {} is more than all", k, n));
  if (n == 0) return {0, 1};
  const double z = 1.959963984540054, p = double(k) / double(n), N = double(n);
  const double centre = (p + z * z / (2 * N)) / (1 + z * z / N);
  const double half = z * std::sqrt(p * (1 - p) / N + z * z / (4 * N * N)) / (1 + z * z / N);
  // At k = 0 and k = n the bound is 0 or 1 exactly (centre ∓ half cancel; rounding would not).
  return {k == 0 ? 0.0 : std::max(0.0, centre - half), k == n ? 1.0 : std::min(1.0, centre + half)};
}

namespace {

// The q-quantile of sorted values, interpolated between the two nearest (numpy's default).
double quantile(const std::vector<double>& sorted, double q) {
  const double at = q * double(sorted.size() - 1);
  const std::size_t below = std::size_t(std::floor(at));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  return sorted[below] + (at - double(below)) * (sorted[above] - sorted[below]);
}

}  // namespace

std::pair<double, double> bootstrap_mean_interval(const std::vector<double>& values, std::size_t resamples,
                                                  std::uint64_t seed) {
  if (values.empty()) throw std::invalid_argument("bootstrap_mean_interval: no values");
  if (resamples == 0) throw std::invalid_argument("bootstrap_mean_interval: no resamples");
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  if (*low == *high) return {*low, *high};
  const std::size_t n = values.size();
  Generator gen(seed);
  std::vector<double> means(resamples);
  for (double& mean : means) {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += values[gen.next_u64() % n];  // n is tiny beside 2^64: no bias to speak of
    mean = sum / double(n);
  }
  std::sort(means.begin(), means.end());
  return {quantile(means, 0.025), quantile(means, 0.975)};
}

}  // namespace qkv::report
