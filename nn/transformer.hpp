#pragma once
// A small decoder-style transformer, the model `qkv train` trains:
//
//   tokens (B, T) → embedding + learned positions → L blocks → readout
//   block:  x = x + attn(ln1(x))            (pre-LayerNorm, residual)
//           x = x + proj(act(fc(ln2(x))))   (with the MLP: d_model → d_mlp → d_model, GELU or ReLU)
//
// Without LayerNorm (layer_norm false) ln1, ln2 and ln_final are the identity and have no weights.
// Two readouts: `token` (ln_final, then a Linear head to n_classes logits at every position) and
// `pointer` (the last layer's head-0 attention scores before softmax: a distribution over key
// positions, for tasks whose answer is a position, as a closing bracket's opener).
//
//   nn::TransformerConfig config{.vocab_size = 6, .n_classes = 6, .max_len = 16};
//   nn::Transformer model(config, gen);
//   auto out = model.forward(tokens);           // out.logits (B, T, n_classes)
//   Tensor loss = model.loss(out, targets);     // cross-entropy, -100 ignored
//
// Parameter names (its state_dict), on the same paths as its hook points: tok.weight, pos.weight
// (learned positions), blocks.L.ln1.{weight,bias}, blocks.L.attn.{q,k,v,out}_proj.{weight,bias},
// blocks.L.ln2.* and blocks.L.mlp.{fc,proj}.* with the MLP, ln_final.{weight,bias},
// head.{weight,bias} for the token readout. Runs saved before these names (layers.L.*, ln_f.*)
// load as they were (nn::load_weights renames them).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/core/random.hpp"
#include "qkv/nn/attention.hpp"
#include "qkv/nn/hooks.hpp"

namespace qkv::nn {

enum class Readout { token, pointer };
enum class Positions { learned, sinusoidal };  // a (max_len, d_model) table, trained or fixed
enum class Activation { gelu, relu };          // the MLP's
// How the weights are drawn. uniform: PyTorch's modules' own (Linear U(±1/√in), tables N(0, 1));
// normal: as Nanda et al.'s modular-addition model, every weight N(0, 1/d_model) but the head's,
// N(0, 1/n_classes), and every bias 0 (LayerNorms 1 and 0 either way).
enum class Init { uniform, normal };

struct TransformerConfig {
  // The largest sizes a config.json may give (memory refuses most such models long before).
  static constexpr std::size_t max_width = 1'000'000, max_layers = 10'000;

  std::size_t vocab_size = 0;  // token ids 0 … vocab_size − 1
  std::size_t n_classes = 0;   // of the token readout's logits; 0 for the pointer readout
  std::size_t max_len = 0;     // positions
  Readout readout = Readout::token;
  bool causal = true;          // every layer's attention; false: bidirectional
  std::vector<bool> causal_layers{};  // per layer, overriding `causal`; empty: every layer `causal`
  std::size_t layers = 2, d_model = 16, heads = 2;
  std::size_t d_head = 0;      // 0: d_model / heads
  std::size_t kv_heads = 0;    // 0: heads (GQA/MQA below)
  QK qk = QK::untied;
  Projection proj = Projection::learned;
  bool scale = true;           // scores scaled by 1/√d_head; false: not scaled
  bool mlp = false;            // an MLP after each attention
  std::size_t d_mlp = 0;       // the MLP's hidden width; 0: 4·d_model
  Activation activation = Activation::gelu;
  bool layer_norm = true;      // false: no LayerNorm anywhere (ln1, ln2 and ln_final are the identity)
  bool attention_bias = true;  // false: the q, k, v and out projections have no biases
  Init init = Init::uniform;
  Positions positions = Positions::learned;
  // Token and position embeddings and every LayerNorm stay at their init: only the attention
  // projections, the MLPs and the head train.
  bool frozen_embeddings = false;
  DType dtype = DType::float32;  // of the parameters when built (not in config.json: load_transformer takes the
                                 // weights' own)
};

// A config that cannot build a model: `field` names the config field at fault ("heads").
struct ConfigError : std::invalid_argument {
  ConfigError(std::string field, const std::string& message);
  std::string field;
};

// Throws ConfigError for a config that cannot build a model: a size of 0, heads that do not divide
// d_model (without d_head), kv_heads that do not divide heads, n_classes 0 with the token readout
// (or not 0 with the pointer one), tied, symmetric or identity projections with shared kv heads,
// symmetric q and k with d_head 1, identity
// projections whose heads do not tile d_model.
void check(const TransformerConfig& config);

// Each head's query/key width: d_head, or d_model / heads when d_head is 0.
std::size_t head_dim(const TransformerConfig& config);

// Whether layer l's attention is causal: causal_layers[l], or `causal` when that is empty.
bool layer_is_causal(const TransformerConfig& config, std::size_t l);

// Whether every head's scores are symmetric, S = Sᵀ: tied, symmetric and identity heads.
bool symmetric_scores(const TransformerConfig& config);

// The number of parameter elements a model of this config has (a double: absurd configs must
// not wrap), so that memory can be checked before anything is allocated.
double parameter_count(const TransformerConfig& config);

// The config as a JSON object (the "model" field of a run's config.json), and back. The reader
// checks every field's type and range and refuses unknown ones: std::runtime_error naming `file`
// and the field, prefixed by `prefix` ("model.").
std::string to_json(const TransformerConfig& config);
TransformerConfig parse_transformer_config(std::string_view json, const std::string& file,
                                           const std::string& prefix = "");

// Names as config.json writes them, and back: every value of each option, and the value of a name.
const char* name_of(Readout readout);
const char* name_of(QK qk);
const char* name_of(Projection proj);
const char* name_of(Positions positions);
const char* name_of(Activation activation);
const char* name_of(Init init);
inline constexpr Readout all_readouts[] = {Readout::token, Readout::pointer};
inline constexpr QK all_qk[] = {QK::untied, QK::tied, QK::symmetric};
inline constexpr Projection all_projections[] = {Projection::learned, Projection::frozen, Projection::identity,
                                                 Projection::identity_qk};
inline constexpr Positions all_positions[] = {Positions::learned, Positions::sinusoidal};
inline constexpr Activation all_activations[] = {Activation::gelu, Activation::relu};
inline constexpr Init all_inits[] = {Init::uniform, Init::normal};
template <class E, std::size_t N>
std::optional<E> from_name(const E (&values)[N], std::string_view name) {
  for (E e : values)
    if (name == name_of(e)) return e;
  return std::nullopt;
}
template <class E, std::size_t N>
std::vector<std::string> names_of(const E (&values)[N]) {
  std::vector<std::string> names;
  for (E e : values) names.push_back(name_of(e));
  return names;
}

// A block's MLP: proj(act(fc(x))), fc d_model → d_hidden (0: 4·d_model) and proj back, through its
// points hook_pre (fc's output) and hook_post (after the activation), (B, T, d_hidden) each.
class MLP : public Module {
 public:
  MLP(std::size_t d_model, DType dtype, Generator& gen, std::size_t d_hidden = 0,
      Activation activation = Activation::gelu);
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  Linear fc, proj;
  HookPoint hook_pre, hook_post;
  Activation activation;
};

// What a block's LayerNorms and MLP are: the fields of a config that shape them.
struct BlockShape {
  std::size_t d_model = 0;
  DType dtype = DType::float32;
  bool mlp = false;
  std::size_t d_mlp = 0;  // 0: 4·d_model
  Activation activation = Activation::gelu;
  bool layer_norm = true;
};

// What the blocks of both models share: the residual stream's points and the LayerNorm before
// the first attention, and the MLP after the attention(s):
//   hook_resid_pre, ln1.hook_normalized, … the block's attention(s) …, then with the MLP
//   hook_resid_mid, ln2.hook_normalized, mlp.hook_pre, mlp.hook_post, hook_mlp_out, and last
//   hook_resid_post: each (B, T, width).
class ResidualBlock : public Module {
 public:
  std::unique_ptr<LayerNorm> ln1;  // none without LayerNorm
  std::unique_ptr<LayerNorm> ln2;  // with the MLP and LayerNorm
  std::unique_ptr<MLP> mlp;
  HookPoint hook_resid_pre, ln1_normalized, hook_resid_mid, ln2_normalized, hook_mlp_out, hook_resid_post;
  // ln1(x) through ln1.hook_normalized: what the block's (first) attention reads; x itself
  // (through the point) without LayerNorm.
  Tensor normalized_input(const Tensor& x) const;

 protected:
  explicit ResidualBlock(const BlockShape& shape);
  // Registers hook_resid_pre, ln1 and ln1.hook_normalized: before the block's attention.
  void register_input();
  // With the MLP, draws it from `gen` and registers hook_resid_mid, ln2, ln2.hook_normalized,
  // mlp and hook_mlp_out; then hook_resid_post.
  void register_output(Generator& gen);
  // x + mlp(ln2(x)) through the points (x without the MLP), then hook_resid_post.
  Tensor output(const Tensor& x) const;

 private:
  BlockShape shape_;
};

class TransformerBlock : public ResidualBlock {
 public:
  TransformerBlock(const TransformerConfig& config, Generator& gen);
  MultiHeadAttention attn;
  HookPoint hook_attn_out;  // the attention's output, after ln1.hook_normalized and attn.hook_q … hook_z

  // The block on the residual stream x (B, T, d_model), through its hooks: x + attn(ln1(x)), then
  // x + mlp(ln2(x)) with the MLP. `attention` receives the attention's result, `input` what it
  // read, ln1(x); with `cache`, the attention also reads the earlier positions' keys and values
  // there, and appends these.
  Tensor forward(const Tensor& x, const AttentionMask& mask, bool need_weights, AttentionResult* attention = nullptr,
                 Tensor* input = nullptr, KVCache* cache = nullptr) const;
  // The block's output at the last position alone, (B, 1, d_model): the attention reads every
  // position's keys and values but runs the last query only, and the MLP runs there alone.
  Tensor forward_last(const Tensor& x, const AttentionMask& mask) const;
  // forward (or forward_last when last_only) on the stream x = table[rows], table (N, d_model) and
  // rows (B, T): layer 0 of a model whose stream starts as a token's embedding plus its position's,
  // N = vocabulary · T rows. ln1 and the attention's projections run on the table's N rows and are
  // gathered (MultiHeadAttention::forward_gathered). `input` receives ln1(x). Only when gathers().
  Tensor forward_gathered(const Tensor& table, const IndexArray& rows, const AttentionMask& mask, bool last_only,
                          Tensor* input = nullptr) const;
  // Whether forward_gathered gives forward's result: no hook before the attention's output sees the
  // (B, T) stream, and q, k and v are projections.
  bool gathers() const;
};

namespace detail {
// The options of a block's attention.
MultiHeadAttentionOptions attention_options(const TransformerConfig& config);
// The shape of a block's LayerNorms and MLP.
BlockShape block_shape(const TransformerConfig& config);
// Token embeddings plus rows offset … offset + T − 1 of the position table, through the points
// `embed` and `pos_embed` (which see the positions per sequence, (B, T, D)).
Tensor embed(const Embedding& tok, const Tensor& table, const HookPoint& embed, const HookPoint& pos_embed,
             const IndexArray& tokens, std::size_t offset = 0);
// How many runs so far (on any thread) projected layer 0 once per (token, position) pair and
// gathered the rows, rather than projecting every position: the path taken, for tests to see.
std::uint64_t gathered_runs();
}  // namespace detail

// What Transformer::run_with_cache returns: the forward's output, and the activation at each hook
// point, in the order the forward reached them, detached from the graph.
struct ActivationCache;

struct TransformerOutput {
  Tensor logits;                           // (B, T, n_classes), or (B, T, T) head-0 scores (pointer)
  std::vector<AttentionResult> attention;  // per layer; weights and scores with need_weights
  std::vector<Tensor> inputs;              // per layer: what its attention read, ln1(x)
};

class Transformer : public Module {
 public:
  // Checks the config (ConfigError), then draws the parameters from `gen`.
  explicit Transformer(const TransformerConfig& config, Generator& gen = default_generator());

  // tokens (B, T) with T ≤ max_len and ids < vocab_size (else std::invalid_argument).
  // key_padding (B, T): false for a padding position, which no query attends (0-d: none).
  TransformerOutput forward(const IndexArray& tokens, bool need_weights = false,
                            const MaskArray& key_padding = MaskArray()) const;
  // forward's logits at the last position alone, (B, 1, n_classes), for a loss scored there only:
  // the last layer projects every position's keys and values but runs its query, its MLP and the
  // readout at the last position alone. The token readout only (else std::invalid_argument). Hooks
  // of the last layer see that position alone.
  TransformerOutput forward_last(const IndexArray& tokens, const MaskArray& key_padding = MaskArray()) const;
  // Whether layer l's attention is causal.
  bool causal(std::size_t l) const;
  // forward for the next positions of sequences whose earlier positions `cache` holds (one KVCache
  // per layer; empty ones at the start, filled as it goes): tokens (B, T_new) sit at positions
  // cache length … cache length + T_new − 1. The logits equal those of forward on the whole
  // sequence at these positions. Needs a causal model with the token readout (else
  // std::invalid_argument: check_decodable). A call that throws leaves the cache as it was.
  TransformerOutput forward_cached(const IndexArray& tokens, std::vector<KVCache>& cache) const;
  // Throws std::invalid_argument unless every layer is causal and the readout is token: what
  // decoding one position at a time needs.
  void check_decodable() const;
  // Mean cross-entropy of the logits against targets (B, T), over positions whose target is not
  // ignore_index. For the pointer readout a target is a key position.
  Tensor loss(const TransformerOutput& output, const IndexArray& targets, std::int64_t ignore_index = -100) const;
  // argmax over the last dimension: (B, T).
  static IndexArray predictions(const Tensor& logits);

  const TransformerConfig& config() const { return config_; }

  // Hook points (hooks.hpp), as TransformerLens names them, in the order a forward reaches them
  // (Module::hook_names lists them, add_hook and reset_hooks hook them): hook_embed and
  // hook_pos_embed (B, T, d_model), then per layer L the block's points blocks.L.hook_resid_pre,
  // blocks.L.ln1.hook_normalized, the attention's blocks.L.attn.hook_q … hook_z, blocks.L.hook_attn_out
  // and so on (see ResidualBlock, TransformerBlock and MultiHeadAttention), and, with the token
  // readout, ln_final.hook_normalized.
  //
  // forward with `hooks` added for this call only (the model's own hooks run first); a name that
  // is no point is an error before anything runs.
  TransformerOutput run_with_hooks(const IndexArray& tokens, const NamedHooks& hooks, bool need_weights = false,
                                   const MaskArray& key_padding = MaskArray());
  // forward, keeping the activation at every hook point `keep` keeps (all without it: a predicate
  // on the name or a list of names), as the model goes on with it (after the model's own hooks).
  // Attention runs op by op while hooked, so in float32 the output may differ from forward's in
  // the last bits.
  ActivationCache run_with_cache(const IndexArray& tokens, const HookFilter& keep = {},
                                 const MaskArray& key_padding = MaskArray());

  // The table of positions added to the token embeddings, (max_len, d_model): pos.weight, or the
  // fixed sinusoids.
  Tensor position_table() const;

  Embedding tok;
  std::unique_ptr<LearnedPositionalEncoding> pos;           // learned positions
  std::unique_ptr<SinusoidalPositionalEncoding> sinusoids;  // fixed positions
  std::vector<std::unique_ptr<TransformerBlock>> blocks;
  std::unique_ptr<LayerNorm> ln_final;  // none without LayerNorm
  std::unique_ptr<Linear> head;  // token readout only
  HookPoint hook_embed, hook_pos_embed, ln_final_normalized;

 protected:
  const char* type_name() const override { return "Transformer"; }

 private:
  TransformerConfig config_;
  TransformerOutput run(const IndexArray& tokens, bool need_weights, const MaskArray& key_padding,
                        std::vector<KVCache>* cache, bool last_only = false) const;
};

struct ActivationCache : Activations {
  TransformerOutput output;
};

// DIR/config.json as {"model": CONFIG}, written atomically.
void save_config(const std::string& dir, const TransformerConfig& config);
// The "model" field of DIR/config.json (other fields are the writer's own, e.g. the qkv program's
// training options); std::runtime_error naming the file and the field at fault.
TransformerConfig load_config(const std::string& dir);
// The model of a run folder: built from DIR/config.json with the committed checkpoint's weights
// (see checkpoint.hpp), in the dtype they were saved in; std::runtime_error naming the file at
// fault, or config.json when the weights would not fit in the memory available.
std::unique_ptr<Transformer> load_transformer(const std::string& dir);

}  // namespace qkv::nn
