#include "tests/helpers.hpp"

#include <xtensor/xmanipulation.hpp>

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("reshape keeps row-major order and infers one -1") {
  const Tensor x = f64({{1, 2, 3}, {4, 5, 6}});
  check_close(reshape(x, {3, -1}), {{1, 2}, {3, 4}, {5, 6}});
  check_close(reshape(x, {-1}), {1, 2, 3, 4, 5, 6});
  CHECK(reshape(x, {1, 2, 1, 3}).shape() == Shape{1, 2, 1, 3});
}

TEST_CASE("reshape errors name the shapes") {
  const Tensor x = zeros({2, 3}, DType::float64);
  CHECK(invalid_argument_message([&] { reshape(x, {4, 2}); }) == "reshape: (2,3) has 6 elements; (4,2) has 8");
  CHECK_THAT(invalid_argument_message([&] { reshape(x, {-1, -1}); }), Contains("only one dimension may be -1"));
  CHECK_THAT(invalid_argument_message([&] { reshape(x, {4, -1}); }), Contains("cannot infer"));
}

TEST_CASE("permute and transpose move axes") {
  const Tensor x = f64({{{1, 2}, {3, 4}, {5, 6}}});  // (1,3,2)
  const Tensor p = permute(x, {2, 0, 1});
  REQUIRE(p.shape() == Shape{2, 1, 3});
  check_close(p, {{{1, 3, 5}}, {{2, 4, 6}}});
  check_close(transpose(f64({{1, 2, 3}, {4, 5, 6}}), 0, 1), {{1, 4}, {2, 5}, {3, 6}});
  CHECK(transpose(x, -1, 0).shape() == Shape{2, 3, 1});
  CHECK_THAT(invalid_argument_message([&] { permute(x, {0, 0, 1}); }), Contains("not a permutation"));
  CHECK_THAT(invalid_argument_message([&] { permute(x, {0, 1}); }), Contains("permute") && Contains("(1,3,2)"));
}

TEST_CASE("slice takes start to stop along one axis, and negative bounds count from the end") {
  const Tensor x = f64({{1, 2, 3, 4}, {5, 6, 7, 8}});
  check_close(slice(x, 1, 1, 3), {{2, 3}, {6, 7}});
  check_close(slice(x, -1, -2, 4), {{3, 4}, {7, 8}});
  check_close(slice(x, 0, 1, 2), {{5, 6, 7, 8}});
  CHECK(slice(x, 1, 2, 2).shape() == Shape{2, 0});
  CHECK(invalid_argument_message([&] { slice(x, 1, 2, 5); }) ==
        "slice: [2, 5) is out of bounds for axis 1 of size 4 in shape (2,4)");
}

TEST_CASE("slice's gradient lands in the sliced positions only") {
  Tensor x = f64({{1, 2, 3}, {4, 5, 6}}, true);
  sum(slice(x, 1, 1, 3) * f64({10, 20})).backward();
  check_close(x.grad(), {{0, 10, 20}, {0, 10, 20}});
}

TEST_CASE("concat joins along an axis and routes each gradient back") {
  Tensor a = f64(column({1, 2}), true), b = f64({{3, 4}, {5, 6}}, true);
  const Tensor y = concat({a, b}, 1);
  check_close(y, {{1, 3, 4}, {2, 5, 6}});
  sum(y * f64({1, 2, 3})).backward();
  check_close(a.grad(), column({1, 1}));
  check_close(b.grad(), {{2, 3}, {2, 3}});
  CHECK(invalid_argument_message([&] { concat({a, f64({{1, 2, 3}})}, 0); }) ==
        "concat: tensor 1 has shape (1,3) but tensor 0 has (2,1): all but axis 0 must match");
  CHECK_THAT(invalid_argument_message([] { concat({}, 0); }), Contains("no tensors"));
}

TEST_CASE("split cuts by size or by sizes") {
  const Tensor x = f64({1, 2, 3, 4, 5});
  const auto pieces = split(x, std::size_t(2), 0);
  REQUIRE(pieces.size() == 3);
  check_close(pieces[0], {1, 2});
  check_close(pieces[2], {5});
  const auto parts = split(x, std::vector<std::size_t>{1, 4}, 0);
  check_close(parts[1], {2, 3, 4, 5});
  CHECK(invalid_argument_message([&] { split(x, std::vector<std::size_t>{1, 2}, 0); }) ==
        "split: sizes (1,2) add up to 3 but axis 0 of shape (5) has 5");
}

TEST_CASE("an axis out of range names the op and the rank") {
  const Tensor x = zeros({2, 3}, DType::float64);
  CHECK(invalid_argument_message([&] { slice(x, 2, 0, 1); }) == "slice: axis 2 out of range for a tensor with 2 dimensions");
  CHECK_THAT(invalid_argument_message([&] { transpose(x, 0, -3); }), Contains("transpose: axis -3 out of range"));
  CHECK_THAT(invalid_argument_message([&] { concat({x, x}, 5); }), Contains("concat: axis 5 out of range"));
}

TEST_CASE("permute equals xtensor's transpose bit for bit, forward and backward, for every kind of permutation") {
  // Rows copied (last axis kept), matrices transposed (last two swapped), and the rest.
  const std::vector<std::vector<std::int64_t>> perms = {{0, 2, 1, 3}, {2, 0, 1, 3}, {0, 1, 3, 2}, {1, 0, 3, 2},
                                                        {3, 1, 2, 0}, {0, 1, 2, 3}};
  Generator gen(7);
  for (const DType dtype : {DType::float32, DType::float64})
    for (const auto& perm : perms) {
      INFO(fmt::format("{} ({})", dtype_name(dtype), fmt::join(perm, ",")));
      Tensor x = randn({2, 3, 4, 5}, dtype, gen);
      x.requires_grad_();
      const Tensor y = permute(x, perm);
      const Tensor g = randn(y.shape(), dtype, gen);
      sum(y * g).backward();
      std::vector<std::size_t> p(perm.begin(), perm.end()), inverse(4);
      for (std::size_t i = 0; i < 4; ++i) inverse[p[i]] = i;
      if (dtype == DType::float32) {
        const Array<float> expected = xt::transpose(x.value<float>(), p);
        CHECK(bool(y.value<float>() == expected));
        const Array<float> back = xt::transpose(g.value<float>(), inverse);
        CHECK(bool(x.grad().value<float>() == back));
      } else {
        const Array<double> expected = xt::transpose(x.value<double>(), p);
        CHECK(bool(y.value<double>() == expected));
        const Array<double> back = xt::transpose(g.value<double>(), inverse);
        CHECK(bool(x.grad().value<double>() == back));
      }
    }
  CHECK(permute(zeros({2, 0, 3}, DType::float32), {1, 0, 2}).shape() == Shape{0, 2, 3});
  CHECK(permute(zeros({2, 3, 0}, DType::float32), {0, 2, 1}).shape() == Shape{2, 0, 3});
}

TEST_CASE("reshape's gradient is d output in the input's shape") {
  Tensor x = f64({{1, 2, 3}, {4, 5, 6}}, true);
  sum(reshape(x, {3, 2}) * f64({{1, 2}, {3, 4}, {5, 6}})).backward();
  check_close(x.grad(), {{1, 2, 3}, {4, 5, 6}});
}
