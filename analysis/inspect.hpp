#pragma once
// `qkv inspect DIR`: what each head of a trained model learned. Per head: the projections, the
// QK circuit A = W_q W_kᵀ (its symmetric share σ, antisymmetry, spectrum), the OV circuit, and
// tables of the scores between tokens and between positions; on one input, the attention
// pattern and the asymmetry of its scores. report/inspect.hpp renders it.
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qkv/analysis/heads.hpp"
#include "qkv/tasks/task.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/nn/circuits.hpp"

namespace qkv::analysis {

using tasks::Task;

struct HeadInspection {
  std::size_t layer = 0, head = 0;
  // W_q(h), W_k(h), W_v(h), W_o(h): shapes and Frobenius norms.
  std::vector<Shape> shapes;
  std::vector<double> norms;
  Array<double> qk;  // A = W_q(h) W_k(h)ᵀ
  double sigma = 0, antisymmetry = 0;
  nn::MatrixSpectrum qk_spectrum;
  Array<double> ov;  // W_v(h) W_o(h)
  nn::MatrixSpectrum ov_spectrum;
  // The scores this head gives when the stream holds only one token's embedding (rows: query
  // token, columns: key token), and only one position's embedding, each after the layer's
  // LayerNorm, biases included, scaled: the direct path from the embeddings.
  Array<double> token_qk, position_qk;
  // On the input: weights and pre-softmax scores (−inf where masked), (T, T).
  Array<double> attention, scores;
  // The input's score asymmetry that softmax can see (nn::softmax_invariant_asymmetry); none under
  // a causal mask, where no two positions see each other both ways.
  std::optional<double> score_asymmetry;
  // Pointer tasks: the mean weight a scored query puts on its target (brackets: a closer on its
  // opener); none when the input is not one the task would generate.
  std::optional<double> target_attention;
  // The head detectors' scores (heads.hpp) on the task's held-out sequences.
  HeadDetection detection;
};

// How much an earlier head's output (its OV circuit) feeds a later head's queries, keys or values:
// nn::composition_score's Q-, K- and V-composition (Elhage et al. 2021).
struct HeadComposition {
  std::size_t from_layer = 0, from_head = 0, to_layer = 0, to_head = 0;
  double q = 0, k = 0, v = 0;
};

// A run's training, from its folder: metrics.jsonl (every logging step) and snapshots.jsonl
// (`train --snapshot-every`; see report/snapshots.hpp and history.hpp).
struct TrainingHistory {
  struct Logged {
    std::size_t step = 0;
    double loss = 0, accuracy = 0;  // on the training batches, means over the logging window
    // A data-set task's: on its whole held-out split after the step.
    std::optional<double> test_loss{}, test_accuracy{};
  };
  struct Snapshot {
    std::size_t step = 0;
    double accuracy = 0;  // held out
    std::vector<std::int64_t> input;
    std::vector<std::vector<double>> sigma;                           // [layer][head]
    std::vector<std::vector<std::optional<double>>> score_asymmetry;  // [layer][head]
    std::vector<std::vector<Array<double>>> attention;                // [layer][head] (T, T), NaN where masked
    std::vector<HeadComposition> composition;
    std::vector<std::pair<std::string, double>> probes;
  };
  std::vector<Logged> logged;
  std::vector<Snapshot> snapshots;
};

// A model's attention on an input at one step of training, and each head's σ: what the page's
// slider shows at that step.
struct StepAttention {
  std::size_t step = 0;
  std::vector<std::vector<Array<double>>> attention;  // [layer][head] (T, T), NaN where masked
  std::vector<std::vector<double>> sigma;             // [layer][head]
};
// The attention of `model` on `input` (as inspect draws it) and each head's σ, labelled `step`.
StepAttention attention_at_step(const nn::Transformer& model, const std::vector<std::int64_t>& input, std::size_t step);

struct Inspection {
  std::string task, dir;
  nn::TransformerConfig config;
  std::vector<std::string> vocabulary;  // token names, by id
  std::vector<std::int64_t> input;      // token ids
  std::vector<std::string> input_names;
  std::string target_name;  // pointer tasks: what a target is called ("opener"); "" otherwise
  std::vector<std::vector<HeadInspection>> layers;
  // Every head of each layer into every head of each later layer, writer by writer.
  std::vector<HeadComposition> composition;
  // How many sequences the head detectors read: held-out ones of the task, or (a task that draws
  // none) the input; 0 when none has 2 tokens.
  std::size_t detection_sequences = 0;
  bool detection_held_out = true;
  TrainingHistory history;  // empty unless the caller reads it (read_history)
  // The attention on the input along training, by step: at each checkpoint the run kept, or at each
  // snapshot when the snapshots read this input; empty unless the caller fills it (inspect_run).
  std::vector<StepAttention> along_training;
  std::string along_training_from;  // what they were read from: "kept checkpoints" or "snapshots"
};

// Head h's matrix of a (1, H, ·, ·) tensor (attention weights or scores), in float64.
Array<double> head_matrix(const Tensor& t, std::size_t h);
// Attention weights as the pictures draw them: NaN where the scores (−inf) mask a key.
Array<double> masked_weights(const Array<double>& weights, const Array<double>& scores);


// A typical sequence of the task: the first of a fixed stream at least 3/4 of the longest length.
std::vector<std::int64_t> typical_input(const Task& task);

// nn::softmax_invariant_asymmetry per layer and head of the pre-softmax scores the model gives
// `input` (one sequence, no padding) under its mask; none for a causal model.
std::vector<std::vector<std::optional<double>>> score_asymmetries(const nn::Transformer& model,
                                                                  const std::vector<std::int64_t>& input);

// Every head of each layer into every head of each later layer, writer by writer.
std::vector<HeadComposition> compositions(const nn::Transformer& model);

// How many of the task's held-out sequences (tasks::held_out_sequences, seed 0) inspect's head
// detectors read (those of 2 tokens or more).
inline constexpr std::size_t inspect_detection_sequences = 64;

// Everything `qkv inspect` shows, for `input` (token ids; at most the model's max_len).
Inspection inspect(const nn::Transformer& model, const Task& task, const std::vector<std::int64_t>& input,
                   const std::string& dir = "");


}  // namespace qkv::analysis
