#include "tests/helpers.hpp"

#include <sstream>

#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "qkv/analysis/alignment.hpp"
#include "qkv/report/alignment.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/memory.hpp"
#include "qkv/training/metrics_log.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/trainer.hpp"
#include "qkv/core/autograd.hpp"
#include "tests/training/short_run.hpp"

using namespace qkv;
using Catch::Matchers::Contains;
using qkv::test::invalid_argument_message;
using namespace qkv::test;

TEST_CASE("alignment scores by hand: the weight on the aligned positions, and whether the top one is aligned") {
  const Array<double> w = {{0.7, 0.3, 0.0}, {0.1, 0.4, 0.5}, {0.2, 0.2, 0.6}};
  const std::vector<std::vector<std::size_t>> one = {{0}, {1}}, two = {{0}, {1, 2}};
  CHECK(alignment_score(w, one) == Approx((0.7 + 0.4) / 2));
  CHECK(alignment_score(w, two) == Approx((0.7 + 0.9) / 2));  // the third row (the end token's) is not scored
  CHECK(top_aligned(w, one, 0));
  CHECK_FALSE(top_aligned(w, one, 1));  // 0.5 at position 2
  CHECK(top_aligned(w, two, 1));
  CHECK_THAT(invalid_argument_message([&] { alignment_score(w, {{0}, {3}}); }),
             Contains("output token 1 aligned with source position 3 of 3"));
  CHECK_THAT(invalid_argument_message([&] { alignment_score(w, {{0}, {0}, {0}, {0}}); }),
             Contains("weights of shape (3,3) for an alignment of 4 output tokens"));
}

namespace {

// A translate model trained briefly: its cross-attention aligns words already.
const nn::EncoderDecoder& translate_model() {
  static const auto model = [] {
    std::ostringstream quiet;
    TrainOptions o = default_options("translate");
    o.steps = 600;
    o.out = qkv::test::temp_folder("alignment_translate");
    std::filesystem::remove_all(o.out);
    train(o, quiet, false);
    auto m = load_encoder_decoder(o.out);
    std::filesystem::remove_all(o.out);
    return m;
  }();
  return *model;
}

}  // namespace

TEST_CASE("inspect on a translate model: its cross-attention points at the word each output word translates") {
  const TranslateTask task;
  const nn::EncoderDecoder& model = translate_model();
  const std::vector<std::int64_t> source = task.encode("big cat chases small mouse");
  const AlignmentInspection in = inspect_alignment(model, task, source, "run", 64, 3);
  CHECK(in.written == "ookii neko chiisai nezumi ou");
  CHECK(in.expected == in.written);
  CHECK(in.output_names == std::vector<std::string>{"ookii", "neko", "chiisai", "nezumi", "ou", "EOS"});
  CHECK(in.alignment == std::vector<std::vector<std::size_t>>{{0}, {1}, {3}, {4}, {2}});
  REQUIRE(in.layers.size() == 1);
  REQUIRE(in.layers[0].size() == 2);
  CHECK(in.any_head_top1[0] > 0.95);

  // Recomputed apart: the weights of one forward, and the held-out scores one source at a time
  // (no padding), from the sources qkv eval draws with the same seed.
  NoGradGuard no_grad;
  IndexArray src = IndexArray::from_shape({1, source.size()});
  std::copy(source.begin(), source.end(), src.begin());
  const IndexArray input = {{task.sides().start, 14, 0, 15, 5, 9}};  // BOS ookii neko chiisai nezumi ou
  const nn::EncoderDecoderOutput f = model.forward(src, input, true);
  Generator gen = held_out_generator(3);
  std::vector<Seq2SeqExample> examples;
  for (int i = 0; i < 64; ++i) examples.push_back(task.draw(gen));
  for (std::size_t h = 0; h < 2; ++h) {
    INFO("head " << h);
    const CrossHead& x = in.layers[0][h];
    const Array<double> w = xt::view(f.cross_attention[0].weights.to(DType::float64).value<double>(), 0, h);
    CHECK(xt::allclose(x.weights, w, 0, 1e-12));
    CHECK(*x.on_input == Approx((w(0, 0) + w(1, 1) + w(2, 3) + w(3, 4) + w(4, 2)) / 5).epsilon(1e-12));
    double score = 0, top = 0, tokens = 0;
    for (const Seq2SeqExample& e : examples) {
      const Batch b = task.batch({e});
      const Array<double> one = xt::view(model.forward(b.source, b.tokens, true).cross_attention[0].weights.to(DType::float64).value<double>(), 0, h);
      score += alignment_score(one, e.alignment) / 64;
      for (std::size_t t = 0; t < e.alignment.size(); ++t) top += top_aligned(one, e.alignment, t);
      tokens += double(e.alignment.size());
    }
    CHECK(x.held_out == Approx(score).epsilon(1e-5));
    CHECK(x.top1 == Approx(top / tokens).epsilon(1e-9));
    CHECK(x.sigma > 0.3);  // untied: far from the 1 of tied projections
    CHECK(x.sigma < 0.7);
  }
  // The heads together put the most weight on the aligned word for nearly every output word.
  CHECK(std::max(in.layers[0][0].top1, in.layers[0][1].top1) > 0.8);

  const nlohmann::json j = to_json(in);
  CHECK(j["task"] == "translate");
  CHECK(j["config"]["encoder_layers"] == 1);
  CHECK(j["cross_attention"].size() == 2);
  CHECK(j["cross_attention"][1]["alignment_held_out"] == in.layers[0][1].held_out);
  CHECK(j["cross_attention"][0]["weights"].size() == 6);
  CHECK(j["encoder_attention"][0][0].size() == 5);
  CHECK(j["decoder_attention"][0][1][0][1].is_null());  // masked: the decoder is causal
  CHECK(j["output"]["written"] == "ookii neko chiisai nezumi ou");

  std::ostringstream text;
  print_report(text, in, false);
  CHECK_THAT(text.str(), Contains("written: ookii neko chiisai nezumi ou  (right)") && Contains("L0H1 cross-attention"));
  const std::string html = to_html(in);
  CHECK(html.find("<h2>Training</h2>") == std::string::npos);  // no history read
  // With the run's metrics.jsonl, the page draws its training, as a decoder-only model's does.
  AlignmentInspection trained = in;
  trained.history.logged = {{10, 2.5, 0.2}, {20, 1.5, 0.6}, {30, 0.5, 0.9}};
  CHECK_THAT(to_html(trained), Contains("<h2>Training</h2>") && Contains(">loss and accuracy<"));
  // Each head's picture outlines the five aligned cells.
  std::size_t outlines = 0;
  for (std::size_t at = html.find("stroke=\"#1a9850\""); at != std::string::npos; at = html.find("stroke=\"#1a9850\"", at + 1)) ++outlines;
  CHECK(outlines == 2 * 5);
  CHECK(html.find("<script") == std::string::npos);
}

TEST_CASE("inspect on a source the task would not draw: the model's own output, no alignment to score") {
  const TranslateTask task;
  const AlignmentInspection in = inspect_alignment(translate_model(), task, task.encode("cat mouse"), "", 8);
  CHECK(in.expected.empty());
  CHECK(in.alignment.empty());
  CHECK_FALSE(in.layers[0][0].on_input);
  CHECK(in.output_names.back() == "EOS");
  CHECK(in.output_names.size() == in.output.size() + 1);
  CHECK_THAT(invalid_argument_message([&] { inspect_alignment(translate_model(), task, {}); }),
             Contains("the source holds no tokens"));
  CHECK_THAT(invalid_argument_message([&] { inspect_alignment(translate_model(), task, std::vector<std::int64_t>(6, 0)); }),
             Contains("the source holds 6 tokens, but the model has 5 source positions"));
  CHECK(typical_source(task).size() >= 4);
}
