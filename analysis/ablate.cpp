#include "qkv/analysis/ablate.hpp"

#include <fmt/format.h>
#include <xtensor/xview.hpp>

#include "qkv/analysis/detail/tally.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"

namespace qkv::analysis {

using namespace tasks;

namespace {

std::string z_point(std::size_t layer) { return fmt::format("blocks.{}.attn.hook_z", layer); }

bool is_z_point(const std::string& name) { return name.ends_with(".attn.hook_z"); }

// Accuracy and loss summed over batches.
struct Tally : detail::Tally {
  AblationScore result() const { return {accuracy(), loss()}; }
};

// Which of hook_z's heads (B, T, H, d_v) a hook keeps, and which it replaces: (1, 1, H, 1) masks.
struct HeadMask {
  Tensor keep, drop;
};

HeadMask head_mask(std::size_t n_heads, std::size_t h, DType dtype) {
  Array<double> keep = xt::ones<double>({std::size_t(1), std::size_t(1), n_heads, std::size_t(1)});
  keep(0, 0, h, 0) = 0;
  return {Tensor(keep).to(dtype), Tensor(Array<double>(1.0 - keep)).to(dtype)};
}

// A hook on hook_z that puts `fill` (broadcast to it; undefined: zeros) in place of the masked head.
nn::ForwardHook replace_head(const HeadMask& m, Tensor fill) {
  return [m, fill](const Tensor& z, const std::string&) { return fill.defined() ? z * m.keep + fill * m.drop : z * m.keep; };
}

// The sequences an ablation reads, visited batch by batch with their corrupted tokens (nullptr
// without a corruption); an ablation walks them twice, for the means and then the ablations.
using Visit = std::function<void(const Batch&, const IndexArray* corrupted)>;
using Walk = std::function<void(const Visit&)>;

std::vector<Array<double>> head_means(nn::Transformer& model, const Task& task, const Walk& walk, bool mask_padding) {
  NoGradGuard no_grad;
  const nn::TransformerConfig& config = model.config();
  const std::size_t L = model.blocks.size(), H = config.heads, dv = model.blocks[0]->attn.W_v(0).size(1);
  const auto pad = task.info().pad;
  std::vector<Array<double>> mean(L, Array<double>(xt::zeros<double>({config.max_len, H, dv})));
  std::vector<double> count(config.max_len, 0);
  walk([&](const Batch& b, const IndexArray*) {
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
  });
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t t = 0; t < config.max_len; ++t)
      if (count[t] > 0) xt::view(mean[l], t) /= count[t];
  return mean;
}

// Every head ablated on the sequences `walk` visits (twice: for the means, then for the ablations);
// with patching when `corruption` names the corruption its batches carry.
Ablation ablate_walk(nn::Transformer& model, const Task& task, const Walk& walk, const std::string& corruption,
                     bool mask_padding) {
  NoGradGuard no_grad;
  const std::size_t L = model.blocks.size(), H = model.config().heads, dv = model.blocks[0]->attn.W_v(0).size(1);
  const DType dtype = model.tok.weight.dtype();
  // A pointer model reads its last layer's head-0 scores, not any of that layer's outputs.
  const auto read = [&](std::size_t l) { return model.config().readout != nn::Readout::pointer || l + 1 < L; };
  const std::vector<Array<double>> mean = head_means(model, task, walk, mask_padding);
  std::vector<HeadMask> masks;  // made once, for every batch
  for (std::size_t h = 0; h < H; ++h) masks.push_back(head_mask(H, h, dtype));

  Tally clean, corrupted;
  std::vector<Tally> zero(L * H), mean_ablated(L * H), noised(L * H), denoised(L * H);
  std::size_t sequences = 0;
  walk([&](const Batch& b, const IndexArray* corrupt) {
    sequences += b.tokens.shape()[0];
    const std::size_t T = b.tokens.shape()[1];
    const MaskArray padding = key_padding(model, task, b.tokens, mask_padding);
    clean.add(model, model.forward(b.tokens, false, padding), b);  // as evaluate
    std::optional<nn::ActivationCache> clean_cache, corrupt_cache;
    const IndexArray& corrupt_tokens = corrupt ? *corrupt : b.tokens;
    MaskArray corrupt_padding;
    if (corrupt) {
      corrupt_padding = key_padding(model, task, corrupt_tokens, mask_padding);
      clean_cache = model.run_with_cache(b.tokens, is_z_point, padding);
      corrupt_cache = model.run_with_cache(corrupt_tokens, is_z_point, corrupt_padding);
      corrupted.add(model, corrupt_cache->output, b);
    }
    for (std::size_t l = 0; l < L; ++l) {
      if (!read(l)) continue;
      Array<double> mean_here = xt::view(mean[l], xt::range(0, T));
      mean_here.reshape({1, T, H, dv});
      const Tensor mean_z = Tensor(std::move(mean_here)).to(dtype);
      for (std::size_t h = 0; h < H; ++h) {
        const std::size_t at = l * H + h;
        const auto run = [&](const IndexArray& tokens, const MaskArray& mask, const Tensor& fill, Tally& into) {
          into.add(model, model.run_with_hooks(tokens, {{z_point(l), replace_head(masks[h], fill)}}, false, mask), b);
        };
        run(b.tokens, padding, Tensor(), zero[at]);
        run(b.tokens, padding, mean_z, mean_ablated[at]);
        if (corrupt) {
          run(b.tokens, padding, (*corrupt_cache)[z_point(l)], noised[at]);
          run(corrupt_tokens, corrupt_padding, (*clean_cache)[z_point(l)], denoised[at]);
        }
      }
    }
  });

  Ablation a;
  a.task = task.info().name;
  a.sequences = sequences;
  a.clean = clean.result();
  if (!corruption.empty()) {
    a.corruption = corruption;
    a.corrupted = corrupted.result();
  }
  const double gap = a.corrupted ? a.corrupted->loss - a.clean.loss : 0;
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t h = 0; h < H; ++h) {
      const std::size_t at = l * H + h;
      HeadAblation head;
      head.layer = l, head.head = h, head.read = read(l);
      if (head.read) {
        head.zero = zero[at].result(), head.mean = mean_ablated[at].result();
        head.needed = head.zero.accuracy < a.clean.accuracy / 2 && head.mean.accuracy < a.clean.accuracy / 2;
        if (!corruption.empty()) {
          head.noised = noised[at].result(), head.denoised = denoised[at].result();
          if (gap > 0) {
            head.noising_share = (head.noised->loss - a.clean.loss) / gap;
            head.denoising_share = (a.corrupted->loss - head.denoised->loss) / gap;
          }
        }
      }
      a.heads.push_back(head);
    }
  return a;
}

// The held-out sequences of `seed`, drawn afresh at each walk, with the corruption's tokens (from a
// stream of their own) when there is one.
Walk held_out(const Task& task, const std::optional<Corruption>& corruption, std::size_t batches, std::size_t batch_size,
              std::uint64_t seed) {
  return [&task, &corruption, batches, batch_size, seed](const Visit& visit) {
    Generator gen = held_out_generator(seed);
    Generator corrupt_gen(held_out_generator(seed).next_u64());
    for (std::size_t i = 0; i < batches; ++i) {
      const Batch b = task.sample_held_out(batch_size, gen);
      if (!corruption) {
        visit(b, nullptr);
        continue;
      }
      const IndexArray corrupt = corruption->make(task, b, corrupt_gen);
      visit(b, &corrupt);
    }
  };
}

Walk of_data(const Dataset& data) {
  return [&data](const Visit& visit) {
    for (std::size_t i = 0; i < data.batches.size(); ++i)
      visit(data.batches[i], data.corrupted.empty() ? nullptr : &data.corrupted[i]);
  };
}

}  // namespace

std::vector<Array<double>> mean_head_outputs(nn::Transformer& model, const Task& task, std::size_t batches,
                                             std::size_t batch_size, std::uint64_t seed, bool mask_padding) {
  return head_means(model, task, held_out(task, std::nullopt, batches, batch_size, seed), mask_padding);
}

Ablation ablate(nn::Transformer& model, const Task& task, const std::optional<Corruption>& corruption, std::size_t batches,
                std::size_t batch_size, std::uint64_t seed, bool mask_padding) {
  Ablation a = ablate_walk(model, task, held_out(task, corruption, batches, batch_size, seed),
                           corruption ? corruption->description : "", mask_padding);
  a.seed = seed;
  return a;
}

Ablation ablate(nn::Transformer& model, const Task& task, const Dataset& data, bool mask_padding) {
  Ablation a = ablate_walk(model, task, of_data(data), data.corruption, mask_padding);
  a.data = data.file;
  return a;
}

}  // namespace qkv::analysis
