#include "tests/helpers.hpp"

#include <nlohmann/json.hpp>

#include "qkv/core/autograd.hpp"
#include "qkv/sweep/measure.hpp"
#include "qkv/sweep/measurements.hpp"
#include "qkv/tasks/registry.hpp"

using namespace qkv;
using namespace qkv::sweep;

TEST_CASE("self_attention: uniform attention and queries of one length, by hand") {
  // Zero W_q and W_k: every score 0, so a causal query at position i spreads 1/(i+1) over the keys
  // it sees; its largest weight is the first key's (ties go to the earliest), never its own past
  // position 0. q = b_q alone: every query the same length, a spread of 0.
  const auto task = tasks::make_task("brackets");
  tasks::TrainOptions o = tasks::default_options("brackets");
  Generator gen(1);
  nn::Transformer m(o.model, gen);
  {
    NoGradGuard no_grad;
    for (const auto& block : m.blocks) {
      block->attn.q_proj->weight.mutable_value<float>().fill(0);
      block->attn.k_proj->weight.mutable_value<float>().fill(0);
      block->attn.k_proj->bias.mutable_value<float>().fill(0);
      block->attn.q_proj->bias.mutable_value<float>().fill(0.5f);
    }
  }
  const Sequences inputs = {{0, 1, 2, 3, 4}, {0, 1, 1, 2, 2, 3, 4}};
  nlohmann::ordered_json run;
  measurement("self_attention").extras.at_end(run, m, *task, inputs);
  // Per head and layer: queries 1..T-1 of each sequence, weight 1/(i+1) on themselves.
  double weight = 0;
  std::size_t queries = 0;
  for (const auto& s : inputs)
    for (std::size_t i = 1; i < s.size(); ++i) weight += 1.0 / double(i + 1), ++queries;
  CHECK(run["self_weight"].get<double>() == Approx(weight / double(queries)).epsilon(1e-6));
  CHECK(run["self_top"].get<double>() == 0.0);
  CHECK(run["query_length_cv"].get<double>() == Approx(0.0).margin(1e-6));
}

TEST_CASE("self_attention: a tied head whose queries differ in length puts a long query on itself") {
  // Tied: k_j = q_j, so s_ii = |q_i|² ≥ |q_i||q_j| ≥ s_ij whenever |q_i| ≥ |q_j|. In a
  // bidirectional layer the longest query of each head sees every key and scores itself highest:
  // at least one query of the 4 in each head has itself as its top key.
  tasks::TrainOptions o = tasks::default_options("rps");
  o.model.qk = nn::QK::tied;
  o.model.layers = 1;
  o.model.causal = false;
  Generator gen(2);
  nn::Transformer m(o.model, gen);
  const auto task = tasks::make_task("rps");
  const Sequences inputs = {{0, 1, 2, 3}};
  nlohmann::ordered_json run;
  measurement("self_attention").extras.at_end(run, m, *task, inputs);
  CHECK(run["self_top"].get<double>() >= 1.0 / 4.0);
  CHECK(run["query_length_cv"].get<double>() > 0);
  CHECK(run["self_weight"].get<double>() > 0);
  CHECK(run["self_weight"].get<double>() < 1);
}
