#pragma once
// The attention-only transformer the tasks train: token embedding + learned positions, L
// pre-LayerNorm attention layers with residuals (and an optional MLP), a final LayerNorm, and a
// readout: for pointer tasks, the pre-softmax scores of head 0 of the last layer; for token
// tasks, a linear head.
#include <memory>
#include <vector>

#include "examples/cli/tasks/task.hpp"
#include "qkv/nn/attention.hpp"

namespace qkv::cli {

struct ModelConfig {
  std::size_t vocab_size = 0, n_classes = 0, max_len = 0;
  Readout readout = Readout::token;
  bool causal = true;
  std::size_t layers = 2, d_model = 16, heads = 2, d_head = 0, kv_heads = 0;
  nn::QK qk = nn::QK::untied;
  nn::Projection proj = nn::Projection::learned;
  bool scale = true;  // 1/√d_head; false: 1
  bool mlp = false;
  // Token and position embeddings and every LayerNorm stay at their init: only the attention
  // projections and the task head train.
  bool frozen_embeddings = false;
};

class Block : public nn::Module {
 public:
  Block(const ModelConfig& c, Generator& gen);
  nn::LayerNorm ln1;
  nn::MultiHeadAttention attn;
  std::unique_ptr<nn::LayerNorm> ln2;  // with the MLP
  std::unique_ptr<nn::Linear> fc, proj;
};

struct Forward {
  Tensor output;                               // (B, T, n_classes) logits, or (B, T, T) scores of head 0
  std::vector<nn::AttentionResult> attention;  // per layer, with weights and scores
  std::vector<Tensor> inputs;                  // per layer: what its attention read, ln1(x)
};

class Model : public nn::Module {
 public:
  Model(const ModelConfig& config, Generator& gen);
  Forward forward(const IndexArray& tokens, bool need_weights = false) const;
  // The loss on a batch's scored positions.
  Tensor loss(const Forward& f, const IndexArray& targets) const;
  // argmax per position: (B, T).
  static IndexArray predictions(const Tensor& output);

  const ModelConfig& config() const { return config_; }

  nn::Embedding tok;
  nn::LearnedPositionalEncoding pos;
  std::vector<std::unique_ptr<Block>> blocks;
  nn::LayerNorm ln_f;
  std::unique_ptr<nn::Linear> head;  // token readout only

 private:
  ModelConfig config_;
};

}  // namespace qkv::cli
