#include "qkv/training/memory.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iterator>

#include <fmt/format.h>

#include "qkv/nn/files.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/options.hpp"

namespace qkv::training {

using namespace tasks;

namespace {

std::string bytes_text(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::size_t u = 0;
  while (bytes >= 1024 && u + 1 < std::size(units)) bytes /= 1024, ++u;
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace

MemoryEstimate estimate_memory(const TrainOptions& o) {
  // In doubles: the sizes may be absurd, and the products must not wrap.
  const nn::TransformerConfig& m = o.model;
  const double D = double(m.d_model), L = double(m.layers), H = double(m.heads), T = double(m.max_len);
  const double S = double(o.max_source_len), encoder_layers = double(o.encoder_layers);
  const double Hkv = double(m.kv_heads ? m.kv_heads : m.heads);
  const double dh = double(nn::head_dim(m)), B = double(step_rows(o));  // check_options ran: heads ≥ 1
  const double qkv_width = (H + 2 * Hkv) * dh, mlp = m.mlp ? 1.0 : 0.0;
  const double hidden = m.d_mlp ? double(m.d_mlp) : 4 * D;  // the MLP's
  // Each parameter: its value, gradient and Adam's two moments, in float32.
  MemoryEstimate e;
  const double parameters = o.encoder_layers ? nn::parameter_count(encoder_decoder_config(o)) : nn::parameter_count(m);
  // Fixed sinusoids are not parameters, but their float32 and float64 tables take 12 bytes a cell.
  e.model = 16 * parameters + (m.positions == nn::Positions::sinusoidal ? 12 * (T + S) * D : 0);
  // A step keeps, per layer, a few (B, T, D)-sized activations, the packed q/k/v, and the attention
  // weights (B, H, T, T, padded to 16 queries); backward allocates as much again for gradients. An
  // encoder-decoder's decoder layers attend twice, to themselves and to the source.
  const auto layer = [&](double queries, double keys) {  // Pᵀ: keys × queries padded to 16
    return B * queries * (6 * D + 2 * qkv_width + mlp * (2 * D + 3 * hidden)) + 2 * B * H * keys * (std::ceil(queries / 16) * 16);
  };
  const double layers = encoder_layers * layer(S, S) + L * (layer(T, T) + (o.encoder_layers ? layer(T, S) : 0));
  e.step = 2 * 4 * (layers + B * T * (3 * D + 2 * double(m.n_classes)) + B * S * 3 * D);
  return e;
}

namespace {
std::atomic<std::size_t> memory_sharers{1};
}  // namespace

void share_memory(std::size_t processes) { memory_sharers.store(std::max<std::size_t>(1, processes)); }

void check_memory(const TrainOptions& o, bool training) {
  const nn::TransformerConfig& m = o.model;
  MemoryEstimate need = estimate_memory(o);
  if (!training) {  // the weights alone, and a forward pass with no gradients
    need.model /= 4;
    need.step /= 2;
  }
  const double available = nn::available_memory() / double(memory_sharers.load());
  if (need.model + need.step > available) {
    // The option to make smaller: of those whose value at the task's default would need less, the
    // one furthest above its default.
    const TrainOptions defaults = default_options(o.task, o.n);
    const MemoryEstimate full = estimate_memory(o);  // compared with the same estimates, unscaled
    const double total = full.model + full.step;
    const char* field = "batch";
    double furthest = 1;
    const auto consider = [&](const char* name, double value, double usual, auto reset) {
      TrainOptions smaller = o;
      reset(smaller);
      const MemoryEstimate e = estimate_memory(smaller);
      if (e.model + e.step < total && value / usual > furthest) {
        field = name;
        furthest = value / usual;
      }
    };
    const nn::TransformerConfig& d = defaults.model;
    const auto kv_heads = [](const nn::TransformerConfig& c) { return double(c.kv_heads ? c.kv_heads : c.heads); };
    consider("batch", double(step_rows(o)), double(step_rows(defaults)), [&](TrainOptions& s) { s.batch = defaults.batch; });
    consider("model.max_len", double(m.max_len), double(d.max_len), [&](TrainOptions& s) { s.model.max_len = d.max_len; });
    consider("model.layers", double(m.layers), double(d.layers), [&](TrainOptions& s) { s.model.layers = d.layers; });
    if (o.encoder_layers)
      consider("encoder_layers", double(o.encoder_layers), double(defaults.encoder_layers),
               [&](TrainOptions& s) { s.encoder_layers = defaults.encoder_layers; });
    consider("model.d_model", double(m.d_model), double(d.d_model), [&](TrainOptions& s) { s.model.d_model = d.d_model; });
    consider("model.heads", double(m.heads), double(d.heads), [&](TrainOptions& s) { s.model.heads = d.heads; });
    if (m.mlp && m.d_mlp)  // the MLP's width where it was given (0: 4 · d_model)
      consider("model.d_mlp", double(m.d_mlp), double(d.d_mlp ? d.d_mlp : 4 * d.d_model),
               [&](TrainOptions& s) { s.model.d_mlp = d.d_mlp; });
    // d_head and kv_heads only where they were given: otherwise heads and d_model set them.
    if (m.d_head)
      consider("model.d_head", double(m.d_head), double(nn::head_dim(d)),
               [&](TrainOptions& s) { s.model.d_head = nn::head_dim(d); });
    if (m.kv_heads)
      consider("model.kv_heads", double(m.kv_heads), kv_heads(d),
               [&](TrainOptions& s) { s.model.kv_heads = std::size_t(kv_heads(d)); });
    throw OptionError(field, fmt::format("needs about {} for the model{} and {} for a {} (batch {} of {} tokens, d_model {}, "
                                         "{} layers of {} heads), more than the {} this machine has available{}",
                                         bytes_text(need.model), training ? " and its optimizer state" : "",
                                         bytes_text(need.step), training ? "training step" : "forward pass", step_rows(o),
                                         m.max_len, m.d_model, m.layers, m.heads, bytes_text(available),
                                         memory_sharers.load() > 1
                                             ? fmt::format(" for each of {} runs at once", memory_sharers.load())
                                             : std::string()));
  }
}

}  // namespace qkv::training
