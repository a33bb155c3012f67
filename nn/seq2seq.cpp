#include "qkv/nn/seq2seq.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/core/ops.hpp"
#include "qkv/core/shape.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/detail/transformer_json.hpp"
#include "qkv/nn/files.hpp"

namespace qkv::nn {

namespace {

const EncoderDecoderConfig& checked(const EncoderDecoderConfig& c) {
  check(c);
  return c;
}

// Token ids (B, T) of one side, checked: 2-d, at most `max_len` positions, ids below `vocab`.
void check_tokens(const IndexArray& tokens, const char* side, std::size_t max_len, std::size_t vocab) {
  if (tokens.dimension() != 2)
    fail("EncoderDecoder", "{} of shape {}: expected (batch, positions)", side, to_string(to_shape(tokens.shape())));
  if (tokens.shape()[1] > max_len)
    fail("EncoderDecoder", "{} of {} positions, beyond its {}", side, tokens.shape()[1], max_len);
  for (std::int64_t t : tokens)
    if (t < 0 || std::size_t(t) >= vocab) fail("EncoderDecoder", "{} token {} is outside its vocabulary of {}", side, t, vocab);
}

}  // namespace

TransformerConfig encoder_block_config(const EncoderDecoderConfig& c) {
  TransformerConfig t{.vocab_size = c.src_vocab, .n_classes = c.tgt_vocab, .max_len = c.max_src_len, .causal = false};
  t.layers = c.encoder_layers, t.d_model = c.d_model, t.heads = c.heads, t.d_head = c.d_head, t.qk = c.qk, t.proj = c.proj;
  t.mlp = c.mlp, t.positions = c.positions, t.dtype = c.dtype;
  return t;
}

double parameter_count(const EncoderDecoderConfig& c) {
  // The encoder is a pointer-readout Transformer's body (its final LayerNorm is ln_enc), the decoder
  // a token-readout one's with a cross-attention and its LayerNorm more per layer.
  TransformerConfig encoder = encoder_block_config(c);
  encoder.readout = Readout::pointer, encoder.n_classes = 0;
  TransformerConfig decoder = encoder;
  decoder.vocab_size = c.tgt_vocab, decoder.n_classes = c.tgt_vocab, decoder.readout = Readout::token;
  decoder.max_len = c.max_tgt_len, decoder.layers = c.decoder_layers;
  TransformerConfig one = encoder, none = encoder;  // a layer without its MLP: LayerNorm and attention
  one.mlp = none.mlp = false, one.layers = 1, none.layers = 0;
  return parameter_count(encoder) + parameter_count(decoder) +
         double(c.decoder_layers) * (parameter_count(one) - parameter_count(none));
}

nlohmann::json detail::encoder_decoder_config_json(const EncoderDecoderConfig& c) { return config_json(c); }

EncoderDecoderConfig detail::read_encoder_decoder_config(const nlohmann::json& j, const std::string& file,
                                                         const std::string& prefix) {
  const detail::FieldReader m(j, file, prefix);
  if (m.has("vocab_size"))
    m.fail_at("vocab_size", "belongs to a decoder-only model's config: load_transformer reads it");
  EncoderDecoderConfig c;
  FieldLoader loader{m};
  config_fields(c, loader);
  m.only(encoder_decoder_config_json(c));
  try {
    check(c);
  } catch (const ConfigError& e) {
    m.fail_at(e.field, "{}", e.what());
  }
  return c;
}

std::string to_json(const EncoderDecoderConfig& c) { return detail::encoder_decoder_config_json(c).dump(); }

EncoderDecoderConfig parse_encoder_decoder_config(std::string_view json, const std::string& file, const std::string& prefix) {
  return detail::read_encoder_decoder_config(detail::parse_json(json, file, 2), file, prefix);  // a decoder-only config's lists are named
}

void save_config(const std::string& dir, const EncoderDecoderConfig& config) {
  detail::write_model_config(dir, detail::encoder_decoder_config_json(config));
}

EncoderDecoderConfig load_encoder_decoder_config(const std::string& dir) {
  return detail::read_encoder_decoder_config(detail::read_model_config(dir), dir + "/config.json", "model.");
}

std::unique_ptr<EncoderDecoder> load_encoder_decoder(const std::string& dir) {
  return detail::load_model<EncoderDecoder>(dir, load_encoder_decoder_config(dir));
}

void check(const EncoderDecoderConfig& c) {
  const auto error = [](const char* field, const std::string& text) { throw ConfigError(field, text); };
  if (c.src_vocab == 0) error("src_vocab", "is 0: the encoder needs at least one token");
  if (c.tgt_vocab == 0) error("tgt_vocab", "is 0: the decoder needs at least one token");
  if (c.max_src_len == 0) error("max_src_len", "is 0: the encoder needs at least one position");
  if (c.max_tgt_len == 0) error("max_tgt_len", "is 0: the decoder needs at least one position");
  if (c.encoder_layers == 0) error("encoder_layers", "is 0: the model needs at least one encoder layer");
  if (c.decoder_layers == 0) error("decoder_layers", "is 0: the model needs at least one decoder layer");
  check(encoder_block_config(c));  // the attention's own constraints, as the decoder-only model words them
}

DecoderBlock::DecoderBlock(const EncoderDecoderConfig& c, Generator& gen)
    : ResidualBlock({.d_model = c.d_model, .dtype = c.dtype, .mlp = c.mlp}),
      self_attn(detail::attention_options(encoder_block_config(c)), gen),
      ln_cross(c.d_model, 1e-5, true, c.dtype),
      cross_attn(detail::attention_options(encoder_block_config(c)), gen) {
  register_input();
  register_module("attn", self_attn);
  register_hook("hook_attn_out", hook_attn_out);
  register_module("ln_cross", ln_cross);
  register_hook("ln_cross.hook_normalized", ln_cross_normalized);
  register_module("cross_attn", cross_attn);
  register_hook("hook_cross_attn_out", hook_cross_attn_out);
  register_output(gen);
}

Tensor DecoderBlock::forward(const Tensor& y_in, const Tensor& memory, const MaskArray& memory_padding, bool need_weights,
                             AttentionResult* self, AttentionResult* cross, KVCache* self_cache, KVCache* cross_cache) const {
  Tensor y = hook_resid_pre(y_in);
  AttentionResult s = self_attn.forward(normalized_input(y), {.causal = true}, need_weights, self_cache);
  y = y + hook_attn_out(s.output);
  // The memory's keys and values, once: after the first step the cache holds them, and no new
  // position is projected.
  const Tensor source = cross_cache && cross_cache->length() > 0 ? slice(memory, 1, 0, 0) : memory;
  AttentionResult c = cross_attn.forward(ln_cross_normalized(ln_cross(y)), source, source,
                                         {.causal = false, .key_padding = memory_padding}, need_weights, cross_cache);
  const Tensor out = output(y + hook_cross_attn_out(c.output));
  if (self) *self = std::move(s);
  if (cross) *cross = std::move(c);
  return out;
}

EncoderDecoder::EncoderDecoder(const EncoderDecoderConfig& c, Generator& gen)
    : src_tok(checked(c).src_vocab, c.d_model, c.dtype, gen),
      tgt_tok(c.tgt_vocab, c.d_model, c.dtype, gen),
      ln_enc(c.d_model, 1e-5, true, c.dtype),
      ln_final(c.d_model, 1e-5, true, c.dtype),
      head(c.d_model, c.tgt_vocab, true, c.dtype, gen),
      config_(c) {
  register_hook("encoder.hook_embed", encoder_embed);
  register_hook("encoder.hook_pos_embed", encoder_pos_embed);
  register_module("src_tok", src_tok);
  register_module("tgt_tok", tgt_tok);
  if (c.positions == Positions::learned) {
    src_pos = std::make_unique<LearnedPositionalEncoding>(c.max_src_len, c.d_model, c.dtype, gen);
    tgt_pos = std::make_unique<LearnedPositionalEncoding>(c.max_tgt_len, c.d_model, c.dtype, gen);
    register_module("src_pos", *src_pos);
    register_module("tgt_pos", *tgt_pos);
  } else {
    src_sinusoids = std::make_unique<SinusoidalPositionalEncoding>(c.max_src_len, c.d_model);
    tgt_sinusoids = std::make_unique<SinusoidalPositionalEncoding>(c.max_tgt_len, c.d_model);
  }
  for (std::size_t l = 0; l < c.encoder_layers; ++l) {
    encoder.push_back(std::make_unique<TransformerBlock>(encoder_block_config(c), gen));
    register_module("encoder.blocks." + std::to_string(l), *encoder.back());
  }
  register_module("ln_enc", ln_enc);
  register_hook("ln_enc.hook_normalized", ln_enc_normalized);
  register_hook("decoder.hook_embed", decoder_embed);
  register_hook("decoder.hook_pos_embed", decoder_pos_embed);
  for (std::size_t l = 0; l < c.decoder_layers; ++l) {
    decoder.push_back(std::make_unique<DecoderBlock>(c, gen));
    register_module("decoder.blocks." + std::to_string(l), *decoder.back());
  }
  register_module("ln_final", ln_final);
  register_hook("ln_final.hook_normalized", ln_final_normalized);
  register_module("head", head);
}

Tensor EncoderDecoder::src_position_table() const {
  return src_pos ? src_pos->weight : src_sinusoids->table(src_tok.weight.dtype());
}

Tensor EncoderDecoder::tgt_position_table() const {
  return tgt_pos ? tgt_pos->weight : tgt_sinusoids->table(tgt_tok.weight.dtype());
}

Tensor EncoderDecoder::encode(const IndexArray& source, const MaskArray& source_padding,
                              std::vector<AttentionResult>* attention, bool need_weights) const {
  check_tokens(source, "source", config_.max_src_len, config_.src_vocab);
  Tensor x = detail::embed(src_tok, src_position_table(), encoder_embed, encoder_pos_embed, source);
  const AttentionMask mask{.causal = false, .key_padding = source_padding};
  for (const auto& block : encoder) {
    AttentionResult r;
    x = block->forward(x, mask, need_weights, &r);
    if (attention) attention->push_back(std::move(r));
  }
  return ln_enc_normalized(ln_enc(x));
}

EncoderDecoderOutput EncoderDecoder::forward(const IndexArray& source, const IndexArray& decoder_input, bool need_weights,
                                             const MaskArray& source_padding) const {
  check_tokens(source, "source", config_.max_src_len, config_.src_vocab);
  check_tokens(decoder_input, "decoder input", config_.max_tgt_len, config_.tgt_vocab);
  if (decoder_input.shape()[0] != source.shape()[0])
    fail("EncoderDecoder", "a decoder input of {} sequences for a source of {}", decoder_input.shape()[0], source.shape()[0]);
  EncoderDecoderOutput f;
  f.memory = encode(source, source_padding, &f.encoder_attention, need_weights);
  Tensor y = detail::embed(tgt_tok, tgt_position_table(), decoder_embed, decoder_pos_embed, decoder_input);
  for (const auto& block : decoder) {
    f.decoder_attention.emplace_back();
    f.cross_attention.emplace_back();
    y = block->forward(y, f.memory, source_padding, need_weights, &f.decoder_attention.back(), &f.cross_attention.back());
  }
  f.logits = head(ln_final_normalized(ln_final(y)));
  return f;
}

DecoderCache EncoderDecoder::start(const Tensor& memory, const MaskArray& source_padding) const {
  if (memory.dim() != 3 || memory.size(2) != config_.d_model)
    fail("EncoderDecoder", "a memory of shape {}: expected (batch, source positions, {})", to_string(memory.shape()),
         config_.d_model);
  if (source_padding.dimension() != 0 &&
      (source_padding.dimension() != 2 || source_padding.shape()[0] != memory.size(0) || source_padding.shape()[1] != memory.size(1)))
    fail("EncoderDecoder", "source padding of shape {} for a memory of shape {}", to_string(to_shape(source_padding.shape())),
         to_string(memory.shape()));
  return {.memory = memory, .source_padding = source_padding, .self = std::vector<KVCache>(decoder.size()),
          .cross = std::vector<KVCache>(decoder.size())};
}

Tensor EncoderDecoder::decode(const IndexArray& decoder_input, DecoderCache& cache) const {
  check_tokens(decoder_input, "decoder input", config_.max_tgt_len, config_.tgt_vocab);
  if (!cache.memory.defined() || cache.self.size() != decoder.size() || cache.cross.size() != decoder.size())
    fail("EncoderDecoder", "a decoder cache that EncoderDecoder::start did not make for this model");
  if (decoder_input.shape()[0] != cache.memory.size(0))
    fail("EncoderDecoder", "a decoder input of {} sequences for a memory of {}", decoder_input.shape()[0], cache.memory.size(0));
  const std::size_t offset = cache.length(), T = decoder_input.shape()[1];
  if (offset + T > config_.max_tgt_len)
    fail("EncoderDecoder", "decoder positions {} to {} are beyond its {}", offset, offset + T, config_.max_tgt_len);
  const DecoderCache before = cache;  // handles: what a failed step restores
  try {
    Tensor y = detail::embed(tgt_tok, tgt_position_table(), decoder_embed, decoder_pos_embed, decoder_input, offset);
    for (std::size_t l = 0; l < decoder.size(); ++l)
      y = decoder[l]->forward(y, cache.memory, cache.source_padding, false, nullptr, nullptr, &cache.self[l], &cache.cross[l]);
    return head(ln_final_normalized(ln_final(y)));
  } catch (...) {
    cache = before;
    throw;
  }
}

Tensor EncoderDecoder::loss(const EncoderDecoderOutput& f, const IndexArray& targets, std::int64_t ignore_index) const {
  const std::int64_t classes = std::int64_t(f.logits.size(-1));
  const IndexArray flat = xt::reshape_view(targets, Shape{targets.size()});
  return cross_entropy(reshape(f.logits, {-1, classes}), flat, ignore_index);
}

EncoderDecoderOutput EncoderDecoder::run_with_hooks(const IndexArray& source, const IndexArray& decoder_input,
                                                    const NamedHooks& hooks, bool need_weights,
                                                    const MaskArray& source_padding) {
  return with_hooks(hooks, [&] { return forward(source, decoder_input, need_weights, source_padding); });
}

EncoderDecoderCache EncoderDecoder::run_with_cache(const IndexArray& source, const IndexArray& decoder_input,
                                                   const HookFilter& keep, const MaskArray& source_padding) {
  EncoderDecoderCache cache;
  cache.output = run_with_hooks(source, decoder_input, caching_hooks(cache, keep), false, source_padding);
  return cache;
}

}  // namespace qkv::nn
