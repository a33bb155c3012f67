#include "tests/helpers.hpp"

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "examples/cli/ablate.hpp"
#include "examples/cli/inspect.hpp"
#include "examples/cli/tasks/tasks.hpp"
#include "tests/cli/short_run.hpp"

using namespace qkv;
using namespace qkv::cli;
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
    REQUIRE(h.patched);
    check_same(*h.patched, a.clean);
    CHECK_FALSE(h.patch_share);  // no gap to share
  }
  const nlohmann::json j = to_json(a);
  CHECK(j.at("corruption") == "none");
  CHECK(j.at("heads")[0].at("patch_share").is_null());

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
  const Ablation p = ablate(brackets, bt, std::nullopt, 1, 8, 4);
  CHECK(p.heads[0].patched == std::nullopt);
  CHECK(to_json(p).at("corrupted").is_null());
}

TEST_CASE("ablate and inspect on the default induction model: a previous-token head and an induction head, each needed, joined by K-composition") {
  TrainOptions o = default_options("induction");
  o.out = temp_folder("ablate_induction");
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
    REQUIRE(h.patch_share);
    CHECK(*h.patch_share > 0.5);
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
  std::filesystem::remove_all(o.out);
}
