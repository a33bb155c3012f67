#include "tests/helpers.hpp"

#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>

#include "qkv/nn/gradcheck_cases.hpp"

using qkv::nn::gradcheck_cases;

TEST_CASE("every configuration in the gradcheck catalogue passes") {
  for (const auto& c : gradcheck_cases()) {
    DYNAMIC_SECTION(c.name) {
      const qkv::GradcheckResult r = c.run();
      INFO(r.failure);
      CHECK(r.passed);
      CHECK(r.checked > 0);
    }
  }
}

TEST_CASE("the gradcheck catalogue covers every op") {
  std::set<std::string> covered;
  for (const auto& c : gradcheck_cases()) covered.insert(c.op);
  for (const char* op : {"add", "sub", "mul", "div", "neg", "matmul", "reshape", "permute", "transpose", "slice",
                         "concat", "split", "sum", "mean", "max", "exp", "log", "sqrt", "pow", "tanh", "relu", "gelu",
                         "softmax", "log_softmax", "masked_fill", "cross_entropy", "embedding", "layer_norm",
                         "dropout", "cast"}) {
    INFO(op);
    CHECK(covered.count(op) == 1);
  }
}

TEST_CASE("docs/api.md prints the catalogue's count of checks") {
  std::ifstream in(QKV_SOURCE_DIR "/docs/api.md");
  REQUIRE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::smatch m;
  REQUIRE(std::regex_search(text, m, std::regex(R"(gradcheck: (\d+) passed, 0 failed)")));
  CHECK(std::stoul(m[1].str()) == gradcheck_cases().size());
}
