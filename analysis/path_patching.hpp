#pragma once
// Path patching (Wang et al. 2022, "Interpretability in the wild"): how much of a metric flows
// from one head (the sender) along one path alone, into a later head's queries, keys or values
// (the receiver) or straight into the logits. On the task's held-out sequences and their
// corruption (patching.hpp), in the direction patching takes:
//
//   1. the base run (noising: clean; denoising: corrupted) with the sender's output (hook_z) taken
//      from the other run, and every head of every later layer held at its base-run output; the
//      MLPs are run, not held. The logits of this run are the sender's direct path
//      ("sender → logits"); its receivers' q, k and v are kept.
//   2. per receiver and input (q, k or v): the base run with only that head's q, k or v taken
//      from step 1. The metric here is the path "sender → receiver.q" (or k, v).
//
// A share is read as patching's (Patching::share). With shared kv heads (kv_heads < heads), a
// receiver's k or v is its kv head's, which the heads of its group read.
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/analysis/patching.hpp"

namespace qkv::analysis {

struct PathPatchOptions {
  bool noising = false;  // the clean run with the sender's corrupted output; else denoising
  std::size_t sequences = 256;
  std::uint64_t seed = 1;
  bool mask_padding = true;
};

struct PathPatching {
  std::string task, dir, corruption, direction;
  std::size_t sequences = 0, length = 0;
  std::uint64_t seed = 0;
  PatchScore clean, corrupted;
  struct Path {
    std::size_t sender_layer = 0, sender_head = 0;
    std::size_t receiver_layer = 0, receiver_head = 0;  // receiver_layer == layers: the logits
    std::string input;                                   // "q", "k", "v", or "logits"
    // The head slice patched: the receiver's own for q, its kv head for k and v (the heads of a group
    // share that path, and its score).
    std::size_t receiver_slice = 0;
    PatchScore patched;
  };
  // Per sender, in layer and head order: its path into the logits, then into each head of each
  // later layer, q, k and v.
  std::vector<Path> paths;
  double loss_share(const Path& path) const {
    return Patching::share(path.patched.loss, clean.loss, corrupted.loss, direction == "noising");
  }
};

// Every path of `model` from each head of a layer into the logits and into each head's q, k and
// v in each later layer (a model of one layer has the paths into the logits alone).
PathPatching path_patch(nn::Transformer& model, const tasks::Task& task, const tasks::Corruption& corruption,
                        const PathPatchOptions& options);

}  // namespace qkv::analysis
