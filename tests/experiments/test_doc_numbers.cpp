// The numbers docs/experiments.md reads from the committed results carry the query that makes them:
//
//   <!--= EXPERIMENT | RUNS | STATISTIC -->TEXT<!--/-->
//
// (Markdown shows TEXT alone). The test evaluates every query on docs/experiments/EXPERIMENT/
// results.json and checks its TEXT. Run with QKV_WRITE_DOCS=1 in the environment, it writes the
// page with every TEXT made anew instead, after new results (and still fails where a TEXT was
// stale): then read the diff, since a reading the new numbers no longer support is for a person to
// rewrite.
//
//   RUNS       `*` (every run), or labels `key=value, key=value` (the runs whose "labels" have
//              them; `key=a / b` takes either value), then optionally `where COND, COND` (the
//              runs for which each holds)
//   STATISTIC  count COND   "k of n": how many of the runs COND holds for (COND, COND: each)
//              wilson COND  "lo–hi%": the 95% Wilson interval of that count
//              mean FIELD FMT, sd, min, max, range (min–max), mean±sd, median
//   FIELD      a number of each run's results (accuracy, steps_to_target, sigma, …), or
//              FIELD@STEP, its value on the run's curve at STEP; runs where it is null are left out
//   COND       FIELD OP VALUE, OP one of >= > <= < == !=, VALUE a number or null; `reached` for
//              steps_to_target != null (the run reached its task's target on a check)
//   FMT        % (a percentage, 1 decimal), %N (N decimals), .N (N decimals), int (whole, thousands
//              apart by commas)
#include "tests/helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qkv/report/charts.hpp"
#include "qkv/sweep/sweep.hpp"

using namespace qkv;
using Json = nlohmann::ordered_json;

namespace {

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

[[noreturn]] void bad_query(const std::string& query, const std::string& why) {
  throw std::invalid_argument(fmt::format("<!--= {} -->: {}", query, why));
}

// A query and the runs of its experiment.
struct Query {
  const std::string& text;
  const Json& runs;
};

// FIELD or FIELD@STEP of one run; none where it is null, or the run has no such field while others
// of the experiment do (a task's probe), or the curve has no such step.
std::optional<double> field_of(const Json& run, const std::string& field, const Query& q) {
  const std::string& query = q.text;
  const auto at = field.find('@');
  const Json* value = nullptr;
  if (at == std::string::npos) {
    if (!run.contains(field)) {
      if (std::none_of(q.runs.begin(), q.runs.end(), [&](const Json& r) { return r.contains(field); }))
        bad_query(query, fmt::format("the runs have no '{}'", field));
      return std::nullopt;
    }
    value = &run.at(field);
  } else {
    const double step = std::stod(field.substr(at + 1));
    for (const Json& point : run.at("curve"))
      if (point.at("step").get<double>() == step) value = &point.at(field.substr(0, at));
    if (!value) bad_query(query, fmt::format("no run's curve has step {}", step));
  }
  if (value->is_null()) return std::nullopt;
  if (!value->is_number()) bad_query(query, fmt::format("'{}' is not a number", field));
  return value->get<double>();
}

bool holds(const Json& run, const std::string& condition, const Query& q) {
  const std::string& query = q.text;
  if (condition == "reached") return holds(run, "steps_to_target != null", q);
  static const std::regex form(R"(^([A-Za-z0-9_@.-]+) *(>=|<=|==|!=|>|<) *(null|[-0-9.e]+)$)");
  std::smatch m;
  if (!std::regex_match(condition, m, form)) bad_query(query, fmt::format("'{}' is not FIELD OP VALUE", condition));
  const std::optional<double> v = field_of(run, m[1], q);
  const std::string op = m[2];
  if (m[3] == "null") {
    if (op != "==" && op != "!=") bad_query(query, "null compares by == or != alone");
    return (op == "==") == !v.has_value();
  }
  if (!v) return false;
  const double x = std::stod(m[3]);
  return op == ">=" ? *v >= x : op == "<=" ? *v <= x : op == ">" ? *v > x : op == "<" ? *v < x : op == "==" ? *v == x
                                                                                                        : *v != x;
}

// The decimals of a format % or %N (a percentage), or none.
std::optional<int> percent_decimals(const std::string& format) {
  if (format == "%") return 1;
  if (format.size() == 2 && format[0] == '%' && std::isdigit(static_cast<unsigned char>(format[1]))) return format[1] - '0';
  return std::nullopt;
}

std::string formatted(double x, const std::string& format, const std::string& query) {
  if (const auto d = percent_decimals(format)) return fmt::format("{:.{}f}%", 100 * x, *d);
  if (format == "int") {  // 1,650: commas between groups of three digits
    const std::string digits = fmt::format("{:.0f}", std::fabs(x));
    std::string out = x < 0 ? "-" : "";
    for (std::size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
      out += digits[i];
    }
    return out;
  }
  if (format.size() == 2 && format[0] == '.' && std::isdigit(static_cast<unsigned char>(format[1])))
    return fmt::format("{:.{}f}", x, format[1] - '0');
  bad_query(query, fmt::format("'{}' is no format (%, %N, .N or int)", format));
}

// A range or mean ± sd of percentages prints the sign once: "18.9–51.2%", "88.3% ± 3.8%".
std::string range_text(double lo, double hi, const std::string& format, const std::string& query) {
  if (const auto d = percent_decimals(format)) return fmt::format("{:.{}f}–{:.{}f}%", 100 * lo, *d, 100 * hi, *d);
  return formatted(lo, format, query) + "–" + formatted(hi, format, query);
}

const Json& results_of(const std::string& experiment) {
  static std::map<std::string, Json> loaded;
  auto it = loaded.find(experiment);
  if (it == loaded.end()) {
    std::ifstream in(std::filesystem::path(QKV_SOURCE_DIR) / "docs" / "experiments" / experiment / "results.json");
    if (!in) throw std::invalid_argument(fmt::format("no committed results of the experiment '{}'", experiment));
    it = loaded.emplace(experiment, Json::parse(in)).first;
  }
  return it->second;
}

// The text a query makes.
std::string doc_number(const std::string& query) {
  const std::vector<std::string> parts = split_by(query, "|");
  if (parts.size() != 3) bad_query(query, "not EXPERIMENT | RUNS | STATISTIC");
  const Json& results = results_of(parts[0]);
  const Query q{query, results.at("runs")};
  // The runs.
  std::string labels = parts[1], where;
  if (const auto at = labels.find(" where "); at != std::string::npos)
    where = trimmed(labels.substr(at + 7)), labels = trimmed(labels.substr(0, at));
  std::vector<const Json*> runs;
  for (const Json& run : results.at("runs")) {
    bool chosen = true;
    if (labels != "*")
      for (const std::string& pair : split_by(labels, ", ")) {  // a label's value may hold a comma
        const auto eq = pair.find('=');
        if (eq == std::string::npos) bad_query(query, fmt::format("'{}' is not key=value", pair));
        const std::string key = trimmed(pair.substr(0, eq));
        const Json& l = run.at("labels");
        if (!l.contains(key)) bad_query(query, fmt::format("the runs have no label '{}'", key));
        const std::string value = l.at(key).is_string() ? l.at(key).get<std::string>() : l.at(key).dump();
        const std::vector<std::string> either = split_by(pair.substr(eq + 1), " / ");
        chosen = chosen && std::find(either.begin(), either.end(), value) != either.end();
      }
    if (!where.empty())
      for (const std::string& condition : split_by(where, ", ")) chosen = chosen && holds(run, condition, q);
    if (chosen) runs.push_back(&run);
  }
  if (runs.empty()) bad_query(query, "no run is chosen");
  // The statistic.
  const std::string statistic = parts[2];
  const auto space = statistic.find(' ');
  const std::string name = statistic.substr(0, space), rest = space == std::string::npos ? "" : trimmed(statistic.substr(space));
  if (name == "count" || name == "wilson") {
    const std::vector<std::string> conditions = split_by(rest, ", ");  // each must hold
    const std::size_t k = std::size_t(std::count_if(runs.begin(), runs.end(), [&](const Json* r) {
      return std::all_of(conditions.begin(), conditions.end(), [&](const std::string& c) { return holds(*r, c, q); });
    }));
    if (name == "count") return fmt::format("{} of {}", k, runs.size());
    const auto [lo, hi] = sweep::wilson_interval(k, runs.size());
    return fmt::format("{:.0f}–{:.0f}%", 100 * lo, 100 * hi);
  }
  const std::vector<std::string> words = split_by(rest, " ");
  if (words.size() != 2) bad_query(query, fmt::format("'{}' is not STATISTIC FIELD FORMAT", statistic));
  std::vector<double> values;
  for (const Json* r : runs)
    if (const auto v = field_of(*r, words[0], q)) values.push_back(*v);
  if (values.empty()) bad_query(query, fmt::format("'{}' is null in every run chosen", words[0]));
  std::sort(values.begin(), values.end());
  const report::Stats s = report::stats(values);
  const std::string& f = words[1];
  if (name == "mean") return formatted(s.mean, f, query);
  if (name == "sd") return formatted(s.sd, f, query);
  if (name == "min") return formatted(values.front(), f, query);
  if (name == "max") return formatted(values.back(), f, query);
  if (name == "median") {
    const std::size_t n = values.size();
    return formatted(n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2, f, query);
  }
  if (name == "range") return range_text(values.front(), values.back(), f, query);
  if (name == "mean±sd") return formatted(s.mean, f, query) + " ± " + formatted(s.sd, f, query);
  bad_query(query, fmt::format("'{}' is no statistic", name));
}

}  // namespace

TEST_CASE("doc numbers: each statistic of a query, on the symmetry results, by hand") {
  // The tied induction runs, from the committed results themselves.
  const Json& results = results_of("symmetry");
  std::vector<double> accuracy;
  std::size_t reached = 0;
  for (const Json& run : results.at("runs"))
    if (run.at("labels").at("task") == "induction" && run.at("labels").at("variant") == "tied") {
      accuracy.push_back(run.at("accuracy").get<double>());
      reached += !run.at("steps_to_target").is_null();
    }
  REQUIRE(accuracy.size() == 10);
  std::sort(accuracy.begin(), accuracy.end());
  const std::string tied = "symmetry | task=induction, variant=tied | ";
  CHECK(doc_number(tied + "count steps_to_target != null") == fmt::format("{} of 10", reached));
  CHECK(doc_number(tied + "count reached") == fmt::format("{} of 10", reached));
  CHECK(doc_number(tied + "min accuracy %") == fmt::format("{:.1f}%", 100 * accuracy.front()));
  CHECK(doc_number(tied + "range accuracy %") ==
        fmt::format("{:.1f}–{:.1f}%", 100 * accuracy.front(), 100 * accuracy.back()));
  CHECK(doc_number(tied + "max accuracy .3") == fmt::format("{:.3f}", accuracy.back()));
  CHECK(doc_number(tied + "max accuracy %2") == fmt::format("{:.2f}%", 100 * accuracy.back()));
  // where: the runs below 95%, every one counted.
  const std::size_t below = std::size_t(std::count_if(accuracy.begin(), accuracy.end(), [](double a) { return a < 0.95; }));
  CHECK(doc_number("symmetry | task=induction, variant=tied where accuracy < 0.95 | count accuracy < 0.95") ==
        fmt::format("{} of {}", below, below));
  // Wilson 95%: 0 of 10 is 0–28%, 10 of 10 72–100% (as sweep's summary prints them).
  CHECK(doc_number("symmetry | task=cycle n=5, variant=tied | wilson steps_to_target != null") == "0–28%");
  CHECK(doc_number("symmetry | task=cycle n=5, variant=untied | wilson steps_to_target != null") == "72–100%");
  // Whole numbers with commas, and a field on the curve.
  CHECK(doc_number("symmetry | * | max steps_to_target int").find(',') != std::string::npos);
  double at_1000 = 0;
  for (const Json& run : results.at("runs"))
    if (run.at("labels").at("task") == "rps" && run.at("labels").at("variant") == "tied")
      for (const Json& point : run.at("curve"))
        if (point.at("step") == 1000) at_1000 += point.at("accuracy").get<double>() / 10;
  CHECK(doc_number("symmetry | task=rps, variant=tied | mean accuracy@1000 %") == fmt::format("{:.1f}%", 100 * at_1000));
  // sd (sample), mean ± sd, median, and whole numbers grouped by three, against the values by hand.
  std::vector<double> steps;
  for (const Json& run : results.at("runs"))
    if (run.at("labels").at("task") == "induction" && run.at("labels").at("variant") == "symmetric")
      steps.push_back(run.at("steps_to_target").get<double>());
  REQUIRE(steps.size() == 10);
  std::sort(steps.begin(), steps.end());
  double m = 0, ss = 0;
  for (double x : steps) m += x / 10;
  for (double x : steps) ss += (x - m) * (x - m);
  const double sd = std::sqrt(ss / 9);
  const auto grouped = [](double x) {  // 1234.4 → "1,234"
    const long v = std::lround(x);
    return v >= 1000 ? fmt::format("{},{:03d}", v / 1000, v % 1000) : fmt::format("{}", v);
  };
  const std::string symmetric = "symmetry | task=induction, variant=symmetric | ";
  CHECK(doc_number(symmetric + "sd steps_to_target .2") == fmt::format("{:.2f}", sd));
  CHECK(doc_number(symmetric + "mean±sd steps_to_target int") == grouped(m) + " ± " + grouped(sd));
  CHECK(doc_number(symmetric + "median steps_to_target int") == grouped((steps[4] + steps[5]) / 2));
  CHECK(doc_number(symmetric + "max steps_to_target int") == grouped(steps.back()));
  // Alternatives pool runs; conditions in `where` and in `count` must each hold.
  CHECK(doc_number("symmetry | task=cycle n=3 / cycle n=5, variant=untied | count reached") == "20 of 20");
  CHECK(doc_number("symmetry | task=induction, variant=tied / symmetric where accuracy >= 0.5, accuracy < 0.99 | count "
                   "accuracy >= 0.5, accuracy < 0.99") ==
        [&] {
          std::size_t n = 0;
          for (const Json& run : results.at("runs")) {
            const auto& l = run.at("labels");
            const double a = run.at("accuracy").get<double>();
            n += l.at("task") == "induction" && (l.at("variant") == "tied" || l.at("variant") == "symmetric") && a >= 0.5 &&
                 a < 0.99;
          }
          return fmt::format("{} of {}", n, n);
        }());
  // Bad queries name what is wrong.
  CHECK_THROWS_WITH(doc_number("symmetry | task=rps | mean nothing %"), Catch::Contains("the runs have no 'nothing'"));
  CHECK_THROWS_WITH(doc_number("symmetry | task=none | count accuracy > 0"), Catch::Contains("no run is chosen"));
  CHECK_THROWS_WITH(doc_number("symmetry | * | mean accuracy %%"), Catch::Contains("is no format"));
  CHECK_THROWS_WITH(doc_number("nosuch | * | count accuracy > 0"), Catch::Contains("no committed results of the experiment 'nosuch'"));
}

TEST_CASE("doc numbers: every number docs/experiments.md reads from the committed results is what its query makes") {
  const std::filesystem::path page_path = std::filesystem::path(QKV_SOURCE_DIR) / "docs" / "experiments.md";
  std::ifstream in(page_path);
  REQUIRE(in);
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  static const std::regex marker(R"(<!--= (.*?) -->(.*?)<!--/-->)");
  std::string rewritten;
  std::size_t count = 0, last = 0;
  for (auto it = std::sregex_iterator(page.begin(), page.end(), marker); it != std::sregex_iterator(); ++it, ++count) {
    const std::smatch& m = *it;
    const std::string made = doc_number(m[1]);
    INFO(m[0].str());
    CHECK(m[2].str() == made);
    rewritten += page.substr(last, std::size_t(m.position(0)) - last) + "<!--= " + m[1].str() + " -->" + made + "<!--/-->";
    last = std::size_t(m.position(0) + m.length(0));
  }
  rewritten += page.substr(last);
  // Every marker is checked: one wrapped over two lines would not match, and is named here.
  std::size_t opened = 0;
  for (auto at = page.find("<!--= "); at != std::string::npos; at = page.find("<!--= ", at + 1)) ++opened;
  CHECK(count == opened);
  CHECK(count >= 20);
  if (const char* write = std::getenv("QKV_WRITE_DOCS"); write && std::string(write) == "1" && rewritten != page) {
    std::ofstream out(page_path);
    out << rewritten;
    WARN("wrote " << page_path.string() << " with every number made anew");
  }
}
