#include "tests/helpers.hpp"

#include <cmath>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "qkv/analysis/ablate.hpp"
#include "qkv/analysis/across_training.hpp"
#include "qkv/training/run_analysis.hpp"
#include "qkv/report/ablate.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/analysis/logit_attribution.hpp"
#include "qkv/analysis/path_patching.hpp"
#include "qkv/analysis/patching.hpp"
#include "qkv/report/inspect.hpp"
#include "qkv/tasks/builtin.hpp"
#include "tests/training/short_run.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

// The induction model with two heads a layer, in float64, drawn from `seed`.
std::unique_ptr<nn::Transformer> induction_model(std::uint64_t seed) {
  nn::TransformerConfig c = default_options("induction").model;
  c.heads = 2;
  c.dtype = DType::float64;
  Generator gen(seed);
  return std::make_unique<nn::Transformer>(c, gen);
}

// Rows (or columns) [begin, end) of a Linear's weight set to 0.
void zero_weight(nn::Linear& linear, std::size_t begin, std::size_t end, bool columns) {
  Array<double>& w = linear.weight.mutable_value<double>();
  if (columns) xt::view(w, xt::all(), xt::range(begin, end)) = 0.0;
  else xt::view(w, xt::range(begin, end), xt::all()) = 0.0;
}

void check_same(const AblationScore& a, const AblationScore& b) {
  CHECK(a.accuracy == b.accuracy);
  CHECK(a.loss == Approx(b.loss).epsilon(1e-12));
}

}  // namespace

TEST_CASE("ablate: a zeroed head is its out_proj columns zeroed, and a head whose output is fixed by position mean-ablates to the clean model") {
  const InductionTask task;
  const std::size_t dv = 16;  // d_model 32, 2 heads
  // A random model whose layer-1 head 0 reads no token: W_v(0) = 0, so its values are v_proj's
  // bias at every position, and its output (attention weights summing to 1) is that bias.
  auto model = induction_model(3);
  zero_weight(*model->blocks[1]->attn.v_proj, 0, dv, false);
  const Ablation a = ablate(*model, task, std::nullopt, 4, 16, 7);
  REQUIRE(a.heads.size() == 4);
  CHECK(a.sequences == 64);
  CHECK_FALSE(a.corrupted);

  // Zeroing layer 0's head 1 by hook equals the clean run of a model whose out_proj never reads it.
  auto without = induction_model(3);
  zero_weight(*without->blocks[1]->attn.v_proj, 0, dv, false);
  zero_weight(*without->blocks[0]->attn.out_proj, dv, 2 * dv, true);
  const Ablation b = ablate(*without, task, std::nullopt, 4, 16, 7);
  check_same(a.heads[1].zero, b.clean);
  // The head mattered: without it the loss moved.
  CHECK(std::abs(a.heads[1].zero.loss - a.clean.loss) > 1e-4);

  // Layer 1's head 0 outputs its value bias everywhere: its mean at each position is that output.
  check_same(a.heads[2].mean, a.clean);
  CHECK(std::abs(a.heads[2].zero.loss - a.clean.loss) > 1e-4);  // zeroing the bias is not nothing
  // The clean run is qkv eval's on the same sequences.
  CHECK(a.clean.accuracy == evaluate(*model, task, 4, 16, 7).accuracy);
}

TEST_CASE("ablate: a corruption that changes nothing patches nothing, and the means leave the padding out") {
  auto model = induction_model(5);
  const InductionTask task;
  const Corruption same{.description = "none", .make = [](const Task&, const Batch& b, Generator&) { return b.tokens; }};
  const Ablation a = ablate(*model, task, same, 2, 8, 1);
  REQUIRE(a.corrupted);
  check_same(*a.corrupted, a.clean);
  for (const HeadAblation& h : a.heads) {
    REQUIRE(h.noised);
    REQUIRE(h.denoised);
    check_same(*h.noised, a.clean);
    check_same(*h.denoised, a.clean);
    CHECK_FALSE(h.noising_share);  // no gap to share
    CHECK_FALSE(h.denoising_share);
  }
  const nlohmann::json j = to_json(a);
  CHECK(j.at("corruption") == "none");
  CHECK(j.at("heads")[0].at("noising_share").is_null());

  // Brackets: padded rows, whose outputs the means leave out; by hand from the cache.
  Generator gen(2);
  TrainOptions o = default_options("brackets");
  o.model.dtype = DType::float64;
  nn::Transformer brackets(o.model, gen);
  const BracketsTask bt;
  REQUIRE(bt.info().pad);
  const std::vector<Array<double>> means = mean_head_outputs(brackets, bt, 3, 16, 4);
  Generator sequences = held_out_generator(4);
  std::vector<Array<double>> sum(2, Array<double>(xt::zeros<double>(means[0].shape()))), all_rows = sum;
  std::vector<double> count(o.model.max_len, 0);
  std::size_t rows = 0;
  for (int i = 0; i < 3; ++i) {
    const Batch b = bt.sample(16, sequences);
    const auto cache = brackets.run_with_cache(b.tokens, {}, key_padding(brackets, bt, b.tokens));
    rows += 16;
    for (std::size_t l = 0; l < 2; ++l) {
      const Array<double>& z = cache["blocks." + std::to_string(l) + ".attn.hook_z"].value<double>();
      for (std::size_t r = 0; r < 16; ++r)
        for (std::size_t t = 0; t < z.shape()[1]; ++t) {
          xt::view(all_rows[l], t) += xt::view(z, r, t);
          if (b.tokens(r, t) == *bt.info().pad) continue;
          xt::view(sum[l], t) += xt::view(z, r, t);
          count[t] += l == 0;
        }
    }
  }
  bool padding_mattered = false;
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t t = 0; t < o.model.max_len; ++t) {
      if (count[t] == 0) {
        CHECK(xt::amax(xt::abs(xt::view(means[l], t)))() == 0);
        continue;
      }
      const Array<double> want = xt::view(sum[l], t) / count[t];
      CHECK(xt::allclose(xt::view(means[l], t), want, 1e-12, 1e-14));
      padding_mattered = padding_mattered || !xt::allclose(xt::view(all_rows[l], t) / double(rows), want, 1e-6, 1e-9);
    }
  CHECK(padding_mattered);
  // No corruption: no patching. The pointer readout is the last layer's head-0 scores, which
  // its heads' outputs never reach: those heads are not ablated.
  const Ablation p = ablate(brackets, bt, std::nullopt, 1, 8, 4);
  REQUIRE(p.heads.size() == 4);
  CHECK(p.heads[0].read);
  CHECK(p.heads[0].noised == std::nullopt);
  CHECK_FALSE(p.heads[2].read);
  CHECK_FALSE(p.heads[3].needed);
  const nlohmann::json pj = to_json(p);
  CHECK(pj.at("corrupted").is_null());
  CHECK_FALSE(pj.at("heads")[3].contains("zero"));
  std::ostringstream table;
  print_ablation(table, p);
  CHECK_THAT(table.str(), Contains("L1H1    not read: the readout is this layer's head-0 scores"));
}

TEST_CASE("ablate: mean ablation puts each position's own mean in place of the head's output") {
  auto model = induction_model(9);
  const InductionTask task;
  const std::size_t batches = 3, size = 8, seed = 2, dv = 16;
  const Ablation a = ablate(*model, task, std::nullopt, batches, size, seed);
  const std::vector<Array<double>> means = mean_head_outputs(*model, task, batches, size, seed);
  // The means differ from position to position.
  CHECK(xt::amax(xt::abs(xt::view(means[1], 3) - xt::view(means[1], 9)))() > 1e-3);
  // Layer 1's head 1 by a hook of its own: z[b, t, 1, :] = means[1](t, 1, :).
  const nn::ForwardHook by_hand = [&](const Tensor& z, const std::string&) {
    Array<double> v = z.value<double>();
    for (std::size_t b = 0; b < v.shape()[0]; ++b)
      for (std::size_t t = 0; t < v.shape()[1]; ++t)
        for (std::size_t d = 0; d < dv; ++d) v(b, t, 1, d) = means[1](t, 1, d);
    return Tensor(v);
  };
  Generator gen = held_out_generator(seed);
  double loss = 0;
  MetricsSum right;
  for (std::size_t i = 0; i < batches; ++i) {
    const Batch b = task.sample(size, gen);
    const nn::TransformerOutput out = model->run_with_hooks(b.tokens, {{"blocks.1.attn.hook_z", by_hand}});
    const Metrics m = score(nn::Transformer::predictions(out.logits), b);
    loss += model->loss(out, b.targets).item() * double(m.scored);
    right.add(m);
  }
  CHECK(a.heads[3].mean.accuracy == right.result().accuracy);
  CHECK(a.heads[3].mean.loss == Approx(loss / double(right.result().scored)).epsilon(1e-12));
  CHECK(std::abs(a.heads[3].mean.loss - a.clean.loss) > 1e-4);
}

TEST_CASE("ablate and inspect on the default induction model: a previous-token head and an induction head, each needed, joined by K-composition") {
  TrainOptions o = default_options("induction");
  o.out = temp_folder("ablate_induction");
  o.keep_checkpoints = "log";
  std::filesystem::remove_all(o.out);
  std::ostringstream progress;
  train(o, progress, false);
  const auto model = load_model(o.out);
  const auto task = make_task("induction");
  REQUIRE(model->config().heads == 1);

  // What the attention patterns say: on a block repeated, layer 0 looks at the previous token
  // over the first copy (whose keys the induction head matches), layer 1, over the second, at the
  // token after the current token's earlier copy.
  const std::vector<std::int64_t> block = {7, 31, 2, 44, 19, 5, 38, 12, 26, 40, 11, 3};
  std::vector<std::int64_t> input = block;
  input.insert(input.end(), block.begin(), block.end());
  const Inspection in = inspect(*model, *task, input);
  const std::size_t n = block.size();
  double previous = 0, induction = 0;
  for (std::size_t t = 1; t < n; ++t) previous += in.layers[0][0].attention(t, t - 1) / double(n - 1);
  for (std::size_t t = n; t < 2 * n; ++t) induction += in.layers[1][0].attention(t, t - n + 1) / double(n);
  CHECK(previous > 0.6);
  CHECK(induction > 0.8);
  // The head detectors name the same roles, on the task's held-out sequences: L0H0 a previous-token
  // head, L1H0 an induction head. A score is the mean over all queries, so on a block repeated
  // twice an induction head's is at most 1/2 (the first copy's queries have no earlier copy to
  // read). On this one input, L0H0's previous-token score is the mean of the weights above over all
  // 2n queries (the first has no previous token).
  REQUIRE(in.detection_sequences > 0);
  CHECK(in.layers[0][0].detection.previous_token > 0.5);
  CHECK(in.layers[0][0].detection.previous_token > 4 * in.layers[0][0].detection.induction);
  CHECK(in.layers[1][0].detection.induction > 0.4);
  CHECK(in.layers[1][0].detection.induction > 4 * in.layers[1][0].detection.previous_token);
  double all_previous = 0;
  for (std::size_t t = 1; t < 2 * n; ++t) all_previous += in.layers[0][0].attention(t, t - 1) / double(2 * n);
  CHECK(detect_heads(*model, {input})[0].previous_token == Approx(all_previous).epsilon(1e-6));

  // Ablation names both heads; patching either from the corrupted input carries most of its loss.
  const Ablation a = ablate(*model, *task, task_spec("induction").corruption, 8, 32, 1);
  CHECK(a.clean.accuracy > 0.95);
  REQUIRE(a.corrupted);
  CHECK(a.corrupted->accuracy < 0.2);
  REQUIRE(a.heads.size() == 2);
  for (const HeadAblation& h : a.heads) {
    INFO("L" << h.layer << "H" << h.head);
    CHECK(h.needed);
    CHECK(h.zero.accuracy < 0.5);
    CHECK(h.mean.accuracy < 0.5);
    REQUIRE(h.noising_share);
    CHECK(*h.noising_share > 0.5);
  }
  // Denoising: the induction head's clean output alone restores the corrupted run (it carries the
  // answer); the previous-token head's does not (the induction head would read the corrupted
  // first copy's tokens after it).
  CHECK(*a.heads[1].denoising_share > 0.9);
  CHECK(*a.heads[0].denoising_share < 0.2);
  // Patching each head's z, all positions at once, is ablate's patching on the same sequences
  // (ablate's one batch of 64 from seed 1 is patch's): the same losses both ways.
  const Ablation one_batch = ablate(*model, *task, task_spec("induction").corruption, 1, 64, 1);
  for (const bool noising : {false, true}) {
    const Patching p = patch(*model, *task, *task_spec("induction").corruption,
                             {.component = PatchComponent::z, .by_position = false, .noising = noising, .sequences = 64});
    CHECK(p.clean.loss == Approx(one_batch.clean.loss).epsilon(1e-12));
    CHECK(p.corrupted.loss == Approx(one_batch.corrupted->loss).epsilon(1e-12));
    for (const HeadAblation& h : one_batch.heads) {
      INFO("L" << h.layer << "H" << h.head << (noising ? " noised" : " denoised"));
      const AblationScore& expected = noising ? *h.noised : *h.denoised;
      CHECK(p.patched[h.layer][h.head][0].loss == Approx(expected.loss).epsilon(1e-6));
      CHECK(p.patched[h.layer][h.head][0].accuracy == expected.accuracy);
      CHECK(p.loss_share(h.layer, h.head, 0) == Approx(noising ? *h.noising_share : *h.denoising_share).epsilon(1e-5));
    }
  }
  // Attribution patching against activation patching, each head's z at each position, denoising:
  // the first-order estimates follow the patched runs (Pearson correlation of the shares).
  {
    const PatchOptions by_position{.component = PatchComponent::z, .by_position = true, .noising = false, .sequences = 64};
    const Patching act = patch(*model, *task, *task_spec("induction").corruption, by_position);
    const Patching att = attribution_patch(*model, *task, *task_spec("induction").corruption, by_position);
    std::vector<double> x, y;
    for (std::size_t l = 0; l < 2; ++l)
      for (std::size_t t = 0; t < act.length; ++t) x.push_back(act.loss_share(l, 0, t)), y.push_back(att.loss_share(l, 0, t));
    const double n = double(x.size());
    const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n, my = std::accumulate(y.begin(), y.end(), 0.0) / n;
    double sxy = 0, sxx = 0, syy = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx), syy += (y[i] - my) * (y[i] - my);
    const double correlation = sxy / std::sqrt(sxx * syy);
    INFO("correlation " << correlation);
    CHECK(correlation >= 0.8);
  }
  const nlohmann::json j = to_json(a);
  CHECK(j.at("needed") == nlohmann::json({"L0H0", "L1H0"}));
  std::ostringstream table;
  print_ablation(table, a);
  CHECK_THAT(table.str(), Contains("The task needs L0H0, L1H0"));

  // The previous-token head writes into the induction head's keys: K-composition, well above
  // the 1/√d_model of unrelated directions and the Q- and V-composition of the same pair.
  REQUIRE(in.composition.size() == 1);
  const HeadComposition& c = in.composition[0];
  CHECK(c.k > 1 / std::sqrt(32.0) + 0.05);
  CHECK(c.k > 2 * c.q);
  CHECK(c.k > 2 * c.v);

  // Path patching says the same with the model run: of what L0H0's corrupted output brings into
  // the clean run (its z noised, as above), most reaches L1H0 through its keys alone, and nearly
  // none through its queries, its values or the logits straight.
  const Patching z_noised = patch(*model, *task, *task_spec("induction").corruption,
                                  {.component = PatchComponent::z, .noising = true, .sequences = 64});
  const PathPatching paths = path_patch(*model, *task, *task_spec("induction").corruption, {.noising = true, .sequences = 64});
  REQUIRE(paths.paths.size() == 5);  // L0H0 → logits, L1H0.q, .k, .v; L1H0 → logits
  const auto share = [&](std::size_t i) { return paths.loss_share(paths.paths[i]); };
  CHECK(paths.paths[2].input == "k");
  CHECK(share(2) > 0.8 * z_noised.loss_share(0, 0, 0));
  for (const std::size_t i : {0, 1, 3}) {
    INFO(paths.paths[i].input);
    CHECK(std::abs(share(i)) < 0.05);
  }
  CHECK(share(4) == Approx(z_noised.loss_share(1, 0, 0)).epsilon(1e-12));
  // And the induction head writes the answer: nearly all of the logit difference is its direct
  // part, next to none the previous-token head's.
  const LogitAttribution dla = logit_attribution(*model, *task, {.sequences = 64});
  CHECK(dla.heads[1][0] > 0.9 * dla.logit_diff);
  CHECK(std::abs(dla.heads[0][0]) < 0.05 * dla.logit_diff);

  // Across training: the last kept checkpoint is this model, measured on the same 64 sequences;
  // each head's role is the one named above, and the previous-token head, the induction head, their
  // K-composition and the in-context score form together, after step 0 and before the end.
  const AcrossTraining across = training::across_training_run(o.out);
  const CheckpointMeasures& now = across.checkpoints.back();
  CHECK(now.step == o.steps);
  CHECK(*now.heads[0][0].noising_share == z_noised.loss_share(0, 0, 0));
  CHECK(*now.heads[1][0].logit_attribution == dla.heads[1][0]);
  // The next-token loss late in the sequences (the second copy) falls to a fraction of its value at
  // init; early (the first copy, which the task never scores) it does not fall.
  const InContext& init_ic = *across.checkpoints.front().in_context;
  CHECK(std::abs(init_ic.score()) < 0.5);
  CHECK(now.in_context->late < 0.25 * init_ic.late);
  CHECK(now.in_context->early > init_ic.early);
  CHECK(now.in_context->score() < -3);
  CHECK(now.heads[1][0].prefix_matching > 0.5);
  const Formation formed = formation(across);
  REQUIRE(formed.heads.size() == 2);
  CHECK(formed.heads[0].role == HeadKind::previous_token);
  CHECK(formed.heads[1].role == HeadKind::induction);
  const std::vector<std::size_t> steps = {*formed.heads[0].step, *formed.heads[1].step, *formed.composition[0].step,
                                          *formed.in_context, *formed.loss};
  INFO("previous-token " << steps[0] << ", induction " << steps[1] << ", K-composition " << steps[2] << ", in-context "
                         << steps[3] << ", loss " << steps[4]);
  const auto [first, last] = std::minmax_element(steps.begin(), steps.end());
  CHECK(*first > 0);
  CHECK(*last < o.steps);
  CHECK(*last <= 2 * *first);  // within a factor of two of each other
  std::filesystem::remove_all(o.out);
}
