#pragma once
// The benchmark's model sizes and the FLOP count of one training step. bench/torch_bench.py holds
// the same table and formula; keep the two in step.
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace qkv::bench {

struct Config {
  std::string name;
  std::size_t V, D, H, L, T, B;  // vocabulary, width, heads, layers, length, batch
};

inline const std::vector<Config>& configs() {
  static const std::vector<Config> table = {
      {"tiny", 8, 32, 4, 2, 32, 64},
      {"small", 16, 64, 4, 2, 64, 64},
      {"medium", 64, 256, 8, 2, 128, 32},
      // Long sequences, where attention's T² work dominates: long and longer hold the same 4,096
      // tokens a batch; wide is a wider, deeper model at medium's length.
      {"long", 64, 128, 4, 2, 512, 8},
      {"longer", 64, 128, 4, 2, 1024, 4},
      {"wide", 64, 512, 8, 4, 128, 16},
  };
  return table;
}

inline std::vector<std::string> config_names() {
  std::vector<std::string> names;
  for (const Config& c : configs()) names.push_back(c.name);
  return names;
}

inline const Config& config(const std::string& name) {
  for (const Config& c : configs())
    if (c.name == name) return c;
  throw std::invalid_argument("qkv-bench: unknown config '" + name + "'");
}

// Tokens each sequence generates after its start token in the decoding benchmark (qkv-bench
// --decode, torch_bench.py --decode).
inline constexpr std::size_t decode_tokens = 256;

// Floating-point operations of the step's matrix products, counting a multiply-add as 2: per layer
// the fused QKV projection (N·D·3D), the scores Q Kᵀ and the weighted values P V (B·T·T·D each,
// over all heads, masked entries included: PyTorch computes them, qkv skips the tiles above the
// causal diagonal, and both are counted as the dense product), the output
// projection (N·D·D); then the head (N·D·V); N = B·T. Backward computes two products of the same
// size for each (the input's gradient and the weight's), so the step is 3 × forward. Elementwise
// work (softmax, cross-entropy, Adam: a few operations per element) is left out.
inline double step_flops(const Config& c) {
  const double N = double(c.B) * double(c.T), D = double(c.D), T = double(c.T), V = double(c.V);
  const double layer = 2 * N * D * 3 * D + 2 * (2 * N * T * D) + 2 * N * D * D;
  const double forward = double(c.L) * layer + 2 * N * D * V;
  return 3 * forward;
}

}  // namespace qkv::bench
