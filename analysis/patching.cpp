#include "qkv/analysis/patching.hpp"

#include <cmath>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/analysis/detail/tally.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/tasks/evaluate.hpp"

namespace qkv::analysis {

const std::vector<PatchComponent>& patch_components() {
  static const std::vector<PatchComponent> all = {PatchComponent::resid_pre, PatchComponent::attn_out,
                                                  PatchComponent::resid_mid, PatchComponent::mlp_out,
                                                  PatchComponent::resid_post, PatchComponent::q,
                                                  PatchComponent::k,         PatchComponent::v,
                                                  PatchComponent::pattern,   PatchComponent::z};
  return all;
}

std::string patch_component_name(PatchComponent component) {
  switch (component) {
    case PatchComponent::resid_pre: return "resid_pre";
    case PatchComponent::attn_out: return "attn_out";
    case PatchComponent::resid_mid: return "resid_mid";
    case PatchComponent::mlp_out: return "mlp_out";
    case PatchComponent::resid_post: return "resid_post";
    case PatchComponent::q: return "q";
    case PatchComponent::k: return "k";
    case PatchComponent::v: return "v";
    case PatchComponent::pattern: return "pattern";
    case PatchComponent::z: return "z";
  }
  throw std::logic_error("patch_component_name: no such component");
}

PatchComponent patch_component(const std::string& name) {
  std::vector<std::string> names;
  for (PatchComponent c : patch_components()) {
    if (patch_component_name(c) == name) return c;
    names.push_back(patch_component_name(c));
  }
  throw std::invalid_argument(fmt::format("patch: no component '{}' (one of {})", name, fmt::join(names, ", ")));
}

bool per_head(PatchComponent c) {
  return c == PatchComponent::q || c == PatchComponent::k || c == PatchComponent::v || c == PatchComponent::pattern ||
         c == PatchComponent::z;
}

double Patching::share(double patched, double clean, double corrupted, bool noising) {
  if (clean == corrupted) return NAN;
  return noising ? (patched - clean) / (corrupted - clean) : (patched - corrupted) / (clean - corrupted);
}

double Patching::loss_share(std::size_t layer, std::size_t head, std::size_t position) const {
  return share(patched.at(layer).at(head).at(position).loss, clean.loss, corrupted.loss, direction == "noising");
}

namespace {

std::string hook_of(PatchComponent c, std::size_t layer) {
  const std::string name = patch_component_name(c);
  return per_head(c) ? fmt::format("blocks.{}.attn.hook_{}", layer, name) : fmt::format("blocks.{}.hook_{}", layer, name);
}

// The 0/1 mask of what a patch replaces in an activation of `shape` (batch first), broadcast over
// the batch (and, but for the pattern, over the last dimension): `head` (per-head components; the
// pattern's dimension 1, the others' dimension 2) and `position` (dimension 1; the pattern's query
// and key, position = query · T + key), or all positions when `position` is none.
Array<double> patch_mask(PatchComponent c, const Shape& shape, std::size_t head, std::optional<std::size_t> position) {
  Shape m = shape;
  m[0] = 1;
  if (c != PatchComponent::pattern) m.back() = 1;
  Array<double> mask = xt::zeros<double>(m);
  if (c == PatchComponent::pattern) {
    const std::size_t T = shape[3];
    for (std::size_t q = 0; q < shape[2]; ++q)
      for (std::size_t k = 0; k < T; ++k)
        if (!position || *position == q * T + k) mask(0, head, q, k) = 1;
  } else {
    for (std::size_t t = 0; t < shape[1]; ++t) {
      if (position && *position != t) continue;
      if (per_head(c)) mask(0, t, head, 0) = 1;
      else mask(0, t, 0) = 1;
    }
  }
  return mask;
}

PatchScore score_of(const detail::Tally& t) { return {t.accuracy(), t.loss(), t.logit_diff()}; }

}  // namespace

Patching patch(nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption,
               const PatchOptions& o) {
  const PatchComponent c = o.component;
  const std::size_t L = model.blocks.size();
  if ((c == PatchComponent::resid_mid || c == PatchComponent::mlp_out) && !model.blocks[0]->mlp)
    throw std::invalid_argument(fmt::format("patch: the component {} needs the MLP, and the model has none",
                                            patch_component_name(c)));
  if (o.sequences == 0) throw std::invalid_argument("patch: no sequences (sequences must be 1 or more)");
  NoGradGuard no_grad;
  const DType dtype = model.tok.weight.dtype();

  // The held-out sequences and their corruption, as ablate draws its first batch.
  Generator gen = tasks::held_out_generator(o.seed), corrupt_gen(tasks::held_out_generator(o.seed).next_u64());
  const tasks::Batch clean_batch = task.sample(o.sequences, gen);
  tasks::Batch corrupt_batch = clean_batch;  // scored on the clean targets
  corrupt_batch.tokens = corruption.make(task, clean_batch, corrupt_gen);
  const MaskArray clean_mask = tasks::key_padding(model, task, clean_batch.tokens, o.mask_padding);
  const MaskArray corrupt_mask = tasks::key_padding(model, task, corrupt_batch.tokens, o.mask_padding);

  std::vector<std::string> points;
  for (std::size_t l = 0; l < L; ++l) points.push_back(hook_of(c, l));
  const nn::ActivationCache clean_cache = model.run_with_cache(clean_batch.tokens, points, clean_mask);
  const nn::ActivationCache corrupt_cache = model.run_with_cache(corrupt_batch.tokens, points, corrupt_mask);
  detail::Tally clean, corrupted;
  clean.add(model, clean_cache.output, clean_batch, true);
  corrupted.add(model, corrupt_cache.output, clean_batch, true);

  Patching r;
  r.task = task.info().name;
  r.corruption = corruption.description;
  r.component = patch_component_name(c);
  r.direction = o.noising ? "noising" : "denoising";
  r.sequences = clean_batch.tokens.shape()[0];
  r.length = clean_batch.tokens.shape()[1];
  r.seed = o.seed;
  r.by_position = o.by_position;
  r.clean = score_of(clean);
  r.corrupted = score_of(corrupted);
  if (o.by_position)
    for (std::size_t t = 0; t < r.length; ++t) r.positions.push_back(task.token_name(clean_batch.tokens(0, t)));

  // Noising runs the clean tokens with the corrupted activations; denoising the other way round.
  const tasks::Batch& run_batch = o.noising ? clean_batch : corrupt_batch;
  const MaskArray& run_mask = o.noising ? clean_mask : corrupt_mask;
  const nn::ActivationCache& source = o.noising ? corrupt_cache : clean_cache;
  for (std::size_t l = 0; l < L; ++l) {
    const std::string point = hook_of(c, l);
    const Tensor& from = source[point];
    const Shape& shape = from.shape();
    const std::size_t heads = !per_head(c) ? 1 : c == PatchComponent::pattern ? shape[1] : shape[2];
    const std::size_t positions = !o.by_position ? 1 : c == PatchComponent::pattern ? r.length * r.length : r.length;
    r.patched.emplace_back(heads, std::vector<PatchScore>(positions));
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t p = 0; p < positions; ++p) {
        const Array<double> mask = patch_mask(c, shape, h, o.by_position ? std::optional(p) : std::nullopt);
        const Tensor take = Tensor(mask).to(dtype), keep = Tensor(Array<double>(1.0 - mask)).to(dtype);
        const nn::ForwardHook replace = [&](const Tensor& value, const std::string&) { return value * keep + from * take; };
        detail::Tally t;
        t.add(model, model.run_with_hooks(run_batch.tokens, {{point, replace}}, false, run_mask), clean_batch, true);
        r.patched[l][h][p] = score_of(t);
      }
  }
  return r;
}

}  // namespace qkv::analysis
