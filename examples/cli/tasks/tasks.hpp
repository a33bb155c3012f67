#pragma once
// The built-in tasks' classes, for their tests and their own files (the program reaches them
// through the registry, task.hpp). Their texts: brackets "([])[]", rps "Ra Pb Sc Ra" (symbol and payload
// letters), induction "3 17 5 3 17 5" (token numbers).
#include "examples/cli/tasks/task.hpp"

namespace qkv::cli {

// Dyck-2 over () and [], after a BOS token: tokens BOS 0, ( 1, ) 2, [ 3, ] 4, pad 5. Lengths are
// even, uniform in [min_len, max_len]; depth never exceeds max_depth. The target of a closer is
// the position of its opener (BOS is position 0); a random walk opens at depth 0 and closes at
// max_depth or when the remaining length requires it, and otherwise flips a fair coin.
class BracketsTask : public Task {
 public:
  explicit BracketsTask(std::size_t min_len = 4, std::size_t max_len = 24, std::size_t max_depth = 6);
  const TaskInfo& info() const override { return info_; }
  Batch sample(std::size_t batch_size, Generator& gen) const override;
  std::string decode(const std::vector<std::int64_t>& tokens) const override;
  std::vector<std::int64_t> encode(const std::string& text) const override;
  std::string token_name(std::int64_t token) const override;
  std::optional<std::vector<std::int64_t>> pointer_targets(const std::vector<std::int64_t>& tokens) const override;
  // The opener positions of a token row, -100 elsewhere; throws if the brackets do not match.
  static std::vector<std::int64_t> matching_openers(const std::vector<std::int64_t>& tokens);

  static constexpr std::int64_t bos = 0, open_round = 1, close_round = 2, open_square = 3, close_square = 4, pad = 5;

 private:
  std::size_t min_len_, max_len_, max_depth_;
  TaskInfo info_;
};

// Cyclic retrieval: each position holds a symbol R, P or S with a payload a…h; every sequence
// holds all three symbols, and all copies of a symbol carry one payload (the three payloads
// differ). The target at each position is the payload of the symbol that beats its own
// (P beats R, S beats P, R beats S). Bidirectional; a batch's sequences share one length in
// [min_len, max_len]. Token = 8 · symbol + payload.
class RpsTask : public Task {
 public:
  explicit RpsTask(std::size_t min_len = 6, std::size_t max_len = 12);
  const TaskInfo& info() const override { return info_; }
  Batch sample(std::size_t batch_size, Generator& gen) const override;
  std::string decode(const std::vector<std::int64_t>& tokens) const override;
  std::vector<std::int64_t> encode(const std::string& text) const override;
  std::string token_name(std::int64_t token) const override;

  static constexpr std::int64_t n_payloads = 8;

  // On sequences of three items, one of each symbol: the share of queries whose readout score
  // (before softmax) is highest for the item of the symbol that beats theirs, and the largest
  // such share in any one sequence. Symmetric and rank-1 scores cannot exceed 2/3 (see rps.cpp).
  struct BeaterRanking {
    double mean = 0, max = 0;
  };
  static BeaterRanking beater_ranking(const nn::Transformer& model, std::uint64_t seed);

 private:
  std::size_t min_len_, max_len_;
  TaskInfo info_;
};

// Induction: a block of distinct random tokens (length in [min_block, max_block], one per batch)
// repeated twice. Targets are next tokens on the second copy, from its second token on: the
// positions where copying what followed the earlier occurrence is right.
class InductionTask : public Task {
 public:
  explicit InductionTask(std::size_t vocab = 48, std::size_t min_block = 8, std::size_t max_block = 16);
  const TaskInfo& info() const override { return info_; }
  Batch sample(std::size_t batch_size, Generator& gen) const override;
  std::string decode(const std::vector<std::int64_t>& tokens) const override;
  std::vector<std::int64_t> encode(const std::string& text) const override;
  std::string token_name(std::int64_t token) const override;

 private:
  std::size_t vocab_, min_block_, max_block_;
  TaskInfo info_;
};

}  // namespace qkv::cli
