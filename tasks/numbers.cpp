#include <algorithm>
#include <numeric>

#include "qkv/tasks/builtin.hpp"

namespace qkv::tasks {

NumbersTask::NumbersTask(Order order, std::size_t values, std::size_t min_len, std::size_t max_len)
    : order_(order), values_(values), min_len_(min_len), max_len_(max_len) {
  const char* name = order == Order::reversed ? "reverse" : "sort";
  if (min_len < 1 || max_len < min_len || (order == Order::sorted && max_len > values))
    fail(name, "lengths need 1 ≤ min_len ≤ max_len{} (got {}, {}, {} values)", order == Order::sorted ? " ≤ values" : "",
         min_len, max_len, values);
  const std::int64_t v = std::int64_t(values);
  info_ = {.name = name,
           .description = order == Order::reversed
                              ? fmt::format("{}-{} numbers below {}: write them reversed", min_len, max_len, values)
                              : fmt::format("{}-{} distinct numbers below {}: write them sorted", min_len, max_len, values),
           .vocab_size = values + 2, .n_classes = values + 2, .max_len = max_len + 1, .readout = nn::Readout::token,
           .causal = true, .pad = v + 1,
           .seq2seq = Seq2SeqInfo{.source_vocab = values + 1, .max_source_len = max_len, .source_pad = v, .start = v, .end = v + 1}};
}

Seq2SeqExample NumbersTask::draw(Generator& gen) const {
  const std::size_t n = min_len_ + std::size_t(gen.next_u64() % (max_len_ - min_len_ + 1));
  std::vector<std::int64_t> source(n);
  if (order_ == Order::reversed) {
    for (std::int64_t& t : source) t = std::int64_t(gen.next_u64() % values_);
  } else {  // n distinct values, in a random order: the first n of a partial shuffle
    std::vector<std::int64_t> pool(values_);
    std::iota(pool.begin(), pool.end(), 0);
    for (std::size_t i = 0; i < n; ++i) std::swap(pool[i], pool[i + gen.next_u64() % (values_ - i)]);
    source.assign(pool.begin(), pool.begin() + std::ptrdiff_t(n));
  }
  return *example(source);
}

std::optional<Seq2SeqExample> NumbersTask::example(const std::vector<std::int64_t>& source) const {
  const std::size_t n = source.size();
  if (n < min_len_ || n > max_len_) return std::nullopt;
  for (std::int64_t t : source)
    if (t < 0 || std::size_t(t) >= values_) return std::nullopt;
  Seq2SeqExample e{.source = source, .output = {}, .alignment = {}};
  std::vector<std::size_t> order(n);  // the source position of each output token
  std::iota(order.begin(), order.end(), 0);
  if (order_ == Order::reversed) {
    std::reverse(order.begin(), order.end());
  } else {
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return source[a] < source[b]; });
    for (std::size_t i = 1; i < n; ++i)
      if (source[order[i]] == source[order[i - 1]]) return std::nullopt;  // sort's values are distinct
  }
  for (std::size_t i : order) {
    e.output.push_back(source[i]);
    e.alignment.push_back({i});
  }
  return e;
}

std::string NumbersTask::decode(const std::vector<std::int64_t>& tokens) const {
  std::vector<std::int64_t> numbers;
  for (std::int64_t t : tokens) {
    if (t == info_.seq2seq->end) break;
    if (t >= 0 && std::size_t(t) < values_) numbers.push_back(t);
  }
  return numbers_text(numbers);
}

std::vector<std::int64_t> NumbersTask::encode(const std::string& text) const { return parse_numbers(text, values_, info_.name); }

std::string NumbersTask::token_name(std::int64_t token) const {
  return token == info_.seq2seq->start ? "BOS" : token == info_.seq2seq->end ? "EOS" : std::to_string(token);
}

std::string NumbersTask::source_token_name(std::int64_t token) const {
  return token == info_.seq2seq->source_pad ? "pad" : std::to_string(token);
}

}  // namespace qkv::tasks
