#pragma once
// What a model of modular addition (tasks::ModAddTask, "a b =" → (a + b) mod p) learned, in the
// Fourier basis of Z_p, as Nanda et al. ("Progress measures for grokking via mechanistic
// interpretability", 2023) read it: the algorithm a grokked model uses puts a few key frequencies
// ω_k = 2πk/p in its embedding, its attention and its MLP neurons, and computes cos(ω_k(a + b − c))
// for each answer c.
//
//   fourier_basis(p)     (p, p), orthonormal rows: the constant, then cos(ω_k x) and sin(ω_k x) for
//                        k = 1 … ⌊(p − 1)/2⌋, and for even p cos(π x) last
//   embed / unembed      the norm of the embedding's rows of the numbers 0 … p − 1 (and of the
//                        readout's rows of the answers) along each frequency's basis rows
//   neurons              each MLP neuron's activation at "=" over all p² inputs (a, b), in the 2D
//                        basis: the frequency whose terms (those of rows {0, cos k, sin k} in a
//                        and in b, the constant's alone left out) hold most of its variance, and
//                        that share
//   key frequencies      as the paper finds them: the frequencies some neuron's variance is most in
//                        (its best frequency; neurons with no variance aside); and how many
//                        neurons each one explains to at least `threshold` (0.85) of their variance
//   heads                each head's attention from "=" to a, over all p² inputs: the same
//   restricted loss      the loss on all p² pairs of the logits kept along the directions
//                        cos(ω_k(a + b)) and sin(ω_k(a + b)) over the inputs, for the key k, and
//                        their mean over the inputs: what the key frequencies alone compute
//   excluded loss        the loss on the training pairs of the logits with those directions taken
//                        out: what the model does without them
// The losses here read the logits of the p answers (not of "=", which no example has as its
// answer), as the paper's analysis does; training's loss reads all of the readout's classes.
//   weight norm          the sum of the squares of every parameter, which weight decay shrinks
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qkv/analysis/inspect.hpp"
#include "qkv/core/tensor.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/builtin.hpp"

namespace qkv::analysis {

// The real orthonormal Fourier basis of Z_p, (p, p), rows as above; and their names ("const",
// "cos 1", "sin 1", …). std::invalid_argument for p < 2.
Array<double> fourier_basis(std::size_t p);
std::vector<std::string> fourier_basis_names(std::size_t p);
// The frequencies 0 … ⌊p/2⌋, and each one's basis rows: {0} for 0, {2k − 1, 2k}, {p − 1} for p/2.
std::size_t frequency_count(std::size_t p);
std::vector<std::size_t> frequency_rows(std::size_t p, std::size_t k);

// Share of the variance of f (p, p, n), over its first two axes, that frequency k's terms hold, for
// each of the n functions: rows (p, p) in the 2D basis F f Fᵀ, the constant term left out. Each
// function's best frequency and its share.
struct FrequencyShare {
  std::size_t frequency = 0;
  double share = 0;  // 0 for a constant function
};
std::vector<FrequencyShare> best_frequencies(const Array<double>& functions);

struct FourierOptions {
  double threshold = 0.85;  // the share of a neuron's variance one frequency holds, to count it
  // The key frequencies to restrict to and exclude, rather than those found (to follow a run's final
  // ones along training; none at all: an empty list); unset: those found.
  std::optional<std::vector<std::size_t>> key_frequencies{};
};

struct FourierAnalysis {
  std::size_t p = 0;
  std::vector<double> embed, unembed;        // norm per frequency 0 … ⌊p/2⌋
  std::vector<FrequencyShare> neurons;       // the last layer's MLP neurons (none without the MLP)
  std::vector<std::size_t> neurons_per_frequency;  // neurons with share ≥ threshold, per frequency
  std::vector<std::size_t> found;            // key frequencies found (the neurons' best), ascending
  std::vector<std::size_t> key_frequencies;  // those restricted to and excluded (found, or given)
  std::vector<std::vector<FrequencyShare>> heads;  // [layer][head]: attention from "=" to a
  double train_loss = 0, test_loss = 0, train_accuracy = 0, test_accuracy = 0;
  double restricted_loss = 0, restricted_accuracy = 0;  // on all p² pairs
  double excluded_loss = 0, excluded_accuracy = 0;      // on the training pairs
  double weight_norm = 0;
};

// The analysis of a model trained on `task` (its vocabulary and readout: std::invalid_argument
// naming the fault otherwise), on all p² inputs at once.
FourierAnalysis fourier_analysis(nn::Transformer& model, const tasks::ModAddTask& task, const FourierOptions& options = {});

// A run's final model analysed, and, at each checkpoint it kept along training, the same with the
// final model's key frequencies restricted to and excluded (as the paper follows them).
struct FourierRun {
  std::string dir;
  FourierAnalysis final;
  std::vector<std::size_t> steps;      // of the kept checkpoints, ascending
  std::vector<FourierAnalysis> along;  // one a step
};

// Grokking's progress along a run, from its log (every logged step's training and held-out
// accuracy) and its FourierRun (the kept checkpoints):
//   train_99, test_99        the first logged step each accuracy reached 99%
//   restricted, excluded     the kept step from which on the restricted (excluded) loss stays past
//                            half of the way from its first value to its last (half_way_step)
//   weight_norm_peak         the kept step of the largest weight norm, and weight_norm_fall the
//                            step from which on it stays past half of the way from that peak to
//                            its last value
struct Grokking {
  std::optional<std::size_t> train_99, test_99, restricted, excluded, weight_norm_peak, weight_norm_fall;
};
Grokking grokking(const FourierRun& run, const std::vector<TrainingHistory::Logged>& log);

}  // namespace qkv::analysis
