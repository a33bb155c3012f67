#include "tests/helpers.hpp"

#include <sstream>

#include <nlohmann/json.hpp>

#include "qkv/analysis/heads.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/report/inspect.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "tests/training/short_run.hpp"

using namespace qkv;
using namespace qkv::analysis;
using namespace qkv::tasks;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

// Causal weights spread evenly: row i puts 1/(i+1) on each key j ≤ i.
Array<double> uniform_causal(std::size_t T) {
  Array<double> w = xt::zeros<double>({T, T});
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j <= i; ++j) w(i, j) = 1.0 / double(i + 1);
  return w;
}

}  // namespace

TEST_CASE("head detectors: TransformerLens's patterns and scores, by hand") {
  // 1 2 1 2: the previous token at (1,0) (2,1) (3,2); earlier copies at (2,0) (3,1); the token
  // after an earlier copy at (2,1) (3,2), TransformerLens's duplicate pattern moved one key right.
  const std::vector<std::int64_t> tokens = {1, 2, 1, 2};
  check_close(detection_pattern(HeadKind::previous_token, tokens),
              shaped({0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}, {4, 4}), 0);
  check_close(detection_pattern(HeadKind::duplicate_token, tokens),
              shaped({0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0}, {4, 4}), 0);
  check_close(detection_pattern(HeadKind::induction, tokens),
              shaped({0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}, {4, 4}), 0);
  // 5 5: the token after the earlier copy of 5 is the query itself, on the diagonal.
  check_close(detection_pattern(HeadKind::induction, {5, 5}), shaped({0, 0, 0, 1}, {2, 2}), 0);

  // Even causal weights: previous (1/2 + 1/3 + 1/4) / 4 = 13/48; duplicate and induction
  // (1/3 + 1/4) / 4 = 7/48.
  const Array<double> w = uniform_causal(4);
  CHECK(detection_score(w, detection_pattern(HeadKind::previous_token, tokens)) == Approx(13.0 / 48).epsilon(1e-15));
  CHECK(detection_score(w, detection_pattern(HeadKind::duplicate_token, tokens)) == Approx(7.0 / 48).epsilon(1e-15));
  CHECK(detection_score(w, detection_pattern(HeadKind::induction, tokens)) == Approx(7.0 / 48).epsilon(1e-15));
  // Masked keys, drawn as NaN, hold no weight.
  Array<double> masked = w;
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = i + 1; j < 4; ++j) masked(i, j) = NAN;
  CHECK(detection_score(masked, detection_pattern(HeadKind::previous_token, tokens)) == Approx(13.0 / 48).epsilon(1e-15));

  CHECK_THROWS_WITH(detection_score(w, detection_pattern(HeadKind::previous_token, {1, 2, 3})),
                    Contains("weights 4×4 and pattern 3×3"));
  CHECK_THROWS_WITH(detection_score(Array<double>(xt::zeros<double>({2, 2})), detection_pattern(HeadKind::induction, {5, 5})),
                    Contains("no attention"));
  CHECK(head_kind_name(HeadKind::duplicate_token) == "duplicate_token");
}

TEST_CASE("head detectors: a model's scores are the mean over sequences of its attention on each pattern") {
  Generator gen(5);
  const InductionTask task;
  TrainOptions o = default_options("induction");
  o.model.heads = 2;
  o.model.dtype = DType::float64;
  const nn::Transformer model(o.model, gen);
  const std::vector<std::vector<std::int64_t>> sequences = {{3, 1, 4, 1, 5}, {2, 7, 2, 7, 2, 7}};
  const std::vector<HeadDetection> d = detect_heads(model, sequences);
  REQUIRE(d.size() == 4);
  CHECK(d[3].layer == 1);
  CHECK(d[3].head == 1);
  for (const HeadDetection& head : d) {
    INFO("L" << head.layer << "H" << head.head);
    for (HeadKind kind : all_head_kinds) {
      double expected = 0;
      for (const auto& s : sequences) {  // the weights from inspect, the pattern from a loop of its own
        const Array<double> w = inspect(model, task, s).layers[head.layer][head.head].attention;
        double on = 0;
        for (std::size_t i = 0; i < s.size(); ++i)
          for (std::size_t j = 0; j <= i; ++j) {
            const bool hit = kind == HeadKind::previous_token    ? j + 1 == i
                             : kind == HeadKind::duplicate_token ? j < i && s[j] == s[i]
                                                                 : j > 0 && s[j - 1] == s[i];
            on += hit ? w(i, j) : 0.0;
          }
        expected += on / double(s.size()) / double(sequences.size());
      }
      CHECK(head.score(kind) == Approx(expected).epsilon(1e-12));
    }
  }
  CHECK_THROWS_WITH(detect_heads(model, {{3}}), Contains("sequence 0 holds 1 tokens; it needs 2 to the model's"));
  CHECK_THROWS_WITH(detect_heads(model, {{3, 1}, {3, 99}}), Contains("sequence 1 holds token 99"));
  CHECK_THROWS_WITH(detect_heads(model, {}), Contains("no sequences"));
}

TEST_CASE("head detectors in inspect: the report, the JSON and the page") {
  Generator gen(6);
  const InductionTask task;
  const nn::Transformer model(default_options("induction").model, gen);
  const Inspection in = inspect(model, task, task.encode("3 1 4 1"), "runs/x");
  REQUIRE(in.detection_sequences == inspect_detection_sequences);
  const std::vector<HeadDetection> d = detect_heads(model, held_out_sequences(task, inspect_detection_sequences, 0));
  REQUIRE(d.size() == 2);
  CHECK(in.layers[1][0].detection.induction == d[1].induction);
  CHECK(in.layers[0][0].detection.previous_token == d[0].previous_token);
  const nlohmann::json j = nlohmann::json::parse(to_json(in).dump());
  CHECK(j.at("detection_sequences") == inspect_detection_sequences);
  CHECK(j.at("layers")[1].at("heads")[0].at("detectors").at("induction").get<double>() == d[1].induction);
  std::ostringstream report;
  print_report(report, in, false);
  CHECK_THAT(report.str(), Contains(fmt::format("L1H0   {:>8.3f}  {:>9.3f}  {:>9.3f}", d[1].previous_token,
                                                d[1].duplicate_token, d[1].induction)));
  CHECK_THAT(to_html(in), Contains("<h2>Head detectors</h2>"));
}
