#include "examples/cli/snapshot.hpp"

#include <cmath>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "examples/cli/inspect.hpp"
#include "qkv/nn/detail/json.hpp"
#include "qkv/nn/files.hpp"

namespace qkv::cli {

bool log_spaced(std::size_t step) {
  if (step < 10) return false;
  while (step % 10 == 0 && step >= 100) step /= 10;
  return step == 10 || step == 20 || step == 30 || step == 50;
}

Snapshots::Snapshots(const TrainOptions& options, const Task& task)
    : options_(options), task_(task), input_(typical_input(task)) {}

bool Snapshots::due(std::size_t step) const {
  const std::size_t every = options_.snapshot_every;
  return every > 0 && (step == 0 || step == options_.steps || step % every == 0 || (step < every && log_spaced(step)));
}

nlohmann::json Snapshots::take(std::size_t step, const nn::Transformer& model) const {
  const nlohmann::json in = to_json(inspect(model, task_, input_));
  nlohmann::json layers = nlohmann::json::array();
  const nlohmann::json& on_input = in.at("input");
  const std::string target = task_spec(options_.task).target_name + "_attention";
  for (std::size_t l = 0; l < in.at("layers").size(); ++l) {
    nlohmann::json heads = nlohmann::json::array();
    for (std::size_t h = 0; h < in.at("layers")[l].at("heads").size(); ++h) {
      const nlohmann::json& head = in.at("layers")[l].at("heads")[h];
      // The weights, null where the mask hides the key (where the score is null: −inf).
      nlohmann::json attention = on_input.at("attention")[l][h];
      const nlohmann::json& scores = on_input.at("scores")[l][h];
      for (std::size_t i = 0; i < attention.size(); ++i)
        for (std::size_t j = 0; j < attention[i].size(); ++j)
          if (scores[i][j].is_null()) attention[i][j] = nullptr;
      nlohmann::json s = {{"sigma", head.at("sigma")},
                          {"antisymmetry", head.at("antisymmetry")},
                          {"score_asymmetry", on_input.at("score_asymmetry")[l][h]},
                          {"qk_circuit", head.at("qk_circuit")},
                          {"attention", std::move(attention)}};
      if (on_input.contains(target)) s[target] = on_input.at(target)[l][h];
      heads.push_back(std::move(s));
    }
    layers.push_back({{"heads", std::move(heads)}});
  }
  nlohmann::json probes = nlohmann::json::object();
  if (const TaskSpec& spec = task_spec(options_.task); spec.probe)
    for (const auto& [key, value] : spec.probe(model, options_.seed).values) probes[key] = value;
  const TrainOptions& o = options_;
  return {{"step", step},
          {"accuracy", evaluate(model, task_, o.eval_batches, o.batch, o.seed, o.mask_padding).accuracy},
          {"input", input_},
          {"layers", std::move(layers)},
          {"composition", in.at("composition")},
          {"probes", std::move(probes)}};
}

namespace {

// A number as JSON writes it, NaN (a diverged run) as null.
double number(const nlohmann::json& j) { return j.is_null() ? NAN : j.get<double>(); }

// A fault in one line of a file, which read_history names with the file and the line.
struct LineFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::size_t step_of(const nlohmann::json& j) {
  const nlohmann::json& step = j.at("step");
  if (!step.is_number_unsigned() || step.get<std::uint64_t>() > max_steps)
    throw LineFault(fmt::format("'step' is {}, not a whole number in [0, {}]", step.dump(), max_steps));
  return step.get<std::size_t>();
}

}  // namespace

std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  if (!std::filesystem::exists(path)) return out;
  const std::string text = nn::read_file(path, std::size_t(1) << 30);
  std::istringstream lines(text);
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

TrainingHistory read_history(const std::string& dir) {
  TrainingHistory history;
  // Each line's fields, read by type; a fault names the file, the line and the field.
  const auto each_line = [](const std::string& path, const auto& read) {
    const std::vector<nlohmann::json> lines = read_json_lines(path);
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
  each_line(dir + "/metrics.jsonl", [&](const nlohmann::json& j) {
    history.logged.push_back({step_of(j), number(j.at("loss")), number(j.at("accuracy"))});
  });
  each_line(dir + "/snapshots.jsonl", [&](const nlohmann::json& j) {
    TrainingHistory::Snapshot s;
    s.step = step_of(j);
    s.accuracy = number(j.at("accuracy"));
    s.input = j.at("input").get<std::vector<std::int64_t>>();
    const std::size_t T = s.input.size();
    for (const nlohmann::json& layer : j.at("layers")) {
      s.sigma.emplace_back();
      s.score_asymmetry.emplace_back();
      s.attention.emplace_back();
      for (const nlohmann::json& head : layer.at("heads")) {
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
    for (const nlohmann::json& c : j.at("composition"))
      s.composition.push_back({c.at("from_layer").get<std::size_t>(), c.at("from_head").get<std::size_t>(),
                               c.at("to_layer").get<std::size_t>(), c.at("to_head").get<std::size_t>(), number(c.at("q")),
                               number(c.at("k")), number(c.at("v"))});
    for (const auto& [key, value] : j.at("probes").items()) s.probes.emplace_back(key, number(value));
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

}  // namespace qkv::cli
