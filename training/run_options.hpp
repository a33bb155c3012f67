#pragma once
// The options of a new run by name: what `qkv train` takes on its command line (--d-model 64), a
// sweep file's "grid" and "fixed" keys ("d-model": [32, 64]) and the Python module's keywords
// (d_model=64) are one table, read by one function. Values are JSON: counts as whole numbers (or
// text that is one), choices as their names, flags as true or false.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/tasks/train_options.hpp"

namespace qkv::training {

using tasks::TrainOptions;

struct RunOption {
  enum class Kind {
    count,   // a whole number in [min, max]
    number,  // a real number (its range is check_options')
    choice,  // one of `choices`
    flag,    // true or false
    masks,   // --attention: causal or bidirectional, or one per layer, comma-separated
    schedule,  // --keep-checkpoints: log or every:N (kept_checkpoints.hpp)
  };
  std::string name;  // the long option without its dashes: "d-model"
  Kind kind = Kind::count;
  std::string help;
  std::uint64_t min = 0, max = 0;      // a count's range
  std::vector<std::string> choices{};  // a choice's names
};

// Every option that says what a new run is, in the order `qkv train --help` lists them: not
// --out, --force and --resume (where a run goes, and whether it replaces or continues one), nor
// --threads (how fast it goes, recorded but not part of what it computes).
const std::vector<RunOption>& run_option_table();
// The option of that name ("d-model", or with underscores "d_model"); nullptr for none.
const RunOption* find_run_option(std::string_view name);

// A value an option refuses, or an option that is not one: the option's name without dashes,
// and what is wrong ("must be a whole number from 1 to 1000000000, got '0'").
struct RunOptionError : std::invalid_argument {
  RunOptionError(std::string option, const std::string& message)
      : std::invalid_argument(message), option(std::move(option)) {}
  std::string option;
};

// `value` checked against the option: "" when it is one the option takes, else why not (a count
// out of its range or not whole, a name that is no choice, a flag that is not true or false).
std::string refusal(const RunOption& option, const nlohmann::json& value);

// A value refusal() found good, as the option reads it, in one spelling: 300 for "300", 0.01 for
// "1e-2", true for "true"; a number past a double's range is ±inf or 0, for check_options to refuse.
nlohmann::json normalized_value(const RunOption& option, const nlohmann::json& value);

// A value as messages show it: a string as it is, anything else as JSON; at most 60 bytes.
std::string value_text(const nlohmann::json& value);

// The options of a new run of `task`: the task's defaults (of size `given["n"]` when given), then
// each given option (name → value, names as find_run_option reads them) in the table's order.
// Throws RunOptionError naming the first option at fault: an unknown name, a value it refuses, a
// size the task does not have, --encoder-layers for a task that is not seq2seq. Ranges that depend
// on other options (heads dividing d_model, memory) are check_options' (train calls it).
TrainOptions run_options(const std::string& task, const nlohmann::json& given);

// The option that sets a config.json field (an OptionError's field: "model.d_model" → "d-model",
// "threads" → "threads"); "" when no option sets it.
std::string option_of_field(const std::string& field);

}  // namespace qkv::training
