#pragma once
// An encoder–decoder transformer, as in translation (Vaswani et al. 2017), pre-LayerNorm:
//
//   source (B, S) → embedding + positions → encoder blocks            → memory (B, S, d_model)
//     encoder block:  x = x + self_attn(ln1(x))          (bidirectional; padding keys masked)
//   target (B, T) → embedding + positions → decoder blocks → ln_final → head → logits (B, T, tgt_vocab)
//     decoder block:  y = y + self_attn(ln1(y))          (causal)
//                     y = y + cross_attn(ln_cross(y), memory)   (queries from the decoder, keys
//                                                                and values from the encoder)
//   each block with the MLP also  x = x + proj(gelu(fc(ln2(x)))).
//
// The decoder reads the target shifted right (teacher forcing): its input at t is the output token
// of t − 1, or the start token at 0; `loss` scores each position's logits against the output token.
//
//   nn::EncoderDecoderConfig config{.src_vocab = 12, .tgt_vocab = 12, .max_src_len = 8, .max_tgt_len = 9};
//   nn::EncoderDecoder model(config, gen);
//   auto out = model.forward(source, decoder_input);   // out.logits (B, T, tgt_vocab)
//   Tensor loss = model.loss(out, targets);             // cross-entropy, -100 ignored
//
// Parameter names, on the same paths as its hook points: src_tok.weight, tgt_tok.weight,
// src_pos.weight, tgt_pos.weight (learned positions), encoder.blocks.L.ln1.*,
// encoder.blocks.L.attn.{q,k,v,out}_proj.*, decoder.blocks.L.ln1.*, decoder.blocks.L.attn.* (the
// self-attention), decoder.blocks.L.ln_cross.*, decoder.blocks.L.cross_attn.*,
// {encoder,decoder}.blocks.L.ln2.* and .mlp.{fc,proj}.* with the MLP, ln_enc.* (the memory's
// LayerNorm), ln_final.*, head.*. Runs saved before these names (encoder.L.*, decoder.L.self_attn.*,
// ln_f.*) load as they were (nn::load_weights renames them).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/core/random.hpp"
#include "qkv/nn/attention.hpp"
#include "qkv/nn/hooks.hpp"
#include "qkv/nn/layers.hpp"
#include "qkv/nn/transformer.hpp"

namespace qkv::nn {

struct EncoderDecoderConfig {
  std::size_t src_vocab = 0, tgt_vocab = 0;      // token ids 0 … vocab − 1
  std::size_t max_src_len = 0, max_tgt_len = 0;  // positions of each side
  std::size_t encoder_layers = 1, decoder_layers = 1, d_model = 32, heads = 2;
  std::size_t d_head = 0;  // 0: d_model / heads
  // Every attention's projections: untied, or tied (W_k = W_q; in cross-attention one matrix then
  // reads two different streams, the decoder's for queries and the encoder's for keys).
  QK qk = QK::untied;
  Projection proj = Projection::learned;
  bool mlp = false;
  Positions positions = Positions::learned;
  DType dtype = DType::float32;
};

// Throws ConfigError naming the field for a config that cannot build a model (a size of 0, heads
// that do not divide d_model without d_head, symmetric q and k with d_head 1, identity
// projections whose heads do not tile d_model).
void check(const EncoderDecoderConfig& config);

// The config of the encoder's blocks, which are a bidirectional Transformer's.
TransformerConfig encoder_block_config(const EncoderDecoderConfig& config);

// The number of parameter elements a model of this config has (a double: absurd configs must not
// wrap).
double parameter_count(const EncoderDecoderConfig& config);

// The config as a JSON object (the "model" field of a run's config.json), and back: the reader
// checks every field's type and range and refuses unknown ones, std::runtime_error naming `file`
// and the field, prefixed by `prefix` ("model."). The dtype is not written: load_encoder_decoder
// takes the weights' own.
std::string to_json(const EncoderDecoderConfig& config);
EncoderDecoderConfig parse_encoder_decoder_config(std::string_view json, const std::string& file,
                                                  const std::string& prefix = "");

class DecoderBlock : public ResidualBlock {
 public:
  DecoderBlock(const EncoderDecoderConfig& config, Generator& gen);
  MultiHeadAttention self_attn;  // its points and weights are named decoder.blocks.L.attn.*
  LayerNorm ln_cross;
  MultiHeadAttention cross_attn;
  // After ResidualBlock's hook_resid_pre and ln1.hook_normalized and the self-attention's points:
  // hook_attn_out, ln_cross.hook_normalized, the cross-attention's points, hook_cross_attn_out;
  // then ResidualBlock's MLP points and hook_resid_post.
  HookPoint hook_attn_out, ln_cross_normalized, hook_cross_attn_out;

  // The block on the decoder's stream y (B, T, d_model) with the encoder's memory (B, S, d_model):
  // y + self_attn(ln1(y)) (causal), y + cross_attn(ln_cross(y), memory), then the MLP. With
  // caches, the self-attention reads and extends `self_cache`, and the cross-attention projects
  // the memory's keys and values into an empty `cross_cache` once, then reads them from there.
  Tensor forward(const Tensor& y, const Tensor& memory, const MaskArray& memory_padding, bool need_weights,
                 AttentionResult* self = nullptr, AttentionResult* cross = nullptr, KVCache* self_cache = nullptr,
                 KVCache* cross_cache = nullptr) const;
};

// What decoding one step at a time keeps: the memory it attends (and its source padding), and per
// decoder layer the self-attention's keys and values of the positions so far and the
// cross-attention's of the memory (projected at the first step). EncoderDecoder::start makes one.
struct DecoderCache {
  Tensor memory;               // (B, S, d_model)
  MaskArray source_padding;    // (B, S), or 0-d: none
  std::vector<KVCache> self, cross;
  std::size_t length() const { return self.empty() ? 0 : self[0].length(); }  // decoded positions
};

struct EncoderDecoderOutput {
  Tensor logits;  // (B, T, tgt_vocab)
  Tensor memory;  // the encoder's output after ln_enc, (B, S, d_model)
  // Per layer, with need_weights: weights and scores (B, H, ·, ·) and each head's output.
  std::vector<AttentionResult> encoder_attention, decoder_attention, cross_attention;
};

// What EncoderDecoder::run_with_cache returns: the forward's output and the activations kept.
struct EncoderDecoderCache : Activations {
  EncoderDecoderOutput output;
};

class EncoderDecoder : public Module {
 public:
  // Checks the config (ConfigError), then draws the parameters from `gen`.
  explicit EncoderDecoder(const EncoderDecoderConfig& config, Generator& gen = default_generator());

  // source (B, S) with S ≤ max_src_len, ids < src_vocab; decoder_input (B, T) with T ≤
  // max_tgt_len, ids < tgt_vocab (else std::invalid_argument naming the side and the fault).
  // source_padding (B, S): false for a padding position, which no query of the encoder or the
  // decoder attends (0-d: none).
  EncoderDecoderOutput forward(const IndexArray& source, const IndexArray& decoder_input, bool need_weights = false,
                               const MaskArray& source_padding = MaskArray()) const;
  // The memory alone: the encoder's output after ln_enc, (B, S, d_model).
  Tensor encode(const IndexArray& source, const MaskArray& source_padding = MaskArray(),
                std::vector<AttentionResult>* attention = nullptr, bool need_weights = false) const;
  // A cache to decode from `memory` (encode's output, (B, S, d_model)) with its source padding
  // ((B, S) or none); std::invalid_argument naming the shapes when they do not fit.
  DecoderCache start(const Tensor& memory, const MaskArray& source_padding = MaskArray()) const;
  // The logits (B, T_new, tgt_vocab) of the next decoder inputs (B, T_new), at positions cache
  // length … cache length + T_new − 1, attending the cache's memory and what it holds; equal to
  // forward's at those positions. A call that throws leaves the cache as it was.
  Tensor decode(const IndexArray& decoder_input, DecoderCache& cache) const;
  // Mean cross-entropy of the logits against targets (B, T), over positions whose target is not
  // ignore_index.
  Tensor loss(const EncoderDecoderOutput& output, const IndexArray& targets, std::int64_t ignore_index = -100) const;

  // Hook points in the order a forward reaches them (Module::hook_names lists them, add_hook and
  // reset_hooks hook them): encoder.hook_embed, encoder.hook_pos_embed, per encoder layer a
  // Transformer block's (encoder.blocks.L.hook_resid_pre, encoder.blocks.L.ln1.hook_normalized,
  // encoder.blocks.L.attn.hook_q … hook_z, …), ln_enc.hook_normalized (the memory); then
  // decoder.hook_embed, decoder.hook_pos_embed, per decoder layer decoder.blocks.L.hook_resid_pre,
  // ln1.hook_normalized, attn.hook_q … hook_z (its self-attention), hook_attn_out,
  // ln_cross.hook_normalized, cross_attn.hook_q … hook_z (keys and values from the memory),
  // hook_cross_attn_out, the MLP's points and hook_resid_post; last ln_final.hook_normalized.
  //
  // forward with `hooks` added for this call only (after the model's own); a name that is no
  // point is an error before anything runs.
  EncoderDecoderOutput run_with_hooks(const IndexArray& source, const IndexArray& decoder_input, const NamedHooks& hooks,
                                      bool need_weights = false, const MaskArray& source_padding = MaskArray());
  // forward, keeping the activation at every hook point `keep` keeps (all without it).
  EncoderDecoderCache run_with_cache(const IndexArray& source, const IndexArray& decoder_input,
                                     const HookFilter& keep = {}, const MaskArray& source_padding = MaskArray());

  const EncoderDecoderConfig& config() const { return config_; }
  Tensor src_position_table() const;  // (max_src_len, d_model)
  Tensor tgt_position_table() const;  // (max_tgt_len, d_model)

  Embedding src_tok, tgt_tok;
  std::unique_ptr<LearnedPositionalEncoding> src_pos, tgt_pos;         // learned positions
  std::unique_ptr<SinusoidalPositionalEncoding> src_sinusoids, tgt_sinusoids;  // fixed positions
  std::vector<std::unique_ptr<TransformerBlock>> encoder;
  LayerNorm ln_enc;
  std::vector<std::unique_ptr<DecoderBlock>> decoder;
  LayerNorm ln_final;
  Linear head;
  HookPoint encoder_embed, encoder_pos_embed, ln_enc_normalized, decoder_embed, decoder_pos_embed, ln_final_normalized;

 protected:
  const char* type_name() const override { return "EncoderDecoder"; }

 private:
  EncoderDecoderConfig config_;
};

// DIR/config.json as {"model": CONFIG}, written atomically; its "model" field back
// (std::runtime_error naming the file and the field at fault); and the model of a run folder,
// built from it with the committed checkpoint's weights (checkpoint.hpp), in the dtype they were
// saved in, as load_transformer does for the decoder-only model:
//
//   nn::save_config(dir, model.config());
//   nn::save_checkpoint(dir, model, adam.state_dict(), {.step = 1000});
//   auto loaded = nn::load_encoder_decoder(dir);
void save_config(const std::string& dir, const EncoderDecoderConfig& config);
EncoderDecoderConfig load_encoder_decoder_config(const std::string& dir);
std::unique_ptr<EncoderDecoder> load_encoder_decoder(const std::string& dir);

}  // namespace qkv::nn
