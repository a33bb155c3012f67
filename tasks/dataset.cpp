#include "qkv/tasks/dataset.hpp"

#include <map>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qkv/core/shape.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/files.hpp"

namespace qkv::tasks {

namespace {

constexpr std::size_t max_file_bytes = std::size_t(1) << 30;
constexpr std::size_t max_sequences = 10'000'000;  // as `qkv eval --n`

// A value as a message shows it: at most 40 bytes of its JSON.
std::string shown(const nlohmann::json& v) {
  std::string text = v.dump();
  return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

struct Row {
  std::vector<std::int64_t> tokens, targets, corrupted;
};

// A line's token field: ids in the vocabulary, or the task's text.
std::vector<std::int64_t> read_tokens(const nlohmann::json& field, const std::string& where, const char* name,
                                      const Task& task, std::size_t positions) {
  std::vector<std::int64_t> tokens;
  if (field.is_string()) {
    try {
      tokens = encode_input(task, field.get<std::string>(), positions);
    } catch (const std::invalid_argument& e) {
      fail(where, "'{}': {}", name, e.what());
    }
    return tokens;
  }
  if (!field.is_array()) fail(where, "'{}' is {}, not a list of token ids or the task's text", name, field.type_name());
  if (field.empty()) fail(where, "'{}' holds no tokens", name);
  if (field.size() > positions) fail(where, "'{}' holds {} tokens, but the model has {} positions", name, field.size(), positions);
  const std::size_t vocab = task.info().vocab_size;
  for (std::size_t i = 0; i < field.size(); ++i) {
    const nlohmann::json& v = field[i];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || std::uint64_t(v.get<std::int64_t>()) >= vocab)
      fail(where, "'{}'[{}] is {}, not a token id 0-{}", name, i, shown(v), vocab - 1);
    tokens.push_back(v.get<std::int64_t>());
  }
  return tokens;
}

// A line's targets: one per token, each ignore_target (or null) or a class / key position.
std::vector<std::int64_t> read_targets(const nlohmann::json& field, const std::string& where, const Task& task,
                                       std::size_t length) {
  if (!field.is_array()) fail(where, "'targets' is {}, not a list of one target a token", field.type_name());
  if (field.size() != length) fail(where, "'targets' holds {} values for {} tokens", field.size(), length);
  const bool pointer = task.info().readout == Readout::pointer;
  const std::size_t bound = pointer ? length : task.info().n_classes;
  std::vector<std::int64_t> targets;
  for (std::size_t i = 0; i < field.size(); ++i) {
    const nlohmann::json& v = field[i];
    if (v.is_null()) {
      targets.push_back(ignore_target);
      continue;
    }
    const bool ok = v.is_number_integer() &&
                    (v.get<std::int64_t>() == ignore_target ||
                     (v.get<std::int64_t>() >= 0 && std::uint64_t(v.get<std::int64_t>()) < bound));
    if (!ok)
      fail(where, "'targets'[{}] is {}, not {} 0-{} (or -100 or null where nothing is scored)", i, shown(v),
           pointer ? "a key position" : "a class", bound - 1);
    targets.push_back(v.get<std::int64_t>());
  }
  return targets;
}

IndexArray rows_array(const std::vector<const std::vector<std::int64_t>*>& rows) {
  IndexArray a = IndexArray::from_shape({rows.size(), rows.front()->size()});
  for (std::size_t r = 0; r < rows.size(); ++r) std::copy(rows[r]->begin(), rows[r]->end(), &a(r, 0));
  return a;
}

}  // namespace

std::size_t Dataset::sequences() const {
  std::size_t n = 0;
  for (const Batch& b : batches) n += b.tokens.shape()[0];
  return n;
}

std::size_t Dataset::scored() const {
  std::size_t n = 0;
  for (const Batch& b : batches)
    for (std::int64_t t : b.targets) n += t != ignore_target;
  return n;
}

Dataset read_dataset(const std::string& path, const Task& task, std::size_t positions) {
  const std::string text = nn::read_file(path, max_file_bytes);
  std::vector<Row> rows;
  std::optional<bool> with_corrupted;  // set by the first line
  std::size_t line_number = 0;
  for (std::size_t begin = 0; begin < text.size();) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    const std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{} line {}", path, line_number);
    if (rows.size() == max_sequences) fail(where, "more than {} sequences", max_sequences);
    nlohmann::json j;
    try {
      j = nn::detail::parse_json(line, where, 3);  // an object of lists of numbers, no deeper
    } catch (const std::runtime_error& e) {
      throw std::invalid_argument(e.what());
    }
    if (!j.is_object()) fail(where, "a line is one object {{\"tokens\": ..., \"targets\": ...}}, not {}", j.type_name());
    for (const auto& [key, value] : j.items())
      if (key != "tokens" && key != "targets" && key != "corrupted")
        fail(where, "unknown field '{}' (a line has 'tokens', 'targets' and optionally 'corrupted')", key);
    if (!j.contains("tokens")) fail(where, "'tokens' is missing");
    if (!j.contains("targets")) fail(where, "'targets' is missing");
    Row row;
    row.tokens = read_tokens(j["tokens"], where, "tokens", task, positions);
    row.targets = read_targets(j["targets"], where, task, row.tokens.size());
    if (!with_corrupted) with_corrupted = j.contains("corrupted");
    if (*with_corrupted != j.contains("corrupted"))
      fail(where, "'corrupted' is {} here but {} on line 1: give it on every line or on none",
           j.contains("corrupted") ? "given" : "missing", *with_corrupted ? "given" : "missing");
    if (*with_corrupted) {
      row.corrupted = read_tokens(j["corrupted"], where, "corrupted", task, positions);
      if (row.corrupted.size() != row.tokens.size())
        fail(where, "'corrupted' holds {} tokens and 'tokens' {}: a corrupted sequence is the clean one's length",
             row.corrupted.size(), row.tokens.size());
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) fail(path, "holds no sequences (JSON lines of {{\"tokens\": ..., \"targets\": ...}})");

  // Rows of one length together, in the order of the file, batch_rows at most a batch.
  std::map<std::size_t, std::vector<std::vector<const Row*>>> by_length;
  std::vector<std::pair<std::size_t, std::size_t>> order;  // (length, batch) in the order batches start
  for (const Row& row : rows) {
    auto& groups = by_length[row.tokens.size()];
    if (groups.empty() || groups.back().size() == batch_rows) {
      groups.emplace_back();
      order.emplace_back(row.tokens.size(), groups.size() - 1);
    }
    groups.back().push_back(&row);
  }
  Dataset data;
  data.file = path;
  for (const auto& [length, index] : order) {
    const std::vector<const Row*>& group = by_length[length][index];
    std::vector<const std::vector<std::int64_t>*> tokens, targets, corrupted;
    for (const Row* r : group) tokens.push_back(&r->tokens), targets.push_back(&r->targets), corrupted.push_back(&r->corrupted);
    data.batches.push_back({.tokens = rows_array(tokens), .targets = rows_array(targets)});
    if (*with_corrupted) data.corrupted.push_back(rows_array(corrupted));
  }
  if (*with_corrupted) data.corruption = fmt::format("the corrupted tokens of {}", path);
  if (data.scored() == 0) fail(path, "no target is scored (every target is -100 or null)");
  return data;
}

void write_dataset(const std::string& path, const std::vector<Batch>& batches, const std::vector<IndexArray>& corrupted) {
  if (!corrupted.empty() && corrupted.size() != batches.size())
    fail("write_dataset", "{} corrupted arrays for {} batches", corrupted.size(), batches.size());
  std::string out;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    if (b.targets.shape() != b.tokens.shape() || b.tokens.dimension() != 2 || b.source.dimension() != 0)
      fail("write_dataset", "batch {}: tokens and targets must be (B, T) arrays of one shape, with no source", i);
    if (!corrupted.empty() && corrupted[i].shape() != b.tokens.shape())
      fail("write_dataset", "batch {}: corrupted tokens of another shape than the tokens", i);
    const std::size_t B = b.tokens.shape()[0], T = b.tokens.shape()[1];
    for (std::size_t r = 0; r < B; ++r) {
      const auto row = [&](const IndexArray& a) { return std::vector<std::int64_t>(&a(r, 0), &a(r, 0) + T); };
      nlohmann::json j = {{"tokens", row(b.tokens)}, {"targets", row(b.targets)}};
      if (!corrupted.empty()) j["corrupted"] = row(corrupted[i]);
      out += j.dump() + "\n";
    }
  }
  nn::write_atomically(path, out);
}

}  // namespace qkv::tasks
