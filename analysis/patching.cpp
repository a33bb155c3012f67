#include "qkv/analysis/patching.hpp"

#include <cmath>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/analysis/detail/tally.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include <xtensor/xreducer.hpp>
#include <xtensor/xview.hpp>
#include "qkv/tasks/evaluate.hpp"

namespace qkv::analysis {

const char* name_of(PatchComponent component) {
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
  throw std::logic_error("name_of: no such patch component");
}

PatchComponent patch_component(const std::string& name) {
  if (const auto c = nn::from_name(all_patch_components, name)) return *c;
  throw std::invalid_argument(
      fmt::format("patch: no component '{}' (one of {})", name, fmt::join(nn::names_of(all_patch_components), ", ")));
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

// The sum of `summed` (an activation's shape, the batch and, but for the pattern, the features
// summed to 1) over the cells patch_mask covers for `head` and `position`, read in place.
double covered_sum(PatchComponent c, const Array<double>& summed, std::size_t head, std::optional<std::size_t> position) {
  if (c == PatchComponent::pattern) {
    const std::size_t T = summed.shape()[3];
    return position ? summed(0, head, *position / T, *position % T) : xt::sum(xt::view(summed, 0, head))();
  }
  if (per_head(c)) return position ? summed(0, *position, head, 0) : xt::sum(xt::view(summed, 0, xt::all(), head))();
  return position ? summed(0, *position, 0) : xt::sum(summed)();
}

PatchScore score_of(const detail::Tally& t) { return {t.accuracy(), t.loss(), t.logit_diff()}; }

}  // namespace

namespace {

// What patch and attribution_patch share: the checks, the clean batch and its corruption (as
// ablate draws its first batch) with their padding masks, the component's point in each layer,
// and the result's header.
struct Setup : PatchPair {
  std::vector<std::string> points;
  Patching result;
};

Setup prepare(const nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption, const PatchOptions& o) {
  const PatchComponent c = o.component;
  if ((c == PatchComponent::resid_mid || c == PatchComponent::mlp_out) && !model.blocks[0]->mlp)
    throw std::invalid_argument(fmt::format("patch: the component {} needs the MLP, and the model has none",
                                            patch_component_name(c)));
  Setup s{patch_pair(model, task, corruption, o.sequences, o.seed, o.mask_padding), {}, {}};
  for (std::size_t l = 0; l < model.blocks.size(); ++l) s.points.push_back(hook_of(c, l));
  Patching& r = s.result;
  r.task = task.info().name;
  r.corruption = corruption.description;
  r.component = patch_component_name(c);
  r.direction = o.noising ? "noising" : "denoising";
  r.sequences = s.clean.tokens.shape()[0];
  r.length = s.clean.tokens.shape()[1];
  r.seed = o.seed;
  r.by_position = o.by_position;
  if (o.by_position)
    for (std::size_t t = 0; t < r.length; ++t) r.positions.push_back(task.token_name(s.clean.tokens(0, t)));
  return s;
}


// The heads and positions of a layer's activation of `shape` for the component: (heads, positions).
std::pair<std::size_t, std::size_t> extent(PatchComponent c, const Shape& shape, bool by_position, std::size_t length) {
  const std::size_t heads = !per_head(c) ? 1 : c == PatchComponent::pattern ? shape[1] : shape[2];
  const std::size_t positions = !by_position ? 1 : c == PatchComponent::pattern ? length * length : length;
  return {heads, positions};
}

// The parameters' gradients as they were when it was made, put back when it goes: a backward
// through the model accumulates into them, and none of that may stay.
class KeepParameterGradients {
 public:
  explicit KeepParameterGradients(const nn::Module& model) {
    for (const Tensor& p : model.parameters())
      if (p.requires_grad()) {
        const Tensor g = p.grad();
        kept_.push_back({p, g.defined() ? std::optional(Tensor(g.to(DType::float64).value<double>())) : std::nullopt});
      }
  }
  ~KeepParameterGradients() {
    for (auto& [p, g] : kept_) {
      if (!g) p.zero_grad();
      else if (Tensor now = p.grad(); now.defined()) now.copy_(*g);
    }
  }
  KeepParameterGradients(const KeepParameterGradients&) = delete;
  KeepParameterGradients& operator=(const KeepParameterGradients&) = delete;

 private:
  std::vector<std::pair<Tensor, std::optional<Tensor>>> kept_;
};

}  // namespace

HeldOutBatch held_out_batch(const nn::Transformer& model, const tasks::Task& task, std::size_t sequences, std::uint64_t seed,
                            bool mask_padding, const char* op) {
  if (sequences == 0 || sequences > max_patch_sequences)
    throw std::invalid_argument(
        fmt::format("{}: {} held-out sequences (1 to {}: they are one batch)", op, sequences, max_patch_sequences));
  Generator gen = tasks::held_out_generator(seed);
  HeldOutBatch h{task.sample_held_out(sequences, gen), {}};
  h.mask = tasks::key_padding(model, task, h.batch.tokens, mask_padding);
  return h;
}

PatchPair patch_pair(const nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption,
                     std::size_t sequences, std::uint64_t seed, bool mask_padding) {
  HeldOutBatch clean = held_out_batch(model, task, sequences, seed, mask_padding, "patch");
  PatchPair s;
  Generator corrupt_gen(tasks::held_out_generator(seed).next_u64());
  s.clean = std::move(clean.batch);
  s.clean_mask = std::move(clean.mask);
  s.corrupt = s.clean;
  s.corrupt.tokens = corruption.make(task, s.clean, corrupt_gen);
  s.corrupt_mask = tasks::key_padding(model, task, s.corrupt.tokens, mask_padding);
  return s;
}

PatchScore score_patch(const nn::Transformer& model, const nn::TransformerOutput& out, const tasks::Batch& batch) {
  detail::Tally t;
  t.add(model, out, batch, true);
  return score_of(t);
}

ActivationGradients run_with_gradients(nn::Transformer& model, const IndexArray& tokens, const std::vector<std::string>& points,
                                       const std::function<Tensor(const nn::TransformerOutput&)>& scalar,
                                       const MaskArray& key_padding) {
  if (!is_grad_enabled()) throw std::logic_error("run_with_gradients: gradients are disabled (a NoGradGuard is alive)");
  const KeepParameterGradients kept(model);
  // Each point's value goes on as value + 0, the 0 a leaf whose gradient is the value's.
  std::vector<Tensor> zeros(points.size());
  ActivationGradients out;
  nn::NamedHooks hooks;
  for (std::size_t i = 0; i < points.size(); ++i)
    hooks.emplace_back(points[i], [&, i](const Tensor& value, const std::string& name) {
      out.activations.activations.emplace_back(name, value.detach());
      Array<double> zero = xt::zeros<double>(value.shape());
      zeros[i] = Tensor(zero).to(value.dtype());
      zeros[i].requires_grad_(true);
      return value + zeros[i];
    });
  out.output = model.run_with_hooks(tokens, hooks, false, key_padding);
  scalar(out.output).backward();
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (!zeros[i].defined()) throw std::logic_error(fmt::format("run_with_gradients: the forward did not reach {}", points[i]));
    const Tensor g = zeros[i].grad();
    out.gradients.activations.emplace_back(points[i], g.defined() ? g.detach() : Tensor(Array<double>(xt::zeros<double>(zeros[i].shape()))).to(zeros[i].dtype()));
  }
  return out;
}

Patching patch(nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption, const PatchOptions& o) {
  Setup s = prepare(model, task, corruption, o);
  Patching& r = s.result;
  NoGradGuard no_grad;
  const DType dtype = model.tok.weight.dtype();
  const nn::ActivationCache clean_cache = model.run_with_cache(s.clean.tokens, s.points, s.clean_mask);
  const nn::ActivationCache corrupt_cache = model.run_with_cache(s.corrupt.tokens, s.points, s.corrupt_mask);
  r.clean = score_patch(model, clean_cache.output, s.clean);
  r.corrupted = score_patch(model, corrupt_cache.output, s.clean);

  // Noising runs the clean tokens with the corrupted activations; denoising the other way round.
  const tasks::Batch& run_batch = o.noising ? s.clean : s.corrupt;
  const MaskArray& run_mask = o.noising ? s.clean_mask : s.corrupt_mask;
  const nn::ActivationCache& source = o.noising ? corrupt_cache : clean_cache;
  for (const std::string& point : s.points) {
    const Tensor& from = source[point];
    const auto [heads, positions] = extent(o.component, from.shape(), o.by_position, r.length);
    r.patched.emplace_back(heads, std::vector<PatchScore>(positions));
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t p = 0; p < positions; ++p) {
        const Array<double> mask = patch_mask(o.component, from.shape(), h, o.by_position ? std::optional(p) : std::nullopt);
        const Tensor take = Tensor(mask).to(dtype), keep = Tensor(Array<double>(1.0 - mask)).to(dtype);
        const nn::ForwardHook replace = [&](const Tensor& value, const std::string&) { return value * keep + from * take; };
        r.patched.back()[h][p] = score_patch(model, model.run_with_hooks(run_batch.tokens, {{point, replace}}, false, run_mask), s.clean);
      }
  }
  return r;
}

Patching attribution_patch(nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption,
                           const PatchOptions& o) {
  Setup s = prepare(model, task, corruption, o);
  Patching& r = s.result;
  r.attribution = true;
  // Denoising estimates the corrupted run with clean activations, from the corrupted run's
  // gradient; noising the other way round. The source run needs its activations alone.
  const auto loss = [&](const nn::TransformerOutput& out) { return model.loss(out, s.clean.targets); };
  const ActivationGradients run = o.noising ? run_with_gradients(model, s.clean.tokens, s.points, loss, s.clean_mask)
                                            : run_with_gradients(model, s.corrupt.tokens, s.points, loss, s.corrupt_mask);
  NoGradGuard no_grad;
  const nn::ActivationCache source = o.noising ? model.run_with_cache(s.corrupt.tokens, s.points, s.corrupt_mask)
                                               : model.run_with_cache(s.clean.tokens, s.points, s.clean_mask);
  r.clean = score_patch(model, o.noising ? run.output : source.output, s.clean);
  r.corrupted = score_patch(model, o.noising ? source.output : run.output, s.clean);
  const double base = o.noising ? r.clean.loss : r.corrupted.loss;
  for (const std::string& point : s.points) {
    const Array<double> from = source[point].to(DType::float64).value<double>();
    const Array<double> here = run.activations[point].to(DType::float64).value<double>();
    const Array<double> grad = run.gradients[point].to(DType::float64).value<double>();
    const Shape shape = source[point].shape();
    Array<double> change = (from - here) * grad;
    // Summed over the batch (and, but for the pattern, the features), as the masks broadcast.
    Array<double> summed = xt::sum(change, {std::size_t(0)}, xt::keep_dims);
    if (o.component != PatchComponent::pattern) summed = xt::sum(summed, {summed.dimension() - 1}, xt::keep_dims);
    const auto [heads, positions] = extent(o.component, shape, o.by_position, r.length);
    r.patched.emplace_back(heads, std::vector<PatchScore>(positions));
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t p = 0; p < positions; ++p) {
        const double change = covered_sum(o.component, summed, h, o.by_position ? std::optional(p) : std::nullopt);
        r.patched.back()[h][p] = {.accuracy = NAN, .loss = base + change, .logit_diff = NAN};
      }
  }
  return r;
}

}  // namespace qkv::analysis
