// The numbers the docs read from the committed results carry the query that makes them:
//
//   <!--= EXPERIMENT | RUNS | STATISTIC -->TEXT<!--/-->
//
// (Markdown shows TEXT alone): `RUNS | STATISTIC` is a query of experiments/query.hpp on the runs
// of docs/experiments/EXPERIMENT/results.json. The test makes every query of README.md and of each
// page of docs/ anew and checks its TEXT. Run with QKV_WRITE_DOCS=1 in the environment, it writes
// the pages with every TEXT made anew instead, after new results (and still fails where a TEXT was
// stale): then read the diff, since a reading the new numbers no longer support is for a person to
// rewrite.
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

#include "qkv/experiments/query.hpp"
#include "qkv/report/statistics.hpp"

using namespace qkv;
using Json = nlohmann::ordered_json;

namespace {

// docs/experiments/EXPERIMENT/FILE, read once: results.json, the committed results the docs read,
// or held-out.json, the same experiment rerun on seeds none of those numbers was made from; null
// when the experiment has no such file.
const Json* results_file(const std::string& experiment, const std::string& file) {
  static std::map<std::string, std::optional<Json>> loaded;
  const std::string key = experiment + "/" + file;
  auto it = loaded.find(key);
  if (it == loaded.end()) {
    std::ifstream in(std::filesystem::path(QKV_SOURCE_DIR) / "docs" / "experiments" / experiment / file);
    it = loaded.emplace(key, in ? std::optional<Json>(Json::parse(in)) : std::nullopt).first;
  }
  return it->second ? &*it->second : nullptr;
}

const Json& results_of(const std::string& experiment) {
  const Json* results = results_file(experiment, "results.json");
  if (!results) throw std::invalid_argument(fmt::format("no committed results of the experiment '{}'", experiment));
  return *results;
}

// A marker's experiment and query: "symmetry | task=rps | count reached" → ("symmetry", "task=rps | count reached").
std::pair<std::string, std::string> parts_of(const std::string& marker) {
  const auto bar = marker.find('|');
  if (bar == std::string::npos) throw std::invalid_argument(fmt::format("'{}': not EXPERIMENT | RUNS | STATISTIC", marker));
  return {marker.substr(0, marker.find_last_not_of(' ', bar - 1) + 1), marker.substr(bar + 1)};
}

// README.md and every page of docs/.
std::vector<std::filesystem::path> pages() {
  const std::filesystem::path root(QKV_SOURCE_DIR);
  std::vector<std::filesystem::path> out = {root / "README.md"};
  for (const auto& entry : std::filesystem::directory_iterator(root / "docs"))
    if (entry.path().extension() == ".md") out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string text_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const std::regex& marker_form() {
  static const std::regex marker(R"(<!--= (.*?) -->(.*?)<!--/-->)");
  return marker;
}

// Every interval a page states (a wilson, rate or bootstrap query) whose experiment has a rerun on
// held-out seeds, against that rerun: inside when the rerun's rate or mean falls in the stated
// interval, consistent when the rerun's own 95% interval overlaps it.
struct HeldOutCheck {
  std::string where;  // the page and the marker
  experiments::QueryInterval stated, fresh;
  bool inside = false, consistent = false;
};
std::vector<HeldOutCheck> held_out_checks() {
  std::vector<HeldOutCheck> out;
  for (const std::filesystem::path& page_path : pages()) {
    const std::string page = text_of(page_path);
    for (auto it = std::sregex_iterator(page.begin(), page.end(), marker_form()); it != std::sregex_iterator(); ++it) {
      const auto [experiment, query] = parts_of((*it)[1]);
      if (experiment.starts_with("held-out")) continue;
      const Json* fresh_runs = results_file(experiment, "held-out.json");
      if (!fresh_runs) continue;
      const auto stated = experiments::query_interval(results_of(experiment).at("runs"), query);
      if (!stated) continue;
      HeldOutCheck c{.where = page_path.filename().string() + ": " + (*it)[0].str(), .stated = *stated, .fresh = {}};
      try {
        c.fresh = *experiments::query_interval(fresh_runs->at("runs"), query);
      } catch (const std::invalid_argument&) {
        continue;  // the rerun has no run the query chooses (a `where` that none of its seeds meets)
      }
      c.inside = c.stated.lo <= c.fresh.estimate && c.fresh.estimate <= c.stated.hi;
      c.consistent = c.fresh.lo <= c.stated.hi && c.stated.lo <= c.fresh.hi;
      out.push_back(std::move(c));
    }
  }
  return out;
}

// The text a marker's query makes: its experiment's runs, queried; `held-out:EXPERIMENT | …`, the
// same query on the experiment's held-out rerun; `held-out | inside` and `held-out | overlapping`,
// how many of the stated intervals a rerun on held-out seeds lands inside, and how many its own
// intervals overlap.
std::string doc_number(const std::string& marker) {
  const auto [experiment, query] = parts_of(marker);
  if (experiment == "held-out") {
    const std::string what = query.substr(std::min(query.size(), query.find_first_not_of(' ')));
    if (what != "inside" && what != "overlapping")
      throw std::invalid_argument(fmt::format("'{}': held-out has 'inside' or 'overlapping'", marker));
    const std::vector<HeldOutCheck> checks = held_out_checks();
    const auto k = std::count_if(checks.begin(), checks.end(),
                                 [&](const HeldOutCheck& c) { return what == "inside" ? c.inside : c.consistent; });
    return fmt::format("{} of {}", k, checks.size());
  }
  if (experiment.starts_with("held-out:")) {  // "held-out:masks | …": the query on the held-out rerun
    const std::string name = experiment.substr(std::string("held-out:").size());
    const Json* runs = results_file(name, "held-out.json");
    if (!runs) throw std::invalid_argument(fmt::format("'{}': the experiment '{}' has no held-out.json", marker, name));
    return experiments::query_runs(runs->at("runs"), query);
  }
  return experiments::query_runs(results_of(experiment).at("runs"), query);
}

}  // namespace

namespace {

// Runs as results.json holds them: `accuracy`, `steps_to_target`, an ablation and a token table in
// nested objects, and a curve of three points.
Json made_runs() {
  Json runs = Json::array();
  const double accuracy[] = {0.99, 0.5, 0.97, 0.2, 1.0, 0.96};
  const Json reached[] = {300, nullptr, 1400, nullptr, 250, 900};
  for (int i = 0; i < 6; ++i) {
    Json run = {{"seed", i}, {"labels", {{"task", "induction"}, {"variant", i % 2 ? "tied" : "untied"}}},
                {"accuracy", accuracy[i]}, {"steps_to_target", reached[i]}};
    run["ablation"] = {{"L0H0", {{"zero", 0.1 * i}, {"needed", i < 4}}}, {"by_layer", {i % 3 == 0, 0}}};
    run["ablation"]["by_layer"][1] = i % 3 == 1;
    run["keys"] = {13, 23 + i, 1047};
    run["token_qk"] = {{")", {{"(", 70.0 - i}, {"[", i % 3 ? -40.0 : 12.5}}}, {"[", {{")", 30.0 - 10 * i}}}};
    run["curve"] = {{{"step", 0}, {"accuracy", 0.0}, {"top1_max", 0.0}},
                    {{"step", 100}, {"accuracy", 0.1 * i}, {"top1_max", 0.5}},
                    {{"step", 200}, {"accuracy", accuracy[i]}, {"top1_max", i == 3 ? 1.0 : 0.6}}};
    runs.push_back(run);
  }
  return runs;
}

}  // namespace

TEST_CASE("doc numbers: each statistic of a query, on runs made by hand") {
  using experiments::query_runs;
  const Json runs = made_runs();
  // Untied: seeds 0, 2, 4 (0.99, 0.97, 1.0); tied: 1, 3, 5 (0.5, 0.2, 0.96).
  CHECK(query_runs(runs, "variant=untied | count accuracy >= 0.98") == "2 of 3");
  CHECK(query_runs(runs, "variant=tied | count reached") == "1 of 3");
  CHECK(query_runs(runs, "* | count accuracy >= 0.95, reached") == "4 of 6");
  // Wilson 95%: 2 of 3 → 20.77–93.85%; 4 of 6 → 30.00–90.32%.
  CHECK(query_runs(runs, "variant=untied | wilson accuracy >= 0.98") == "21–94%");
  CHECK(query_runs(runs, "* | rate accuracy >= 0.95, reached") == "4 of 6 (30–90%)");
  CHECK(query_runs(runs, "variant=tied | min accuracy %") == "20.0%");
  CHECK(query_runs(runs, "variant=tied | range accuracy %") == "20.0–96.0%");
  CHECK(query_runs(runs, "variant=tied | max accuracy .3") == "0.960");
  CHECK(query_runs(runs, "variant=untied | mean accuracy %2") == "98.67%");
  // (0.5 + 0.2 + 0.96) / 3 = 0.5533; sample sd √(((−0.0533)² + (−0.3533)² + 0.4067²) / 2) = 0.3828.
  CHECK(query_runs(runs, "variant=tied | mean±sd accuracy %") == "55.3% ± 38.3%");
  CHECK(query_runs(runs, "variant=tied | sd accuracy .4") == "0.3828");
  // Steps: 300, 1400, 250, 900 reached: median 600, range 250–1,400; untied: 250, 300, 1,400.
  CHECK(query_runs(runs, "* | median+range steps_to_target int") == "600 (250–1,400)");
  CHECK(query_runs(runs, "variant=untied | median steps_to_target int") == "300");
  CHECK(query_runs(runs, "* | max steps_to_target int") == "1,400");
  // where: the chosen runs, then the statistic over them alone.
  CHECK(query_runs(runs, "* where accuracy < 0.95 | count accuracy < 0.95") == "2 of 2");
  CHECK(query_runs(runs, "variant=tied / untied where reached | count accuracy >= 0.97") == "3 of 4");
  // Nested fields by dots, booleans as 1 and 0, one field against another.
  CHECK(query_runs(runs, "* | count ablation.L0H0.needed == 1") == "4 of 6");
  CHECK(query_runs(runs, "* | max ablation.L0H0.zero .2") == "0.50");
  CHECK(query_runs(runs, "* | count ablation.by_layer.1 == 1") == "2 of 6");  // a list's element by its index
  CHECK_THROWS_WITH(query_runs(runs, "* | count ablation.by_layer.2 == 1"), Catch::Contains("the runs have no 'ablation.by_layer.2'"));
  CHECK(query_runs(runs, "* | count token_qk.).( > token_qk.).[") == "6 of 6");
  CHECK(query_runs(runs, "* | count token_qk.).[ < 0") == "4 of 6");
  // [→) 30, 20, 10, 0, −10, −20 against )→[ 12.5, −40, −40, 12.5, −40, −40: all but the fourth.
  CHECK(query_runs(runs, "* | count token_qk.[.) > token_qk.).[") == "5 of 6");
  CHECK(query_runs(runs, "variant=untied | mean token_qk.).( +.1") == "+68.0");
  CHECK(query_runs(runs, "* | min token_qk.[.) +.1") == "-20.0");
  CHECK(query_runs(runs, "* | range token_qk.[.) .0") == "-20 to 30");  // a range from below zero
  // A field on the curve at a step, the points of the curves, and the range of the means over steps.
  CHECK(query_runs(runs, "variant=untied | mean accuracy@100 .2") == "0.20");
  CHECK(query_runs(runs, "* | points top1_max > 0.6") == "1 of 18");
  // Means over the 6 runs: step 0: 0, step 100: 0.25, step 200: 0.77.
  CHECK(query_runs(runs, "* | curve accuracy % 100 200") == "25.0–77.0%");
  CHECK(query_runs(runs, "* | curve accuracy .2 0 100") == "0.00–0.25");
  // A list of the one run chosen, each number in the format.
  CHECK(query_runs(runs, "* where seed == 2 | list keys int") == "13, 25, 1,047");
  CHECK(query_runs(runs, "variant=untied where seed == 4 | list keys .1") == "13.0, 27.0, 1047.0");
  CHECK_THROWS_WITH(query_runs(runs, "variant=tied | list keys int"), Catch::Contains("list reads one run; 3 are chosen"));
  CHECK_THROWS_WITH(query_runs(runs, "* where seed == 0 | list accuracy int"), Catch::Contains("'accuracy' is not a list"));
  // The bootstrap interval of the mean: inside the range of the values, around the mean.
  const auto interval = experiments::query_interval(runs, "variant=untied | bootstrap accuracy .4");
  REQUIRE(interval);
  CHECK(interval->estimate == Approx((0.99 + 0.97 + 1.0) / 3));
  CHECK(interval->lo >= 0.97);
  CHECK(interval->hi <= 1.0);
  CHECK(interval->lo < interval->estimate);
  CHECK(query_runs(runs, "variant=untied | bootstrap accuracy .4") == fmt::format("{:.4f}–{:.4f}", interval->lo, interval->hi));
  const auto rate = experiments::query_interval(runs, "* | rate reached");
  REQUIRE(rate);
  CHECK(rate->estimate == Approx(4.0 / 6));
  CHECK(rate->n == 6);
  CHECK(!experiments::query_interval(runs, "* | mean accuracy %"));
  // Bad queries name what is wrong.
  using Catch::Contains;
  CHECK_THROWS_WITH(query_runs(runs, "* | mean nothing %"), Contains("the runs have no 'nothing'"));
  CHECK_THROWS_WITH(query_runs(runs, "* | mean ablation.L9H9.zero %"), Contains("the runs have no 'ablation.L9H9.zero'"));
  CHECK_THROWS_WITH(query_runs(runs, "task=none | count accuracy > 0"), Contains("no run is chosen"));
  CHECK_THROWS_WITH(query_runs(runs, "size=big | count accuracy > 0"), Contains("the runs have no label 'size'"));
  CHECK_THROWS_WITH(query_runs(runs, "* | mean accuracy %%"), Contains("is no format"));
  CHECK_THROWS_WITH(query_runs(runs, "* | mode accuracy %"), Contains("'mode' is no statistic"));
  CHECK_THROWS_WITH(query_runs(runs, "* | mean accuracy@700 %"), Contains("no run's curve has step 700"));
  CHECK_THROWS_WITH(query_runs(runs, "* | count accuracy ~ 3"), Contains("is not FIELD OP VALUE"));
  CHECK_THROWS_WITH(query_runs(runs, "* | count accuracy > null"), Contains("null compares by == or != alone"));
  CHECK_THROWS_WITH(query_runs(runs, "* | count acuracy@100 > 0.5"), Contains("the runs have no 'acuracy' on their curves"));
  CHECK_THROWS_WITH(query_runs(runs, "* | mean accuracy@100x %"), Contains("'100x' is not a number"));
  CHECK_THROWS_WITH(query_runs(runs, "* | count accuracy > 1.2.3"), Contains("'1.2.3' is not a number"));
  CHECK_THROWS_WITH(query_runs(runs, "where accuracy > 0 | count reached"), Contains("the runs are `*` or labels, then `where`"));
  CHECK_THROWS_WITH(query_runs(runs, "* | mode accuracy"), Contains("'mode' is no statistic"));
  CHECK_THROWS_WITH(query_runs(Json::array({{{"labels", Json::object()}, {"accuracy", 1}}}), "* | points accuracy > 0"),
                    Contains("a run has no curve"));
}

TEST_CASE("doc numbers: every number the README and docs read from the committed results is what its query makes") {
  const std::regex& marker = marker_form();
  std::map<std::string, std::size_t> counts;
  for (const std::filesystem::path& page_path : pages()) {
    const std::string page = text_of(page_path);
    std::string rewritten;
    std::size_t count = 0, last = 0;
    for (auto it = std::sregex_iterator(page.begin(), page.end(), marker); it != std::sregex_iterator(); ++it, ++count) {
      const std::smatch& m = *it;
      INFO(page_path.filename().string() << ": " << m[0].str());
      std::string made = m[2];  // kept as it was where the query fails
      CHECK_NOTHROW(made = doc_number(m[1]));
      CHECK(m[2].str() == made);
      rewritten += page.substr(last, std::size_t(m.position(0)) - last) + "<!--= " + m[1].str() + " -->" + made + "<!--/-->";
      last = std::size_t(m.position(0) + m.length(0));
    }
    rewritten += page.substr(last);
    // Every marker is checked: one wrapped over two lines would not match, and is named here.
    std::size_t opened = 0;
    for (auto at = page.find("<!--= "); at != std::string::npos; at = page.find("<!--= ", at + 1)) ++opened;
    INFO(page_path.filename().string());
    CHECK(count == opened);
    counts[page_path.filename().string()] = count;
    if (const char* write = std::getenv("QKV_WRITE_DOCS"); write && std::string(write) == "1" && rewritten != page) {
      std::ofstream out(page_path);
      out << rewritten;
      WARN("wrote " << page_path.string() << " with every number made anew");
    }
  }
  CHECK(counts["experiments.md"] >= 100);
}

TEST_CASE("doc numbers: each interval the docs state holds on a rerun on held-out seeds") {
  // docs/experiments/NAME/held-out.json: each experiment rerun on seeds no number of the docs was
  // made from. Every stated interval must agree with the rerun's own (the two 95% intervals
  // overlap); how many rerun rates and means fall inside the stated intervals is printed on the page
  // (`held-out | inside`) and listed here.
  const std::vector<HeldOutCheck> checks = held_out_checks();
  REQUIRE(checks.size() >= 20);
  std::size_t inside = 0;
  std::string outside;  // the ones whose held-out estimate falls outside the stated interval
  for (const HeldOutCheck& c : checks) {
    const std::string line = fmt::format("{}: stated {:.3f} ({:.3f}–{:.3f}, n = {}), held out {:.3f} ({:.3f}–{:.3f}, n = {})",
                                         c.where, c.stated.estimate, c.stated.lo, c.stated.hi, c.stated.n,
                                         c.fresh.estimate, c.fresh.lo, c.fresh.hi, c.fresh.n);
    INFO(line);
    CHECK(c.consistent);
    inside += c.inside;
    if (!c.inside) outside += line + "\n";
  }
  INFO("outside:\n" << outside);
  CHECK(inside > checks.size() / 2);
}
