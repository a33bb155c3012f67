// modadd: modular addition as Nanda et al. ("Progress measures for grokking via mechanistic
// interpretability", 2023) train it. Each example is "a b =" for a, b in 0 … p − 1, and the answer
// (a + b) mod p is read at "=": tokens 0 … p − 1 are the numbers and p is "=", and the readout's
// p + 1 classes are the tokens' (as the paper's unembedding). The p² pairs are shuffled by the
// run's seed and the first ⌊train_fraction · p²⌋ train; the rest are held out.
#include <numeric>

#include "qkv/tasks/builtin.hpp"

namespace qkv::tasks {

ModAddTask::ModAddTask(std::size_t p, double train_fraction, std::uint64_t seed) : p_(p) {
  if (p < 2) fail("modadd", "p is {}: it must be at least 2", p);
  const std::size_t pairs = p * p;
  const double train = std::floor(train_fraction * double(pairs));
  if (!(train >= 1 && train < double(pairs)))
    fail("modadd", "a train_fraction of {} leaves {} of the {} pairs to train on and {} held out: each needs at least one",
         train_fraction, train >= 0 ? train : 0, pairs, train >= 0 ? double(pairs) - train : double(pairs));
  const std::int64_t P = std::int64_t(p);
  info_ = {.name = "modadd",
           .description = fmt::format("a b = (a + b) mod {}: {:.0f} of the {} pairs train (full batch), the rest are "
                                      "held out",
                                      p, train, pairs),
           .vocab_size = p + 1, .n_classes = p + 1, .max_len = 3, .readout = nn::Readout::token, .causal = true};
  std::vector<std::size_t> order(pairs);
  std::iota(order.begin(), order.end(), 0);
  Generator gen(seed ^ 0x6d6f64616464ULL);  // a stream of its own: the model's weights draw from Generator(seed)
  for (std::size_t i = pairs - 1; i > 0; --i) std::swap(order[i], order[gen.next_u64() % (i + 1)]);
  Batch all{.tokens = IndexArray::from_shape({pairs, 3}), .targets = filled(pairs, 3, ignore_target)};
  for (std::size_t i = 0; i < pairs; ++i) {  // pair i is a = i / p, b = i mod p
    const std::int64_t a = std::int64_t(i) / P, b = std::int64_t(i) % P;
    all.tokens(i, 0) = a, all.tokens(i, 1) = b, all.tokens(i, 2) = P;
    all.targets(i, 2) = (a + b) % P;
  }
  const auto cut = order.begin() + std::ptrdiff_t(train);
  split_.train = select_rows(all, {order.begin(), cut});
  split_.test = select_rows(all, {cut, order.end()});
}

std::string ModAddTask::decode(const std::vector<std::int64_t>& tokens) const { return names_text(*this, tokens); }

std::vector<std::int64_t> ModAddTask::encode(const std::string& text) const {
  std::vector<std::int64_t> tokens;
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    if (w == "=") {
      tokens.push_back(std::int64_t(p_));
      continue;
    }
    const auto v = parse_count(w);
    if (!v || *v >= p_) fail("modadd", "cannot read '{}' in \"{}\": tokens are numbers 0-{} and =", w, text, p_ - 1);
    tokens.push_back(std::int64_t(*v));
  }
  return tokens;
}

std::string ModAddTask::token_name(std::int64_t token) const {
  return token == std::int64_t(p_) ? "=" : std::to_string(token);
}

TaskSpec modadd_task() {
  const auto make = [](std::size_t p, double fraction, std::uint64_t seed) {
    return std::make_unique<ModAddTask>(p, fraction, seed);
  };
  return {.name = "modadd",
          .make = [make](std::size_t p) { return make(p, 0.3, 0); },
          .default_size = 113,
          .min_size = 2,
          .max_size = 1000,
          .make_dataset = make,
          .train_fraction = 0.3,
          // The paper's model and training: one layer of 4 heads of 32, a ReLU MLP of 512, no
          // LayerNorm, weights drawn as its own; full-batch AdamW at lr 1e-3, weight decay 1,
          // betas (0.9, 0.98), 10 warmup steps and a constant rate after, no clipping.
          .defaults =
              [](TrainOptions& o) {
                o.model.layers = 1;
                o.model.d_model = 128;
                o.model.heads = 4;
                o.model.mlp = true;
                o.model.d_mlp = 512;
                o.model.activation = nn::Activation::relu;
                o.model.layer_norm = false;
                o.model.attention_bias = false;
                o.model.init = nn::Init::normal;
                o.batch = 0;
                o.lr = 1e-3;
                o.weight_decay = 1;
                o.beta2 = 0.98;
                o.warmup = 10;
                o.min_lr_ratio = 1;
                o.clip = 0;
                o.steps = 40000;
                o.log_every = 100;
                o.checkpoint_every = 2000;
              },
          .target = 0.99};
}

}  // namespace qkv::tasks
