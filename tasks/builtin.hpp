#pragma once
// The built-in tasks' classes, for their tests and their own files (the program reaches them
// through the registry, task.hpp). Their texts: brackets "([])[]", rps "Ra Pb Sc Ra" (symbol and payload
// letters), induction "3 17 5 3 17 5" (token numbers).
#include "qkv/tasks/registry.hpp"

namespace qkv::tasks {

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

// A relation between items: the numbers 0 … n−1, every one once, in a random order; each points at
// the position of the next value, v + 1 (`line`: an acyclic relation, the largest value points
// nowhere) or v + 1 mod n (`cycle`: rps's relation is the cycle of 3). Tokens are the values;
// bidirectional attention; the readout points (head 0 of the last layer). Text: "3 0 2 1".
class RelationTask : public Task {
 public:
  RelationTask(std::size_t n, bool cyclic);
  const TaskInfo& info() const override { return info_; }
  Batch sample(std::size_t batch_size, Generator& gen) const override;
  std::string decode(const std::vector<std::int64_t>& tokens) const override;
  std::vector<std::int64_t> encode(const std::string& text) const override;
  std::string token_name(std::int64_t token) const override;
  std::optional<std::vector<std::int64_t>> pointer_targets(const std::vector<std::int64_t>& tokens) const override;
  // The value v points at, if any.
  std::optional<std::int64_t> next(std::int64_t v) const;
  std::size_t n() const { return n_; }
  bool cyclic() const { return cyclic_; }

  // What a trained model ranks, on 256 held-out sequences, from its readout's scores (pre-softmax):
  //   top1         share of queries whose highest score is their successor
  //   top1_max     the largest share of one sequence's queries that are right
  //   pairwise     share of (query, other item) pairs where the successor scores higher
  //   alignment    cosine between the antisymmetric part of the readout head's token table
  //                (query token × key token, as inspect shows it) and R − Rᵀ, R the relation
  // On a cycle, a symmetric score (tied, symmetric or identity heads) can put the successor on top
  // for at most n − 1 of a sequence's n queries (docs/experiments.md proves it): a sequence with
  // all n right is reported as a violation, a bug.
  Probe probe(const nn::Transformer& model, std::uint64_t seed) const;
  // The TaskSpec of `line` (sizes 3-16, default 8) or `cycle` (sizes 3, 5, 7, default 5).
  static TaskSpec spec(bool cyclic);

 private:
  std::size_t n_;
  bool cyclic_;
  TaskInfo info_;
};

// reverse and sort: a source of min_len … max_len numbers below `values` (distinct ones for sort),
// whose output is the source reversed (each output token aligned with the mirrored position) or
// sorted ascending (aligned with the position that holds its value: a permutation that depends on
// the content). Source tokens are the numbers and the padding `values`; output tokens the numbers,
// start `values` and end `values` + 1. Text: "3 0 2 1".
class NumbersTask : public Seq2SeqTask {
 public:
  enum class Order { reversed, sorted };
  NumbersTask(Order order, std::size_t values, std::size_t min_len, std::size_t max_len);
  Seq2SeqExample draw(Generator& gen) const override;
  std::optional<Seq2SeqExample> example(const std::vector<std::int64_t>& source) const override;
  std::string decode(const std::vector<std::int64_t>& tokens) const override;
  std::vector<std::int64_t> encode(const std::string& text) const override;
  std::string token_name(std::int64_t token) const override;
  std::string source_token_name(std::int64_t token) const override;

 private:
  Order order_;
  std::size_t values_, min_len_, max_len_;
};

// translate: an English-like sentence, subject verb object ("big cat chases mouse", each noun with
// an optional adjective), into a Japanese-like one with the verb last, subject object verb
// ("ookii neko nezumi ou"), word by word through a fixed dictionary. Each output word is aligned
// with the word it translates: in order but for the verb, whose place depends on the adjectives.
class TranslateTask : public Seq2SeqTask {
 public:
  TranslateTask();
  Seq2SeqExample draw(Generator& gen) const override;
  std::optional<Seq2SeqExample> example(const std::vector<std::int64_t>& source) const override;
  std::string decode(const std::vector<std::int64_t>& tokens) const override;
  std::vector<std::int64_t> encode(const std::string& text) const override;
  std::string token_name(std::int64_t token) const override;
  std::string source_token_name(std::int64_t token) const override;
};

// modadd: "a b =" → (a + b) mod p, read at "=" (modadd.cpp). Tokens 0 … p − 1 are the numbers, p
// is "="; p + 1 classes. Text: "3 17 =".
class ModAddTask : public DatasetTask {
 public:
  ModAddTask(std::size_t p, double train_fraction, std::uint64_t seed);
  std::string decode(const std::vector<std::int64_t>& tokens) const override;
  std::vector<std::int64_t> encode(const std::string& text) const override;
  std::string token_name(std::int64_t token) const override;
  std::size_t p() const { return p_; }

 private:
  std::size_t p_;
};

}  // namespace qkv::tasks
