// Sharing keys and values across heads (GQA, MQA): what it costs in accuracy and saves in cache.
#include "qkv/experiments/experiment.hpp"

#include "qkv/core/autograd.hpp"

namespace qkv::experiments {

using namespace tasks;
using namespace training;

namespace {

// Bytes the KV caches of all layers hold per token of one sequence, measured on a real cache.
std::size_t kv_cache_bytes_per_token(const nn::Transformer& m, const std::vector<std::int64_t>& input) {
  NoGradGuard no_grad;
  const nn::TransformerOutput f = m.forward(one_row(input));
  std::size_t bytes = 0;
  for (std::size_t l = 0; l < m.blocks.size(); ++l) {
    nn::KVCache cache;
    m.blocks[l]->attn.forward(f.inputs[l], {.causal = m.causal(l)}, false, &cache);
    bytes += cache.bytes_per_sequence();
  }
  return bytes / input.size();
}

}  // namespace

ExperimentSpec kv_experiment() {
  return {.name = "kv",
          .description = "MHA, GQA and MQA on induction, with the KV-cache bytes per token",
          .plan =
              [](const ExperimentOptions& e) {
                std::vector<ExperimentConfig> out;
                for (const std::size_t kv : {4, 2, 1}) {
                  TrainOptions o = experiment_run("induction", e);
                  o.model.heads = 4;
                  o.model.kv_heads = kv;
                  out.push_back({{{"task", "induction"}, {"attention", kv == 4 ? "MHA" : kv == 1 ? "MQA" : "GQA"},
                                  {"kv_heads", kv}},
                                 o});
                }
                return out;
              },
          .columns = {{"kv_cache_bytes_per_token", "KV cache bytes/token", "{:.0f}"}},
          .at_end = [](nlohmann::ordered_json& run, const nn::Transformer& trained, const Sequences& sequences) {
            run["kv_cache_bytes_per_token"] = kv_cache_bytes_per_token(trained, sequences.front());
          }};
}

}  // namespace qkv::experiments
