#include <algorithm>
#include <sstream>

#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/registry.hpp"

namespace qkv::tasks {

InductionTask::InductionTask(std::size_t vocab, std::size_t min_block, std::size_t max_block)
    : vocab_(vocab), min_block_(min_block), max_block_(max_block) {
  if (min_block < 2 || max_block < min_block || max_block > vocab)
    fail("induction", "blocks need 2 ≤ min_block ≤ max_block ≤ vocab (got {}, {}, {})", min_block, max_block, vocab);
  info_ = {.name = "induction",
           .description = fmt::format("a block of {}-{} distinct tokens of {} repeated twice: predict the second copy",
                                      min_block, max_block, vocab),
           .vocab_size = vocab, .n_classes = vocab, .max_len = 2 * max_block, .readout = nn::Readout::token, .causal = true};
}

namespace {

// n distinct tokens of `pool`, in a random order: its first n, once drawn.
void draw_distinct(std::vector<std::int64_t>& pool, std::size_t n, Generator& gen) {
  for (std::size_t i = 0; i < n; ++i) std::swap(pool[i], pool[i + gen.next_u64() % (pool.size() - i)]);
}

std::vector<std::int64_t> all_tokens(std::size_t vocab) {
  std::vector<std::int64_t> pool(vocab);
  for (std::size_t i = 0; i < vocab; ++i) pool[i] = std::int64_t(i);
  return pool;
}

}  // namespace

Batch InductionTask::sample(std::size_t batch_size, Generator& gen) const {
  const std::size_t n = min_block_ + std::size_t(gen.next_u64() % (max_block_ - min_block_ + 1));
  Batch batch{filled(batch_size, 2 * n, 0), filled(batch_size, 2 * n, ignore_target)};
  for (std::size_t b = 0; b < batch_size; ++b) {
    std::vector<std::int64_t> pool = all_tokens(vocab_);
    draw_distinct(pool, n, gen);
    for (std::size_t t = 0; t < 2 * n; ++t) batch.tokens(b, t) = pool[t % n];
    for (std::size_t t = n; t + 1 < 2 * n; ++t) batch.targets(b, t) = batch.tokens(b, t + 1);
  }
  return batch;
}

std::string InductionTask::decode(const std::vector<std::int64_t>& tokens) const { return numbers_text(tokens); }

std::vector<std::int64_t> InductionTask::encode(const std::string& text) const {
  return parse_numbers(text, vocab_, "induction");
}

std::string InductionTask::token_name(std::int64_t token) const { return std::to_string(token); }

TaskSpec induction_task() {
  return {.name = "induction",
          .make = [](std::size_t) { return std::make_unique<InductionTask>(); },
          .defaults =
              [](TrainOptions& o) {
                // One head per layer: a previous-token head, then an induction head, each of which
                // the task needs. With two heads per layer, seeds share the work between heads
                // (`qkv ablate` finds no head needed alone in 4 of 10 seeds).
                o.model.layers = 2;
                o.model.heads = 1;
                o.model.d_model = 32;
                o.steps = 1500;
              },
          .target = 0.95,
          // The second copy unchanged after a first copy of other tokens, none of the second's: a
          // model that reads the first copy to predict the second finds no answer there.
          .corruption = Corruption{.description = "the first copy drawn afresh from the other tokens",
                                   .make = [](const Task& task, const Batch& clean, Generator& gen) {
                                     IndexArray tokens = clean.tokens;
                                     const std::size_t n = tokens.shape()[1] / 2;
                                     for (std::size_t b = 0; b < tokens.shape()[0]; ++b) {
                                       std::vector<std::int64_t> pool;
                                       for (std::int64_t t : all_tokens(task.info().vocab_size))
                                         if (std::find(&tokens(b, 0), &tokens(b, 0) + n, t) == &tokens(b, 0) + n) pool.push_back(t);
                                       if (pool.size() < n)
                                         fail("induction", "a block of {} tokens of {} leaves {} others to corrupt it with",
                                              n, task.info().vocab_size, pool.size());
                                       draw_distinct(pool, n, gen);
                                       for (std::size_t t = 0; t < n; ++t) tokens(b, t) = pool[t];
                                     }
                                     return tokens;
                                   }}};
}

}  // namespace qkv::tasks
