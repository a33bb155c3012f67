#include "qkv/analysis/logit_attribution.hpp"

#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xview.hpp>

#include "qkv/analysis/patching.hpp"
#include "qkv/analysis/detail/f64.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/tasks/evaluate.hpp"

namespace qkv::analysis {

double LogitAttribution::attention(std::size_t layer) const {
  const auto& h = heads.at(layer);
  return std::accumulate(h.begin(), h.end(), 0.0) + attn_bias.at(layer);
}

double LogitAttribution::total() const {
  double sum = embed + pos_embed + bias;
  for (std::size_t l = 0; l < heads.size(); ++l) sum += attention(l);
  for (double m : mlp) sum += m;
  return sum;
}

namespace {

using detail::f64;

// The scored positions, each a row of the flattened (B·T) stream with its direction and constant.
struct Readout {
  std::vector<std::size_t> rows;
  Array<double> directions;  // (rows, D): ln_final.weight ⊙ (W_U[target] − W_U[other])
  std::vector<double> scale;  // ln_final's, per row (1 without it)
  bool centred = true;         // ln_final subtracts each row's mean (not without it)
  double constant = 0, logit_diff = 0;  // summed over the rows
};

// The mean over the scored rows of a part x (B·T, D): (x − mean x) / scale · direction.
double attributed(const Readout& r, const Array<double>& x) {
  const std::size_t D = x.shape()[1];
  double total = 0;
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const auto row = xt::view(x, r.rows[i], xt::all());
    const double mean = r.centred ? xt::mean(row)() : 0.0;
    double dot = 0;
    for (std::size_t d = 0; d < D; ++d) dot += (row(d) - mean) * r.directions(i, d);
    total += dot / r.scale[i];
  }
  return total / double(r.rows.size());
}

Array<double> flat(const Tensor& t) {
  Array<double> a = f64(t);
  const std::size_t D = a.shape().back();
  a.reshape({a.size() / D, D});
  return a;
}

}  // namespace

LogitAttribution logit_attribution(nn::Transformer& model, const tasks::Task& task, const LogitAttributionOptions& o) {
  if (model.config().readout != nn::Readout::token)
    throw std::invalid_argument(
        "logit_attribution: the model's readout is pointer (attention scores), not a token readout to attribute through");
  const std::size_t L = model.blocks.size();
  const auto [batch, mask] = held_out_batch(model, task, o.sequences, o.seed, o.mask_padding, "logit_attribution");
  std::vector<std::string> points{"hook_embed", "hook_pos_embed", fmt::format("blocks.{}.hook_resid_post", L - 1)};
  for (std::size_t l = 0; l < L; ++l) {
    points.push_back(fmt::format("blocks.{}.attn.hook_z", l));
    if (model.blocks[l]->mlp) points.push_back(fmt::format("blocks.{}.hook_mlp_out", l));
  }
  NoGradGuard no_grad;
  const nn::ActivationCache cache = model.run_with_cache(batch.tokens, points, mask);

  LogitAttribution r;
  r.task = task.info().name;
  r.sequences = batch.tokens.shape()[0];
  r.seed = o.seed;
  const Array<double> logits = f64(cache.output.logits);
  const Array<double> stream = flat(cache[points[2]]);
  const std::size_t T = logits.shape()[1], C = logits.shape()[2], D = stream.shape()[1];
  const Array<double> unembed = f64(model.head->weight);  // (C, D)
  const Array<double> head_bias = model.head->bias.defined() ? f64(model.head->bias) : Array<double>(xt::zeros<double>({C}));
  const nn::LayerNorm* ln = model.ln_final.get();  // none: the stream is read as it is
  const bool affine = ln && ln->weight.defined();
  const Array<double> ln_weight = affine ? f64(ln->weight) : Array<double>(xt::ones<double>({D}));
  const Array<double> ln_bias = affine ? f64(ln->bias) : Array<double>(xt::zeros<double>({D}));

  Readout readout;
  readout.centred = ln != nullptr;
  std::vector<double> directions;
  for (std::size_t row = 0; row < stream.shape()[0]; ++row) {
    const std::size_t b = row / T, t = row % T;
    const std::int64_t target = batch.targets(b, t);
    if (target < 0) continue;
    std::size_t other = C;
    for (std::size_t c = 0; c < C; ++c)
      if (std::int64_t(c) != target && std::isfinite(logits(b, t, c)) && (other == C || logits(b, t, c) > logits(b, t, other)))
        other = c;
    if (other == C) continue;
    const auto y = std::size_t(target);
    readout.rows.push_back(row);
    const auto x = xt::view(stream, row, xt::all());
    readout.scale.push_back(ln ? std::sqrt(xt::variance(x)() + ln->eps) : 1.0);
    for (std::size_t d = 0; d < D; ++d) {
      const double w = unembed(y, d) - unembed(other, d);
      directions.push_back(ln_weight(d) * w);
      readout.constant += ln_bias(d) * w;
    }
    readout.constant += head_bias(y) - head_bias(other);
    readout.logit_diff += logits(b, t, y) - logits(b, t, other);
  }
  if (readout.rows.empty()) throw std::invalid_argument("logit_attribution: no position of the sequences is scored");
  const std::size_t n = readout.rows.size();
  readout.directions = xt::adapt(directions, Shape{n, D});
  r.positions = n;
  r.logit_diff = readout.logit_diff / double(n);
  r.bias = readout.constant / double(n);
  r.embed = attributed(readout, flat(cache["hook_embed"]));
  r.pos_embed = attributed(readout, flat(cache["hook_pos_embed"]));
  for (std::size_t l = 0; l < L; ++l) {
    const nn::MultiHeadAttention& attn = model.blocks[l]->attn;
    const Array<double> z = f64(cache[fmt::format("blocks.{}.attn.hook_z", l)]);  // (B, T, H, d_v)
    const std::size_t H = z.shape()[2], dv = z.shape()[3];
    r.heads.emplace_back();
    for (std::size_t h = 0; h < H; ++h) {
      const Array<double> zh = xt::reshape_view(xt::view(z, xt::all(), xt::all(), h, xt::all()), {z.shape()[0] * T, dv});
      r.heads.back().push_back(attributed(readout, xt::linalg::dot(zh, f64(attn.W_o(h)))));
    }
    const Array<double> b_o = attn.out_proj->bias.defined() ? f64(attn.out_proj->bias) : Array<double>(xt::zeros<double>({D}));
    r.attn_bias.push_back(attributed(readout, xt::broadcast(xt::view(b_o, xt::newaxis(), xt::all()), {stream.shape()[0], D})));
    if (model.blocks[l]->mlp) r.mlp.push_back(attributed(readout, flat(cache[fmt::format("blocks.{}.hook_mlp_out", l)])));
  }
  return r;
}

}  // namespace qkv::analysis
