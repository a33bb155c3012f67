#include "examples/cli/ablate.hpp"

#include <ostream>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "examples/cli/train.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"

namespace qkv::cli {

namespace {

std::string z_point(std::size_t layer) { return fmt::format("blocks.{}.attn.hook_z", layer); }

bool is_z_point(const std::string& name) { return name.ends_with(".attn.hook_z"); }

// Accuracy and loss summed over batches.
struct Tally {
  Metrics metrics;
  double loss_sum = 0;

  void add(const nn::Transformer& model, const nn::TransformerOutput& out, const Batch& batch) {
    const Metrics m = score(nn::Transformer::predictions(out.logits), batch);
    if (m.scored > 0) loss_sum += model.loss(out, batch.targets).item() * double(m.scored);
    metrics += m;
  }
  AblationScore result() const {
    return {metrics.accuracy, metrics.scored ? loss_sum / double(metrics.scored) : 0};
  }
};

// A hook on hook_z (B, T, H, d_v) that puts `fill` (broadcast to it; undefined: zeros) in place of
// head h's output.
nn::ForwardHook replace_head(std::size_t n_heads, std::size_t h, DType dtype, Tensor fill) {
  Array<double> keep_mask = xt::ones<double>({std::size_t(1), std::size_t(1), n_heads, std::size_t(1)});
  keep_mask(0, 0, h, 0) = 0;
  const Tensor keep = Tensor(keep_mask).to(dtype), drop = Tensor(Array<double>(1.0 - keep_mask)).to(dtype);
  return [keep, drop, fill](const Tensor& z, const std::string&) {
    return fill.defined() ? z * keep + fill * drop : z * keep;
  };
}

}  // namespace

std::vector<Array<double>> mean_head_outputs(nn::Transformer& model, const Task& task, std::size_t batches,
                                             std::size_t batch_size, std::uint64_t seed, bool mask_padding) {
  NoGradGuard no_grad;
  const nn::TransformerConfig& config = model.config();
  const std::size_t L = model.blocks.size(), H = config.heads, dv = model.blocks[0]->attn.W_v(0).size(1);
  const auto pad = task.info().pad;
  std::vector<Array<double>> mean(L, Array<double>(xt::zeros<double>({config.max_len, H, dv})));
  std::vector<double> count(config.max_len, 0);
  Generator gen = held_out_generator(seed);
  for (std::size_t i = 0; i < batches; ++i) {
    const Batch b = task.sample(batch_size, gen);
    const nn::ActivationCache cache = model.run_with_cache(b.tokens, is_z_point, key_padding(model, task, b.tokens, mask_padding));
    for (std::size_t r = 0; r < b.tokens.shape()[0]; ++r)
      for (std::size_t t = 0; t < b.tokens.shape()[1]; ++t) count[t] += !(pad && b.tokens(r, t) == *pad);
    for (std::size_t l = 0; l < L; ++l) {
      const Tensor z = cache[z_point(l)].to(DType::float64);
      const Array<double>& zv = z.value<double>();
      for (std::size_t r = 0; r < zv.shape()[0]; ++r)
        for (std::size_t t = 0; t < zv.shape()[1]; ++t)
          if (!(pad && b.tokens(r, t) == *pad)) xt::view(mean[l], t) += xt::view(zv, r, t);
    }
  }
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t t = 0; t < config.max_len; ++t)
      if (count[t] > 0) xt::view(mean[l], t) /= count[t];
  return mean;
}

Ablation ablate(nn::Transformer& model, const Task& task, const std::optional<Corruption>& corruption, std::size_t batches,
                std::size_t batch_size, std::uint64_t seed, bool mask_padding) {
  NoGradGuard no_grad;
  const std::size_t L = model.blocks.size(), H = model.config().heads, dv = model.blocks[0]->attn.W_v(0).size(1);
  const DType dtype = model.tok.weight.dtype();
  const std::vector<Array<double>> mean = mean_head_outputs(model, task, batches, batch_size, seed, mask_padding);

  Tally clean, corrupted;
  std::vector<Tally> zero(L * H), mean_ablated(L * H), patched(L * H);
  Generator gen = held_out_generator(seed);  // the sequences of the means
  Generator corrupt_gen(held_out_generator(seed).next_u64());
  for (std::size_t i = 0; i < batches; ++i) {
    const Batch b = task.sample(batch_size, gen);
    const std::size_t T = b.tokens.shape()[1];
    const MaskArray padding = key_padding(model, task, b.tokens, mask_padding);
    clean.add(model, model.forward(b.tokens, false, padding), b);
    std::optional<nn::ActivationCache> corrupt_cache;
    if (corruption) {
      const IndexArray tokens = corruption->make(task, b, corrupt_gen);
      corrupt_cache = model.run_with_cache(tokens, is_z_point, key_padding(model, task, tokens, mask_padding));
      corrupted.add(model, corrupt_cache->output, b);
    }
    for (std::size_t l = 0; l < L; ++l) {
      Array<double> mean_here = xt::view(mean[l], xt::range(0, T));
      mean_here.reshape({1, T, H, dv});
      const Tensor mean_z = Tensor(std::move(mean_here)).to(dtype);
      for (std::size_t h = 0; h < H; ++h) {
        const auto run = [&](const Tensor& fill, Tally& into) {
          into.add(model, model.run_with_hooks(b.tokens, {{z_point(l), replace_head(H, h, dtype, fill)}}, false, padding), b);
        };
        run(Tensor(), zero[l * H + h]);
        run(mean_z, mean_ablated[l * H + h]);
        if (corrupt_cache) run((*corrupt_cache)[z_point(l)], patched[l * H + h]);
      }
    }
  }

  Ablation a;
  a.task = task.info().name;
  a.sequences = batches * batch_size;
  a.seed = seed;
  a.clean = clean.result();
  if (corruption) {
    a.corruption = corruption->description;
    a.corrupted = corrupted.result();
  }
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t h = 0; h < H; ++h) {
      HeadAblation head;
      head.layer = l, head.head = h;
      head.zero = zero[l * H + h].result(), head.mean = mean_ablated[l * H + h].result();
      if (corruption) {
        head.patched = patched[l * H + h].result();
        const double gap = a.corrupted->loss - a.clean.loss;
        if (gap > 0) head.patch_share = (head.patched->loss - a.clean.loss) / gap;
      }
      head.needed = head.zero.accuracy < a.clean.accuracy / 2 && head.mean.accuracy < a.clean.accuracy / 2;
      a.heads.push_back(head);
    }
  return a;
}

namespace {

std::string head_name(const HeadAblation& h) { return fmt::format("L{}H{}", h.layer, h.head); }

nlohmann::json score_json(const AblationScore& s) { return {{"accuracy", s.accuracy}, {"loss", s.loss}}; }

template <class T, class F>
nlohmann::json optional_json(const std::optional<T>& v, F&& to) {
  return v ? nlohmann::json(to(*v)) : nlohmann::json();
}

std::vector<std::string> needed_heads(const Ablation& a) {
  std::vector<std::string> names;
  for (const HeadAblation& h : a.heads)
    if (h.needed) names.push_back(head_name(h));
  return names;
}

}  // namespace

nlohmann::json to_json(const Ablation& a) {
  nlohmann::json heads = nlohmann::json::array();
  for (const HeadAblation& h : a.heads)
    heads.push_back({{"layer", h.layer}, {"head", h.head}, {"name", head_name(h)}, {"zero", score_json(h.zero)},
                     {"mean", score_json(h.mean)}, {"patched", optional_json(h.patched, score_json)},
                     {"patch_share", optional_json(h.patch_share, [](double v) { return v; })}, {"needed", h.needed}});
  return {{"task", a.task},
          {"dir", a.dir},
          {"sequences", a.sequences},
          {"seed", a.seed},
          {"clean", score_json(a.clean)},
          {"corruption", a.corruption.empty() ? nlohmann::json() : nlohmann::json(a.corruption)},
          {"corrupted", optional_json(a.corrupted, score_json)},
          {"heads", heads},
          {"needed", needed_heads(a)}};
}

void print_ablation(std::ostream& out, const Ablation& a) {
  const auto pct = [](double v) { return fmt::format("{:.1f}%", 100 * v); };
  fmt::print(out, "{}: {} held-out sequences of {} (seed {})\n", a.dir.empty() ? a.task : a.dir, a.sequences, a.task,
             a.seed);
  fmt::print(out, "clean:      accuracy {:>6}  loss {:.4f}\n", pct(a.clean.accuracy), a.clean.loss);
  if (a.corrupted)
    fmt::print(out, "corrupted:  accuracy {:>6}  loss {:.4f}  ({}; scored on the clean answers)\n",
               pct(a.corrupted->accuracy), a.corrupted->loss, a.corruption);
  fmt::print(out, "\n{:<6}{:^18}{:^18}", "", "zero-ablated", "mean-ablated");
  if (a.corrupted) fmt::print(out, "{:^28}", "patched from corrupted");
  fmt::print(out, "\n{:<6}{:>9}{:>9}{:>9}{:>9}", "head", "accuracy", "loss", "accuracy", "loss");
  if (a.corrupted) fmt::print(out, "{:>9}{:>9}{:>10}", "accuracy", "loss", "of gap");
  fmt::print(out, "\n");
  for (const HeadAblation& h : a.heads) {
    fmt::print(out, "{:<6}{:>9}{:>9.4f}{:>9}{:>9.4f}", head_name(h), pct(h.zero.accuracy), h.zero.loss,
               pct(h.mean.accuracy), h.mean.loss);
    if (h.patched)
      fmt::print(out, "{:>9}{:>9.4f}{:>10}", pct(h.patched->accuracy), h.patched->loss,
                 h.patch_share ? pct(*h.patch_share) : "-");
    fmt::print(out, "{}\n", h.needed ? "  needed" : "");
  }
  const auto needed = needed_heads(a);
  fmt::print(out, "\n{}: zero- and mean-ablated, accuracy below half the clean accuracy.\n",
             needed.empty() ? "No head is needed alone" : fmt::format("The task needs {}", fmt::join(needed, ", ")));
  if (a.corrupted)
    fmt::print(out,
               "Patched: the head's output from the corrupted input, the rest of the model on the clean one; "
               "\"of gap\": the share of the corrupted input's extra loss it brings.\n");
}

}  // namespace qkv::cli
