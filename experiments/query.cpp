#include "qkv/experiments/query.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <regex>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "qkv/report/charts.hpp"
#include "qkv/report/statistics.hpp"

namespace qkv::experiments {

namespace {

using Json = nlohmann::ordered_json;

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(' '), last = s.find_last_not_of(' ');
  return first == std::string::npos ? "" : s.substr(first, last - first + 1);
}

// The parts of s between each `by`, trimmed.
std::vector<std::string> split_by(const std::string& s, const std::string& by) {
  std::vector<std::string> out;
  for (std::size_t from = 0;;) {
    const auto at = s.find(by, from);
    out.push_back(trimmed(s.substr(from, at == std::string::npos ? std::string::npos : at - from)));
    if (at == std::string::npos) return out;
    from = at + by.size();
  }
}

// A query, its runs, and what it has chosen of them.
struct Query {
  const std::string& text;
  const Json& runs;
  std::vector<const Json*> chosen{};
  std::string statistic{}, rest{};  // the statistic's name, and what follows it

  [[noreturn]] void fail(const std::string& why) const { throw std::invalid_argument(fmt::format("'{}': {}", text, why)); }

  // A number of the query, the whole word of it.
  double number(const std::string& word) const {
    double x = 0;
    const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), x);
    if (error != std::errc() || end != word.data() + word.size()) fail(fmt::format("'{}' is not a number", word));
    return x;
  }

  const Json& curve_of(const Json& run) const {
    const Json* curve = report::value_at(run, "curve");
    if (!curve || !curve->is_array()) fail("a run has no curve");
    return *curve;
  }

  // The point of a run's curve at `step`, or none.
  const Json* point_at(const Json& run, double step) const {
    for (const Json& p : curve_of(run))
      if (const Json* s = report::value_at(p, "step"); s && s->is_number() && s->get<double>() == step) return &p;
    return nullptr;
  }

  // Whether some run has `key`, or some point of a run's curve when `on_curve`.
  bool some_run_has(const std::string& key, bool on_curve) const {
    return std::any_of(runs.begin(), runs.end(), [&](const Json& r) {
      if (!on_curve) return report::value_at(r, key) != nullptr;
      const Json& curve = curve_of(r);
      return std::any_of(curve.begin(), curve.end(), [&](const Json& p) { return report::value_at(p, key) != nullptr; });
    });
  }

  // FIELD or FIELD@STEP of `object` (a run, or a point of a curve when `point`); none where it is
  // null, or the object has no such field while some run has it (a task's probe), or its curve has
  // no such step while another's has. A field no run has, or a step no curve has, is an error.
  std::optional<double> field(const Json& object, const std::string& name, bool point = false) const {
    const auto at = name.find('@');
    const Json* value = nullptr;
    if (at == std::string::npos || point) {
      value = report::value_at(object, name);
      if (!value && !some_run_has(name, point))
        fail(fmt::format("the runs have no '{}'{}", name, point ? " on their curves" : ""));
    } else {
      const double step = number(name.substr(at + 1));
      const std::string key = name.substr(0, at);
      const Json* p = point_at(object, step);
      if (!p && std::none_of(runs.begin(), runs.end(), [&](const Json& r) { return point_at(r, step) != nullptr; }))
        fail(fmt::format("no run's curve has step {}", name.substr(at + 1)));
      value = p ? report::value_at(*p, key) : nullptr;
      if (!value && !some_run_has(key, true)) fail(fmt::format("the runs have no '{}' on their curves", key));
    }
    if (!value || value->is_null()) return std::nullopt;
    if (value->is_boolean()) return value->get<bool>() ? 1.0 : 0.0;
    if (!value->is_number()) fail(fmt::format("'{}' is not a number", name));
    return value->get<double>();
  }

  bool holds(const Json& object, const std::string& condition, bool point = false) const {
    if (condition == "reached") return holds(object, "steps_to_target != null", point);
    static const std::regex form(R"(^([^ <>=!]+) *(>=|<=|==|!=|>|<) *([^ <>=!]+)$)");
    std::smatch m;
    if (!std::regex_match(condition, m, form)) fail(fmt::format("'{}' is not FIELD OP VALUE", condition));
    const std::optional<double> v = field(object, m[1], point);
    const std::string op = m[2], right = m[3];
    if (right == "null") {
      if (op != "==" && op != "!=") fail("null compares by == or != alone");
      return (op == "==") == !v.has_value();
    }
    // A number (its first character a digit, a sign or a point), or another field.
    const bool numeric = std::isdigit(static_cast<unsigned char>(right[0])) || right[0] == '-' || right[0] == '.';
    const std::optional<double> x = numeric ? std::optional<double>(number(right)) : field(object, right, point);
    if (!v || !x) return false;
    return op == ">=" ? *v >= *x : op == "<=" ? *v <= *x : op == ">" ? *v > *x : op == "<" ? *v < *x : op == "==" ? *v == *x : *v != *x;
  }

  bool all_hold(const Json& object, const std::vector<std::string>& conditions, bool point = false) const {
    return std::all_of(conditions.begin(), conditions.end(), [&](const std::string& c) { return holds(object, c, point); });
  }

  // The chosen runs' values of FIELD, sorted; none null.
  std::vector<double> values(const std::string& name) const {
    std::vector<double> out;
    for (const Json* r : chosen)
      if (const auto v = field(*r, name)) out.push_back(*v);
    if (out.empty()) fail(fmt::format("'{}' is null in every run chosen", name));
    std::sort(out.begin(), out.end());
    return out;
  }
};

Query parse(const Json& runs, const std::string& text) {
  Query q{text, runs};
  const std::vector<std::string> parts = split_by(text, "|");
  if (parts.size() != 2) q.fail("not RUNS | STATISTIC");
  std::string labels = parts[0], where;
  if (labels.starts_with("where ")) q.fail("the runs are `*` or labels, then `where`: `* where …`");
  if (const auto at = labels.find(" where "); at != std::string::npos)
    where = trimmed(labels.substr(at + 7)), labels = trimmed(labels.substr(0, at));
  for (const Json& run : runs) {
    bool chosen = true;
    if (labels != "*")
      for (const std::string& pair : split_by(labels, ", ")) {  // a label's value may hold a comma
        const auto eq = pair.find('=');
        if (eq == std::string::npos) q.fail(fmt::format("'{}' is not key=value", pair));
        const std::string key = trimmed(pair.substr(0, eq));
        const Json* has_labels = report::value_at(run, "labels");
        if (!has_labels || !has_labels->is_object()) q.fail("a run has no labels");
        const Json& l = *has_labels;
        if (!l.contains(key)) q.fail(fmt::format("the runs have no label '{}'", key));
        const std::string value = l.at(key).is_string() ? l.at(key).get<std::string>() : l.at(key).dump();
        const std::vector<std::string> either = split_by(pair.substr(eq + 1), " / ");
        chosen = chosen && std::find(either.begin(), either.end(), value) != either.end();
      }
    if (chosen && !where.empty()) chosen = q.all_hold(run, split_by(where, ", "));
    if (chosen) q.chosen.push_back(&run);
  }
  if (q.chosen.empty()) q.fail("no run is chosen");
  const std::string statistic = trimmed(parts[1]);
  const auto space = statistic.find(' ');
  q.statistic = statistic.substr(0, space);
  q.rest = space == std::string::npos ? "" : trimmed(statistic.substr(space));
  static const std::vector<std::string> known = {"count",  "wilson", "rate", "points", "curve",  "mean",         "sd",
                                                 "min",    "max",    "range", "median", "mean±sd", "median+range",
                                                 "bootstrap", "list"};
  if (std::find(known.begin(), known.end(), q.statistic) == known.end()) q.fail(fmt::format("'{}' is no statistic", q.statistic));
  return q;
}

// The decimals of a format % or %N (a percentage), or none.
std::optional<int> percent_decimals(const std::string& format) {
  if (format == "%") return 1;
  if (format.size() == 2 && format[0] == '%' && std::isdigit(static_cast<unsigned char>(format[1]))) return format[1] - '0';
  return std::nullopt;
}

std::string formatted(double x, const std::string& format, const Query& q) {
  if (const auto d = percent_decimals(format)) return fmt::format("{:.{}f}%", 100 * x, *d);
  if (format == "int") {  // 1,650: commas between groups of three digits
    const std::string digits = fmt::format("{:.0f}", std::fabs(x));
    std::string out = x < 0 && digits != "0" ? "-" : "";
    for (std::size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
      out += digits[i];
    }
    return out;
  }
  if (format.size() == 2 && format[0] == '.' && std::isdigit(static_cast<unsigned char>(format[1])))
    return fmt::format("{:.{}f}", x, format[1] - '0');
  if (format.size() == 3 && format[0] == '+' && format[1] == '.' && std::isdigit(static_cast<unsigned char>(format[2])))
    return fmt::format("{:+.{}f}", x, format[2] - '0');
  q.fail(fmt::format("'{}' is no format (%, %N, .N, +.N or int)", format));
}

// A range of percentages prints the sign once: "18.9–51.2%"; one that starts below zero reads
// "-14.9% to -8.9%".
std::string range_text(double lo, double hi, const std::string& format, const Query& q) {
  if (lo < 0) return formatted(lo, format, q) + " to " + formatted(hi, format, q);
  if (const auto d = percent_decimals(format)) return fmt::format("{:.{}f}–{:.{}f}%", 100 * lo, *d, 100 * hi, *d);
  return formatted(lo, format, q) + "–" + formatted(hi, format, q);
}

// How many of the chosen runs each condition holds for.
std::size_t count_of(const Query& q) {
  const std::vector<std::string> conditions = split_by(q.rest, ", ");
  return std::size_t(std::count_if(q.chosen.begin(), q.chosen.end(), [&](const Json* r) { return q.all_hold(*r, conditions); }));
}

}  // namespace

namespace {

// The interval statistics' estimate and interval: wilson and rate of a count, bootstrap of a mean.
std::optional<QueryInterval> interval_of(const Query& q) {
  const std::size_t n = q.chosen.size();
  if (q.statistic == "wilson" || q.statistic == "rate") {
    const std::size_t k = count_of(q);
    const auto [lo, hi] = report::wilson_interval(k, n);
    return QueryInterval{double(k) / double(n), lo, hi, n};
  }
  if (q.statistic == "bootstrap") {
    const std::vector<std::string> words = split_by(q.rest, " ");
    if (words.size() != 2) q.fail("not bootstrap FIELD FORMAT");
    const std::vector<double> values = q.values(words[0]);
    const auto [lo, hi] = report::bootstrap_mean_interval(values);
    return QueryInterval{report::stats(values).mean, lo, hi, values.size()};
  }
  return std::nullopt;
}

}  // namespace

std::string query_runs(const Json& runs, const std::string& text) {
  const Query q = parse(runs, text);
  const std::string& name = q.statistic;
  const std::vector<std::string> words = split_by(q.rest, " ");
  if (const std::optional<QueryInterval> i = interval_of(q)) {
    const std::string& f = name == "bootstrap" ? words[1] : "%0";
    const std::string interval = range_text(i->lo, i->hi, f, q);
    if (name != "rate") return interval;
    return formatted(i->estimate * double(i->n), "int", q) + " of " + formatted(double(i->n), "int", q) + " (" + interval + ")";
  }
  if (name == "count") return formatted(double(count_of(q)), "int", q) + " of " + formatted(double(q.chosen.size()), "int", q);
  if (name == "points") {
    const std::vector<std::string> conditions = split_by(q.rest, ", ");
    std::size_t k = 0, points = 0;
    for (const Json* r : q.chosen)
      for (const Json& p : q.curve_of(*r)) k += q.all_hold(p, conditions, true), ++points;
    return formatted(double(k), "int", q) + " of " + formatted(double(points), "int", q);
  }
  if (name == "curve") {
    if (words.size() != 4) q.fail("not curve FIELD FORMAT FROM TO");
    const double from = q.number(words[2]), to = q.number(words[3]);
    std::vector<double> means;  // at each step from `from` to `to`
    std::vector<double> steps;
    for (const Json& p : q.curve_of(*q.chosen.front()))
      if (const double s = p.value("step", -1.0); s >= from && s <= to) steps.push_back(s);
    for (const double s : steps) {
      std::vector<double> at;
      for (const Json* r : q.chosen)
        if (const auto v = q.field(*r, fmt::format("{}@{}", words[0], s))) at.push_back(*v);
      if (!at.empty()) means.push_back(report::stats(at).mean);
    }
    if (means.empty()) q.fail(fmt::format("no step of the curves from {} to {} has '{}'", words[2], words[3], words[0]));
    const auto [lo, hi] = std::minmax_element(means.begin(), means.end());
    return range_text(*lo, *hi, words[1], q);
  }
  if (words.size() != 2) q.fail(fmt::format("'{} {}' is not STATISTIC FIELD FORMAT", name, q.rest));
  if (name == "list") {
    if (q.chosen.size() != 1) q.fail(fmt::format("list reads one run; {} are chosen", q.chosen.size()));
    const Json* list = report::value_at(*q.chosen.front(), words[0]);
    if (!list || !list->is_array()) q.fail(fmt::format("'{}' is not a list", words[0]));
    std::string out;
    for (const Json& x : *list) {
      if (!x.is_number()) q.fail(fmt::format("'{}' holds {}, not a number", words[0], x.dump()));
      out += (out.empty() ? "" : ", ") + formatted(x.get<double>(), words[1], q);
    }
    return out.empty() ? "none" : out;
  }
  const std::vector<double> values = q.values(words[0]);
  const report::Stats s = report::stats(values);
  const std::string& f = words[1];
  const auto as_text = [&](double x) { return formatted(x, f, q); };
  if (name == "mean") return as_text(s.mean);
  if (name == "sd") return as_text(s.sd);
  if (name == "min") return as_text(values.front());
  if (name == "max") return as_text(values.back());
  if (name == "median") return as_text(report::median(values));
  if (name == "range") return range_text(values.front(), values.back(), f, q);
  if (name == "median+range") return as_text(report::median(values)) + " (" + range_text(values.front(), values.back(), f, q) + ")";
  if (name == "mean±sd") {
    if (percent_decimals(f)) return as_text(s.mean) + " ± " + as_text(s.sd);
    return as_text(s.mean) + " ± " + formatted(s.sd, f[0] == '+' ? f.substr(1) : f, q);
  }
  q.fail(fmt::format("'{}' is no statistic", name));
}

std::optional<QueryInterval> query_interval(const Json& runs, const std::string& text) { return interval_of(parse(runs, text)); }

}  // namespace qkv::experiments
