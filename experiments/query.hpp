#pragma once
// Numbers read from an experiment's runs (results.json's "runs") by a short query, as the docs
// print them. A query is `RUNS | STATISTIC`:
//
//   RUNS       `*` (every run), or labels `key=value, key=value` (the runs whose "labels" have
//              them; `key=a / b` takes either value), then optionally `where COND, COND` (the
//              runs for which each holds)
//   STATISTIC  count COND   "k of n": how many of the runs COND holds for (COND, COND: each)
//              wilson COND  "lo–hi%": the 95% Wilson interval of that count
//              rate COND    "k of n (lo–hi%)": both
//              points COND  "k of n": how many points of the runs' curves COND holds for
//              mean FIELD FMT, sd, min, max, range (min–max), mean±sd, median,
//              median+range ("median (min–max)"), bootstrap (the 95% bootstrap interval of the
//              mean, "lo–hi")
//              curve FIELD FMT FROM TO  "lo–hi": the lowest and highest of the runs' mean of
//              FIELD at each step of their curves from FROM to TO
//              list FIELD FMT  "13, 23, 47": the numbers of a list FIELD of the one run chosen
//   FIELD      a number (or true/false, as 1/0) of each run's results: a key (accuracy,
//              steps_to_target, sigma, …), or keys and list indices joined by dots
//              (ablation.L0H0.zero, ablation.needed_by_layer.0); or FIELD@STEP, its value on the
//              run's curve at STEP. Runs where it is null are left out of a statistic
//   COND       FIELD OP VALUE, OP one of >= > <= < == !=, VALUE a number, null or another FIELD;
//              `reached` for steps_to_target != null (the run reached its task's target)
//   FMT        % (a percentage, 1 decimal), %N (N decimals), .N (N decimals), +.N (a sign always),
//              int (whole, thousands apart by commas, as counts are)
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace qkv::experiments {

// The text `query` makes of `runs`: "2 of 30", "5–32%", "47.1%", "0.274–0.322", …;
// std::invalid_argument naming the query and what in it is wrong (a field no run has, a label
// the runs lack, no run chosen, an unknown statistic or format).
std::string query_runs(const nlohmann::ordered_json& runs, const std::string& query);

// What an interval statistic (wilson, rate, bootstrap) of `query` estimates, on `runs`: the rate
// k/n or the mean, and its 95% interval; none for other statistics.
struct QueryInterval {
  double estimate = 0, lo = 0, hi = 0;
  std::size_t n = 0;  // the runs it is over
};
std::optional<QueryInterval> query_interval(const nlohmann::ordered_json& runs, const std::string& query);

}  // namespace qkv::experiments
