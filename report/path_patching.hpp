#pragma once
// `qkv patch DIR --path` as a reader sees it: a PathPatching (analysis/path_patching.hpp) as JSON
// and as a table.
#include <iosfwd>

#include <nlohmann/json.hpp>

#include "qkv/analysis/path_patching.hpp"

namespace qkv::report {

// {task, dir, corruption, direction, sequences, length, seed, clean: {accuracy, loss, logit_diff},
// corrupted: {…}, paths: [{sender: "L0H0", receiver: "L1H0" or "logits", input: "q"|"k"|"v"|"logits",
// accuracy, loss, logit_diff, loss_share, logit_diff_share}]}; a share not defined is null.
nlohmann::json to_json(const analysis::PathPatching& paths);

// The clean and corrupted metrics, then a row a path.
void print_path_patching(std::ostream& out, const analysis::PathPatching& paths);

}  // namespace qkv::report
