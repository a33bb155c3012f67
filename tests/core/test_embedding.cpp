#include "tests/helpers.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("embedding gathers rows by index") {
  const Tensor table = f64({{0, 1}, {10, 11}, {20, 21}});
  const Tensor y = embedding(table, IndexArray{{2, 0}, {1, 2}});
  REQUIRE(y.shape() == Shape{2, 2, 2});
  check_close(y, {{{20, 21}, {0, 1}}, {{10, 11}, {20, 21}}});
}

TEST_CASE("embedding's gradient scatter-adds into the rows read, repeats included") {
  Tensor table = f64({{0, 1}, {10, 11}, {20, 21}}, true);
  sum(embedding(table, IndexArray{2, 0, 2}) * f64({{1, 2}, {3, 4}, {5, 6}})).backward();
  check_close(table.grad(), {{3, 4}, {0, 0}, {6, 8}});
}

TEST_CASE("embedding errors name the index or the table's shape") {
  const Tensor table = zeros({3, 2}, DType::float64);
  CHECK(invalid_argument_message([&] { embedding(table, IndexArray{0, 3}); }) ==
        "embedding: index 3 at flat position 1 is out of range for a table of 3 rows");
  CHECK_THAT(invalid_argument_message([&] { embedding(table, IndexArray{-1}); }), Contains("index -1"));
  CHECK_THAT(invalid_argument_message([] { embedding(zeros({3}, DType::float64), IndexArray{0}); }),
             Contains("weight must be (V, D), got (3)"));
}
