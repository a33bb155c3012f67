#include "tests/helpers.hpp"

#include <limits>
#include <vector>

#include "core/detail/kernels.hpp"

using namespace qkv;

TEST_CASE("the vectorised exp is within 2 ulp of the correctly rounded e^x, 0 below -87.3") {
  double worst = 0;
  for (double x = -87.3; x <= 88.0; x += 0.0137) {
    const float xf = float(x);
    const double exact = std::exp(double(xf));  // double's exp, far more precise than float
    const double ulp = std::nextafter(float(exact), std::numeric_limits<float>::infinity()) - float(exact);
    worst = std::max(worst, std::abs(double(detail::vector_exp(xf)) - exact) / ulp);
  }
  INFO("worst error " << worst << " ulp");
  CHECK(worst < 2);
  CHECK(detail::vector_exp(-87.4f) == 0);
  CHECK(detail::vector_exp(-std::numeric_limits<float>::infinity()) == 0);
  CHECK(detail::vector_exp(0) == 1);
}

TEST_CASE("the row kernels against plain loops, on lengths around the 16 lanes") {
  for (std::size_t n : {1, 7, 16, 17, 33}) {
    INFO("n = " << n);
    std::vector<float> x(n), p(n), d(n);
    for (std::size_t j = 0; j < n; ++j) {
      x[j] = float(std::sin(1.3 * double(j)) * 4);
      p[j] = float(j + 1) / float(n * (n + 1) / 2);  // sums to 1
      d[j] = float(std::cos(0.7 * double(j)));
    }
    double max = -INFINITY, total = 0, c = 0;
    for (std::size_t j = 0; j < n; ++j) max = std::max(max, double(x[j]));
    CHECK(detail::max_of(x.data(), n) == float(max));

    std::vector<float> e = x;
    const float sum = detail::exp_shifted_sum(e.data(), n, float(max));
    for (std::size_t j = 0; j < n; ++j) {
      const double want = std::exp(double(x[j]) - max);
      total += want;
      CHECK(e[j] == Approx(want).epsilon(3e-7));
    }
    CHECK(sum == Approx(total).epsilon(1e-6));

    for (std::size_t j = 0; j < n; ++j) c += double(p[j]) * d[j];
    std::vector<float> g = d;
    detail::softmax_backward_row(p.data(), g.data(), n);
    for (std::size_t j = 0; j < n; ++j) CHECK(g[j] == Approx(p[j] * (d[j] - c)).margin(1e-6));

    detail::scale_by(e.data(), n, 0.5f);
    CHECK(e[0] * 2 == Approx(std::exp(double(x[0]) - max)).epsilon(3e-7));
  }
  CHECK(detail::max_of(nullptr, 0) == -std::numeric_limits<float>::infinity());
}
