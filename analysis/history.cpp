#include "qkv/analysis/history.hpp"

#include <cmath>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/tasks/train_options.hpp"

namespace qkv::analysis {

using namespace tasks;

namespace {

// A number as JSON writes it, NaN (a diverged run) as null.
double number(const nlohmann::json& j) { return j.is_null() ? NAN : j.get<double>(); }

// A fault in one line of a file, which read_history names with the file and the line.
struct LineFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A whole number in [0, hi]: `what` names it in the fault ("'step'", "'input'[3]"). Read by type: a
// float such as 1e300 is no index, and converting it would be undefined.
std::size_t whole(const nlohmann::json& j, const std::string& what, std::size_t hi) {
  if (!j.is_number_unsigned() || j.get<std::uint64_t>() > hi)
    throw LineFault(fmt::format("{} is {}, not a whole number in [0, {}]", what, j.dump(), hi));
  return j.get<std::size_t>();
}

std::size_t step_of(const nlohmann::json& j) { return whole(j.at("step"), "'step'", max_steps); }

// An array of exactly `n` entries, checked before anything is read from it.
const nlohmann::json& array_of(const nlohmann::json& j, const std::string& what, std::size_t n) {
  if (!j.is_array() || j.size() != n)
    throw LineFault(fmt::format("{} is {}, where the run's config.json has {}", what,
                                j.is_array() ? fmt::format("{} entries", j.size()) : std::string("not an array"), n));
  return j;
}

// The most probes a snapshot keeps: a task's probe measures a handful of numbers.
constexpr std::size_t max_probes = 64;

}  // namespace

std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  if (!std::filesystem::exists(path)) return {};
  return parse_json_lines(nn::read_file(path, std::size_t(1) << 30), path);
}

std::vector<nlohmann::json> parse_json_lines(std::string_view text, const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream lines{std::string(text)};
  std::size_t number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const bool last_cut_short = lines.eof() && !text.ends_with('\n');
    try {
      nlohmann::json j = nn::detail::parse_json(line, fmt::format("{} (line {})", path, number), snapshot_max_depth);
      if (!j.is_object()) throw std::runtime_error(fmt::format("{} (line {}): is a {}, not an object", path, number, j.type_name()));
      out.push_back(std::move(j));
    } catch (const std::runtime_error&) {
      if (!last_cut_short) throw;
    }
  }
  return out;
}

TrainingHistory read_history(const std::string& dir, const nn::TransformerConfig& model) {
  const auto text = [](const std::string& path) {
    return std::filesystem::exists(path) ? nn::read_file(path, std::size_t(1) << 30) : std::string();
  };
  return parse_history(text(dir + "/metrics.jsonl"), text(dir + "/snapshots.jsonl"), model, dir);
}

TrainingHistory parse_history(std::string_view metrics, std::string_view snapshots, const nn::TransformerConfig& model,
                              const std::string& dir) {
  TrainingHistory history;
  // Each line's fields, read by type; a fault names the file, the line and the field.
  const auto each_line = [](std::string_view text, const std::string& path, const auto& read) {
    const std::vector<nlohmann::json> lines = parse_json_lines(text, path);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      try {
        read(lines[i]);
      } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(fmt::format("{} (line {}): {}", path, i + 1, e.what()));
      } catch (const LineFault& e) {
        throw std::runtime_error(fmt::format("{} (line {}): {}", path, i + 1, e.what()));
      }
    }
  };
  each_line(metrics, dir + "/metrics.jsonl", [&](const nlohmann::json& j) {
    TrainingHistory::Logged line{.step = step_of(j), .loss = number(j.at("loss")), .accuracy = number(j.at("accuracy"))};
    if (j.contains("test_loss")) line.test_loss = number(j.at("test_loss"));
    if (j.contains("test_accuracy")) line.test_accuracy = number(j.at("test_accuracy"));
    history.logged.push_back(line);
  });
  // Every size in a snapshot is the run's own: its layers and heads, an input no longer than its
  // positions, of tokens in its vocabulary.
  const std::size_t L = model.layers, H = model.heads;
  each_line(snapshots, dir + "/snapshots.jsonl", [&](const nlohmann::json& j) {
    TrainingHistory::Snapshot s;
    s.step = step_of(j);
    s.accuracy = number(j.at("accuracy"));
    const nlohmann::json& input = j.at("input");
    if (!input.is_array() || input.empty() || input.size() > model.max_len)
      throw LineFault(fmt::format("'input' is {}, not 1 to {} tokens (the run's max_len)",
                                  input.is_array() ? fmt::format("{} tokens", input.size()) : input.type_name(),
                                  model.max_len));
    for (std::size_t i = 0; i < input.size(); ++i)
      s.input.push_back(std::int64_t(whole(input[i], fmt::format("'input'[{}]", i), model.vocab_size - 1)));
    const std::size_t T = s.input.size();
    for (const nlohmann::json& layer : array_of(j.at("layers"), "'layers'", L)) {
      s.sigma.emplace_back();
      s.score_asymmetry.emplace_back();
      s.attention.emplace_back();
      for (const nlohmann::json& head : array_of(layer.at("heads"), "'heads'", H)) {
        s.sigma.back().push_back(number(head.at("sigma")));
        const nlohmann::json& a = head.at("score_asymmetry");
        s.score_asymmetry.back().push_back(a.is_null() ? std::nullopt : std::optional<double>(number(a)));
        // Its size checked before anything is allocated for it: T rows of T.
        const nlohmann::json& w = head.at("attention");
        if (!w.is_array() || w.size() != T) throw LineFault(fmt::format("an attention of {} rows for {} tokens", w.size(), T));
        for (const nlohmann::json& row : w)
          if (!row.is_array() || row.size() != T) throw LineFault(fmt::format("an attention row of {} for {} tokens", row.size(), T));
        Array<double> m = xt::zeros<double>({T, T});
        for (std::size_t r = 0; r < T; ++r)
          for (std::size_t c = 0; c < T; ++c) m(r, c) = number(w[r][c]);
        s.attention.back().push_back(std::move(m));
      }
    }
    // Each head of a layer into each head of a later one, once.
    const nlohmann::json& composition = j.at("composition");
    // L(L−1)/2 · H² in a double: config.json's limits (10,000 layers of 1,000,000 heads) pass 2^64.
    const double pairs = double(L) * double(L - 1) / 2 * double(H) * double(H);
    if (!composition.is_array() || double(composition.size()) > pairs)
      throw LineFault(fmt::format("'composition' is not an array of at most {:.0f} pairs of heads", pairs));
    for (const nlohmann::json& c : composition) {
      const HeadComposition pair{whole(c.at("from_layer"), "'from_layer'", L - 1), whole(c.at("from_head"), "'from_head'", H - 1),
                                 whole(c.at("to_layer"), "'to_layer'", L - 1),     whole(c.at("to_head"), "'to_head'", H - 1),
                                 number(c.at("q")), number(c.at("k")), number(c.at("v"))};
      if (pair.from_layer >= pair.to_layer)
        throw LineFault(fmt::format("a composition from layer {} into layer {}, not a later one", pair.from_layer, pair.to_layer));
      s.composition.push_back(pair);
    }
    const nlohmann::json& probes = j.at("probes");
    if (!probes.is_object() || probes.size() > max_probes)
      throw LineFault(fmt::format("'probes' is not an object of at most {} numbers", max_probes));
    for (const auto& [key, value] : probes.items()) s.probes.emplace_back(key.substr(0, 64), number(value));
    // Every snapshot of a run has the same heads and input as the first.
    if (!history.snapshots.empty()) {
      const TrainingHistory::Snapshot& first = history.snapshots.front();
      bool same = s.input.size() == first.input.size() && s.sigma.size() == first.sigma.size();
      for (std::size_t l = 0; same && l < s.sigma.size(); ++l) same = s.sigma[l].size() == first.sigma[l].size();
      if (!same) throw LineFault("other layers, heads or input length than the first snapshot's");
    }
    history.snapshots.push_back(std::move(s));
  });
  return history;
}

}  // namespace qkv::analysis
