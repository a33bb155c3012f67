#include "qkv/tasks/task.hpp"

#include <sstream>

#include <fmt/format.h>



namespace qkv::tasks {

IndexArray filled(std::size_t rows, std::size_t cols, std::int64_t value) {
  IndexArray a = IndexArray::from_shape({rows, cols});
  a.fill(value);
  return a;
}

IndexArray one_row(const std::vector<std::int64_t>& tokens) {
  IndexArray row = IndexArray::from_shape({1, tokens.size()});
  std::copy(tokens.begin(), tokens.end(), row.begin());
  return row;
}

std::string numbers_text(const std::vector<std::int64_t>& tokens) {
  std::string text;
  for (std::int64_t t : tokens) {
    if (!text.empty()) text += ' ';
    text += std::to_string(t);
  }
  return text;
}

std::string names_text(const Task& task, const std::vector<std::int64_t>& tokens) {
  std::string text;
  for (std::int64_t t : tokens) {
    if (!text.empty()) text += ' ';
    text += task.token_name(t);
  }
  return text;
}

std::vector<std::int64_t> parse_numbers(const std::string& text, std::size_t n, const std::string& task) {
  std::vector<std::int64_t> tokens;
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    const auto v = parse_count(w);
    if (!v || *v >= n) fail(task, "cannot read '{}' in \"{}\": tokens are numbers 0-{}", w, text, n - 1);
    tokens.push_back(std::int64_t(*v));
  }
  return tokens;
}

std::vector<std::int64_t> encode_input(const Task& task, const std::string& text, std::size_t positions) {
  const std::vector<std::int64_t> input = task.encode(text);
  if (input.empty()) throw std::invalid_argument("holds no tokens");
  if (input.size() > positions)
    throw std::invalid_argument(fmt::format("{} tokens, but the model has {} positions", input.size(), positions));
  return input;
}

Metrics score(const IndexArray& predictions, const Batch& batch) {
  if (predictions.shape() != batch.targets.shape())
    fail("score", "predictions of shape {} for targets of shape {}", to_string(to_shape(predictions.shape())),
         to_string(to_shape(batch.targets.shape())));
  const std::size_t B = batch.targets.shape()[0], T = batch.targets.shape()[1];
  std::size_t correct = 0, sequences = 0, exact = 0;
  Metrics m;
  for (std::size_t b = 0; b < B; ++b) {
    std::size_t scored = 0, right = 0;
    for (std::size_t t = 0; t < T; ++t) {
      if (batch.targets(b, t) == ignore_target) continue;
      ++scored;
      right += predictions(b, t) == batch.targets(b, t);
    }
    m.scored += scored;
    correct += right;
    if (scored > 0) {
      ++sequences;
      exact += right == scored;
    }
  }
  m.accuracy = m.scored ? double(correct) / double(m.scored) : 0;
  m.exact_match = sequences ? double(exact) / double(sequences) : 0;
  m.sequences = sequences;
  return m;
}

void MetricsSum::add(const Metrics& m) {
  correct_ += m.accuracy * double(m.scored);
  exact_ += m.exact_match * double(m.sequences);
  scored_ += m.scored;
  sequences_ += m.sequences;
}

Metrics MetricsSum::result() const {
  return {.accuracy = scored_ ? correct_ / double(scored_) : 0,
          .exact_match = sequences_ ? exact_ / double(sequences_) : 0,
          .scored = scored_,
          .sequences = sequences_};
}

Batch Seq2SeqTask::sample(std::size_t batch_size, Generator& gen) const {
  std::vector<Seq2SeqExample> examples;
  for (std::size_t b = 0; b < batch_size; ++b) examples.push_back(draw(gen));
  return batch(examples);
}

Batch Seq2SeqTask::batch(const std::vector<Seq2SeqExample>& examples) const {
  const Seq2SeqInfo& s = sides();
  std::size_t S = 0, T = 0;
  for (const Seq2SeqExample& e : examples) {
    if (e.source.size() > s.max_source_len || e.output.size() + 1 > info().max_len)
      fail(info().name, "an example of {} source and {} output tokens, beyond the task's {} and {}", e.source.size(),
           e.output.size(), s.max_source_len, info().max_len - 1);
    S = std::max(S, e.source.size());
    T = std::max(T, e.output.size() + 1);
  }
  const std::size_t B = examples.size();
  Batch batch{filled(B, T, s.end), filled(B, T, ignore_target), filled(B, S, s.source_pad)};
  for (std::size_t b = 0; b < B; ++b) {
    const Seq2SeqExample& e = examples[b];
    std::copy(e.source.begin(), e.source.end(), batch.source.data() + b * S);
    batch.tokens(b, 0) = s.start;
    for (std::size_t t = 0; t < e.output.size(); ++t) {
      batch.targets(b, t) = e.output[t];
      batch.tokens(b, t + 1) = e.output[t];
    }
    batch.targets(b, e.output.size()) = s.end;
  }
  return batch;
}

const Seq2SeqTask* as_seq2seq(const Task& task) { return dynamic_cast<const Seq2SeqTask*>(&task); }

std::vector<std::string> token_names(const Task& task) {
  std::vector<std::string> names;
  for (std::size_t t = 0; t < task.info().vocab_size; ++t) names.push_back(task.token_name(std::int64_t(t)));
  return names;
}

}  // namespace qkv::tasks

namespace qkv::tasks {

Batch select_rows(const Batch& batch, const std::vector<std::size_t>& rows) {
  const std::size_t B = batch.tokens.shape()[0], T = batch.tokens.shape()[1];
  Batch out{.tokens = IndexArray::from_shape({rows.size(), T}), .targets = IndexArray::from_shape({rows.size(), T})};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= B) fail("select_rows", "row {} of a batch of {}", rows[i], B);
    std::copy_n(&batch.tokens(rows[i], 0), T, &out.tokens(i, 0));
    std::copy_n(&batch.targets(rows[i], 0), T, &out.targets(i, 0));
  }
  return out;
}

namespace {

// batch_size distinct rows of `rows` at random (the first of a partial shuffle); all of them, in
// order, for as many as it has.
Batch draw_rows(const TaskInfo& info, const Batch& rows, const char* split, std::size_t batch_size, Generator& gen) {
  const std::size_t n = rows.tokens.shape()[0];
  if (batch_size == n) return rows;
  if (batch_size > n)
    fail(info.name, "a batch of {} rows from a {} split of {}: at most {} (the whole split)", batch_size, split, n, n);
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  for (std::size_t i = 0; i < batch_size; ++i) std::swap(order[i], order[i + gen.next_u64() % (n - i)]);
  order.resize(batch_size);
  return select_rows(rows, order);
}

}  // namespace

Batch DatasetTask::sample(std::size_t batch_size, Generator& gen) const {
  return draw_rows(info_, split_.train, "training", batch_size, gen);
}

Batch DatasetTask::sample_held_out(std::size_t batch_size, Generator& gen) const {
  return draw_rows(info_, split_.test, "held-out", batch_size, gen);
}

}  // namespace qkv::tasks
