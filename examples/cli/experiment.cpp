#include "examples/cli/experiment.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <ostream>
#include <sstream>

#include <fmt/format.h>

#include "qkv/core/autograd.hpp"
#include "qkv/core/ops.hpp"
#include "examples/cli/heatmap.hpp"
#include "examples/cli/inspect.hpp"
#include "examples/cli/tasks/tasks.hpp"
#include "examples/cli/train.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/nn/safetensors.hpp"

namespace qkv::cli {

namespace {

using Json = nlohmann::ordered_json;

// One configuration of an experiment: the labels that name it in the table, and how to train it.
struct Config {
  Json labels;
  TrainOptions options;
};

// Per task: steps of a full run and of a quick one.
std::size_t steps_for(const std::string& task, bool quick) {
  if (quick) return task == "induction" ? 250 : 300;
  return task == "brackets" ? 1200 : task == "rps" ? 800 : 1000;
}

TrainOptions base(const std::string& task, const ExperimentOptions& e) {
  TrainOptions o = default_options(task);
  o.steps = e.steps ? e.steps : steps_for(task, e.quick);
  o.warmup = std::min<std::size_t>(o.warmup, o.steps / 10 + 1);
  o.eval_batches = e.eval_batches;
  o.target = task_target(task);
  o.target_every = e.quick ? 25 : 50;
  o.checkpoint_every = o.steps;  // at the end only
  o.log_every = std::max<std::size_t>(1, o.steps / 10);
  return o;
}

void set_variant(TrainOptions& o, const std::string& variant) {
  o.model.qk = variant == "tied" ? nn::QK::tied : nn::QK::untied;
  o.model.proj = variant == "identity" ? nn::Projection::identity
                 : variant == "frozen" ? nn::Projection::frozen : nn::Projection::learned;
}

std::vector<Config> plan(const ExperimentOptions& e) {
  std::vector<Config> out;
  const auto add = [&](Json labels, TrainOptions o) { out.push_back({std::move(labels), std::move(o)}); };
  if (e.name == "ablations") {
    for (const std::string task : {"brackets", "rps", "induction"})
      for (const std::string variant : {"untied", "tied", "identity", "frozen"})
        for (const std::string embeddings : {"learned", "frozen"}) {
          TrainOptions o = base(task, e);
          set_variant(o, variant);
          o.model.frozen_embeddings = embeddings == "frozen";
          add({{"task", task}, {"variant", variant}, {"embeddings", embeddings}}, o);
        }
  } else if (e.name == "dhead") {
    for (const std::string task : {"rps", "brackets"})
      for (const std::size_t d : {1, 2, 4, 8}) {
        TrainOptions o = base(task, e);
        o.model.d_head = d;
        add({{"task", task}, {"d_head", d}}, o);
      }
  } else if (e.name == "scale") {
    for (const std::size_t d : {4, 16, 64})
      for (const bool scale : {true, false}) {
        TrainOptions o = base("brackets", e);
        o.model.d_head = d;
        o.model.scale = scale;
        add({{"task", "brackets"}, {"d_head", d}, {"scale", scale ? "1/sqrt(d_head)" : "none"}}, o);
      }
  } else if (e.name == "kv") {
    for (const std::size_t kv : {4, 2, 1}) {
      TrainOptions o = base("induction", e);
      o.model.heads = 4;
      o.model.kv_heads = kv;
      add({{"task", "induction"}, {"attention", kv == 4 ? "MHA" : kv == 1 ? "MQA" : "GQA"}, {"kv_heads", kv}}, o);
    }
  } else if (e.name == "causal") {
    for (const bool causal : {true, false})
      for (const std::string variant : {"untied", "tied"}) {
        TrainOptions o = base("brackets", e);
        o.model.causal = causal;
        set_variant(o, variant);
        add({{"task", "brackets"}, {"attention", causal ? "causal" : "bidirectional"}, {"variant", variant}}, o);
      }
  } else {
    fail("experiment", "unknown experiment '{}' (known: {})", e.name, fmt::join(experiment_names(), ", "));
  }
  return out;
}

std::string variant_of(const nn::TransformerConfig& c) {
  if (c.proj == nn::Projection::identity) return "identity";
  if (c.proj == nn::Projection::frozen) return "frozen";
  return nn::name_of(c.qk);
}

// σ of the head the task reads: head 0 of the last layer.
double readout_sigma(const nn::Transformer& m) { return nn::symmetric_share(nn::qk_circuit(m.blocks.back()->attn, 0)); }

// Unpadded held-out sequences, one at a time.
std::vector<std::vector<std::int64_t>> held_out_sequences(const Task& task, std::size_t n, std::uint64_t seed) {
  Generator gen(seed ^ 0x5eedf00dULL);
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t i = 0; i < n; ++i) {
    const Batch b = task.sample(1, gen);
    out.push_back(task.encode(task.decode(std::vector<std::int64_t>(b.tokens.begin(), b.tokens.end()))));
  }
  return out;
}

double readout_score_asymmetry(const nn::Transformer& m, const std::vector<std::vector<std::int64_t>>& inputs) {
  double total = 0;
  for (const auto& input : inputs) total += score_asymmetries(m, input).back()[0];
  return total / double(inputs.size());
}

// rps: on sequences of three items, one of each symbol, the share of queries whose score (the
// readout head's, before softmax) is highest, among all three items, for the item of the symbol
// that beats theirs; and the largest such share in any one sequence. Two kinds of score can do so
// for at most two of a sequence's three queries, so their largest share is at most 2/3, exactly:
// - symmetric scores (tied or identity heads), since the three wins would need
//   s(R,P) > s(R,S) = s(S,R) > s(S,P) = s(P,S) > s(P,R) = s(R,P);
// - rank-1 scores (d_head = 1), s(i,j) = q_i·k_j with scalars q and k: a query's highest score
//   falls on the item of largest k (q > 0) or of smallest k (q < 0), so two of the three items
//   are ever top, and three queries need three different ones.
// A sequence at 3/3 under either is a bug. (Accuracy itself can pass 2/3: the readout of a soft
// mixture of payloads can still land on the right one.)
struct Ranking {
  double mean, max;
};
Ranking beater_ranking(const nn::Transformer& m, std::uint64_t seed) {
  const RpsTask three(3, 3);
  Generator gen(seed ^ 0x3c7c1eULL);
  const Batch batch = three.sample(512, gen);
  NoGradGuard no_grad;
  const Array<double> s = m.forward(batch.tokens, true).attention.back().scores.to(DType::float64).value<double>();
  double total = 0, worst = 0;
  for (std::size_t b = 0; b < batch.tokens.shape()[0]; ++b) {
    std::size_t at[3];  // the position of each symbol
    for (std::size_t t = 0; t < 3; ++t) at[batch.tokens(b, t) / RpsTask::n_payloads] = t;
    double right = 0;
    for (std::size_t sym = 0; sym < 3; ++sym) {  // sym + 1 beats sym; sym + 2 is beaten by it
      const std::size_t i = at[sym];
      const double beater = s(b, 0, i, at[(sym + 1) % 3]);
      right += beater > s(b, 0, i, at[(sym + 2) % 3]) && beater > s(b, 0, i, i) ? 1 : 0;
    }
    total += right / 3;
    worst = std::max(worst, right / 3);
  }
  return {total / double(batch.tokens.shape()[0]), worst};
}

// At init: the mean entropy and the mean largest weight of every attention row, over all heads and
// layers; and ‖∂loss/∂W_q‖ over all layers, on one training batch.
Json init_attention_stats(nn::Transformer& m, const Task& task, const std::vector<std::vector<std::int64_t>>& inputs,
                                    std::uint64_t seed) {
  double entropy = 0, top = 0;
  std::size_t rows = 0;
  {
    NoGradGuard no_grad;
    for (const auto& input : inputs) {
      IndexArray tokens = IndexArray::from_shape({1, input.size()});
      std::copy(input.begin(), input.end(), tokens.begin());
      for (const auto& r : m.forward(tokens, true).attention) {
        const Array<double> w = r.weights.to(DType::float64).value<double>();  // (1, H, T, T)
        const std::size_t H = w.shape()[1], T = w.shape()[2];
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t i = 0; i < T; ++i) {
            double e = 0, best = 0;
            for (std::size_t j = 0; j < T; ++j) {
              const double p = w(0, h, i, j);
              if (p > 0) e -= p * std::log(p);
              best = std::max(best, p);
            }
            entropy += e;
            top += best;
            ++rows;
          }
      }
    }
  }
  Generator gen(seed);
  const Batch b = task.sample(32, gen);
  m.zero_grad();
  m.loss(m.forward(b.tokens), b.targets).backward();
  double grad = 0;
  for (const auto& block : m.blocks) {
    if (!block->attn.q_proj) continue;
    const Array<double> g = block->attn.q_proj->weight.grad().to(DType::float64).value<double>();
    for (double v : g) grad += v * v;
  }
  m.zero_grad();
  return {{"entropy_init", entropy / double(rows)}, {"max_weight_init", top / double(rows)},
          {"grad_norm_init", std::sqrt(grad)}};
}

// Bytes the KV caches of all layers hold per token of one sequence, measured on a real cache.
std::size_t kv_cache_bytes_per_token(const nn::Transformer& m, const std::vector<std::int64_t>& input) {
  NoGradGuard no_grad;
  IndexArray tokens = IndexArray::from_shape({1, input.size()});
  std::copy(input.begin(), input.end(), tokens.begin());
  const nn::TransformerOutput f = m.forward(tokens);
  std::size_t bytes = 0;
  for (std::size_t l = 0; l < m.blocks.size(); ++l) {
    nn::KVCache cache;
    m.blocks[l]->attn.forward(f.inputs[l], {.causal = true}, false, &cache);
    bytes += cache.bytes_per_sequence();
  }
  return bytes / input.size();
}

struct Stats {
  double mean = 0, sd = 0;
  std::size_t n = 0;
};

Stats stats(const std::vector<double>& v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / double(v.size() - 1));
  }
  return s;
}

std::string mean_sd(const std::vector<double>& v, const char* format) {
  const Stats s = stats(v);
  if (s.n == 0) return "-";
  const std::string mean = fmt::format(fmt::runtime(format), s.mean);
  return s.n == 1 ? mean : mean + " ± " + fmt::format(fmt::runtime(format), s.sd);
}

std::string label_text(const Json& labels) {
  std::string out;
  for (const auto& [key, value] : labels.items())
    out += (out.empty() ? "" : " / ") + (value.is_string() ? value.get<std::string>() : value.dump());
  return out;
}

struct Group {
  Json labels;
  std::vector<const Json*> runs;
};

std::vector<Group> groups_of(const Json& runs) {
  std::vector<Group> groups;
  for (const auto& run : runs) {
    const Json& labels = run.at("labels");
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.labels == labels; });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{labels, {}});
    it->runs.push_back(&run);
  }
  return groups;
}

std::vector<double> column(const Group& g, const char* key) {
  std::vector<double> v;
  for (const auto* r : g.runs)
    if (r->contains(key) && !r->at(key).is_null()) v.push_back(r->at(key).get<double>());
  return v;
}

std::string markdown_table(const std::string& name, const Json& runs) {
  const std::vector<Group> groups = groups_of(runs);
  if (groups.empty()) return "";
  std::vector<std::string> header;
  for (const auto& [key, value] : groups[0].labels.items()) header.push_back(key);
  header.insert(header.end(), {"accuracy", "steps to target", "σ init", "σ", "score asymmetry"});
  struct Extra {
    std::string key, header, format;
  };
  std::vector<Extra> extras;
  if (name == "scale")
    extras = {{"entropy_init", "entropy at init", "{:.3f}"}, {"max_weight_init", "max weight at init", "{:.3f}"},
              {"grad_norm_init", "‖∂L/∂W_q‖ at init", "{:.3g}"}};
  if (name == "kv") extras = {{"kv_cache_bytes_per_token", "KV cache bytes/token", "{:.0f}"}};
  bool rps = false;
  for (const Json& run : runs) rps = rps || run["task"] == "rps";
  if (rps) extras.push_back({"beater_top", "beater scored top (3 items)", "{:.3f}"});
  for (const Extra& x : extras) header.push_back(x.header);
  std::string out = "| " + fmt::format("{}", fmt::join(header, " | ")) + " |\n|";
  for (std::size_t i = 0; i < header.size(); ++i) out += "---|";
  out += "\n";
  for (const Group& g : groups) {
    std::vector<std::string> cells;
    for (const auto& [key, value] : g.labels.items())
      cells.push_back(value.is_string() ? value.get<std::string>() : value.dump());
    cells.push_back(mean_sd(column(g, "accuracy"), "{:.3f}"));
    const std::vector<double> reached = column(g, "steps_to_target");
    cells.push_back(reached.empty() ? fmt::format("not reached (0/{})", g.runs.size())
                                    : fmt::format("{} ({}/{})", mean_sd(reached, "{:.0f}"), reached.size(), g.runs.size()));
    cells.push_back(mean_sd(column(g, "sigma_init"), "{:.3f}"));
    cells.push_back(mean_sd(column(g, "sigma"), "{:.3f}"));
    cells.push_back(mean_sd(column(g, "score_asymmetry"), "{:.3f}"));
    for (const Extra& x : extras) cells.push_back(mean_sd(column(g, x.key.c_str()), x.format.c_str()));
    out += "| " + fmt::format("{}", fmt::join(cells, " | ")) + " |\n";
  }
  return out;
}

// Horizontal bars of mean accuracy with ±1 std whiskers and every seed as a dot; a dashed line at 2/3.
std::string accuracy_chart(const std::string& name, const Json& runs) {
  const std::vector<Group> groups = groups_of(runs);
  const double label_w = 260, plot_w = 400, row = 20, top = 40;
  const double height = top + row * double(groups.size()) + 40, width = label_w + plot_w + 30;
  const auto x = [&](double acc) { return label_w + plot_w * std::clamp(acc, 0.0, 1.0); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"DejaVu Sans, sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
  s += fmt::format("<text x=\"8\" y=\"18\" font-size=\"13\" font-weight=\"bold\">qkv experiment {}: held-out accuracy "
                   "(mean ± std over seeds; dots: seeds)</text>\n",
                   escape_xml(name));
  for (double tick = 0; tick <= 1.0001; tick += 0.2) {
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>\n", x(tick), top - 4,
                     top + row * double(groups.size()));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#555\">{:.1f}</text>\n", x(tick),
                     top + row * double(groups.size()) + 14, tick);
  }
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    const double y = top + row * double(i);
    const Stats a = stats(column(g, "accuracy"));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", label_w - 6, y + row * 0.65,
                     escape_xml(label_text(g.labels)));
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#6baed6\"><title>{:.4f}</title></rect>\n",
                     label_w, y + 3, x(a.mean) - label_w, row - 6, a.mean);
    if (a.n > 1)
      s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#08306b\" stroke-width=\"1.5\"/>\n",
                       x(a.mean - a.sd), x(a.mean + a.sd), y + row / 2);
    for (double v : column(g, "accuracy"))
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.2\" fill=\"#08306b\"/>\n", x(v), y + row / 2);
  }
  s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#b2182b\" stroke-dasharray=\"4 3\"/>\n",
                   x(2.0 / 3), top - 8, top + row * double(groups.size()));
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#b2182b\" text-anchor=\"middle\">2/3</text>\n", x(2.0 / 3),
                   top - 10);
  s += "</svg>\n";
  return s;
}

}  // namespace

std::vector<std::string> experiment_names() { return {"ablations", "dhead", "scale", "kv", "causal"}; }

ExperimentResult run_experiment(const ExperimentOptions& e, std::ostream& progress, bool tty) {
  const std::vector<Config> configs = plan(e);
  const std::size_t seeds = e.seeds ? e.seeds : e.quick ? 1 : 5;
  const std::string out = e.out.empty() ? "runs/experiment-" + e.name : e.out;
  std::filesystem::create_directories(out + "/runs");
  std::ostringstream quiet;
  ExperimentResult result;
  result.runs = Json::array();
  const std::size_t total = configs.size() * seeds;
  std::size_t done = 0;
  for (std::uint64_t seed = 0; seed < seeds; ++seed)
    for (std::size_t c = 0; c < configs.size(); ++c) {
      const Config& config = configs[c];
      TrainOptions o = config.options;
      o.seed = seed;
      o.out = fmt::format("{}/runs/{:02}-seed{}", out, c, seed);
      o.force = true;  // the experiment's own runs: a rerun replaces them
      const auto task = make_task(o.task);
      const auto sequences = held_out_sequences(*task, 16, seed);
      Json run = {{"experiment", e.name},
                            {"task", o.task},
                            {"variant", variant_of(o.model)},
                            {"embeddings", o.model.frozen_embeddings ? "frozen" : "learned"},
                            {"seed", seed},
                            {"labels", config.labels}};
      {
        Generator gen(o.seed);  // the same init as train()'s
        nn::Transformer init(o.model, gen);
        run["sigma_init"] = readout_sigma(init);
        if (e.name == "scale") run.update(init_attention_stats(init, *task, sequences, seed));
      }
      progress << fmt::format("[{:>3}/{}] {}, seed {}", done + 1, total, label_text(config.labels), seed)
               << (tty ? "\n" : "") << std::flush;
      const TrainResult r = train(o, tty ? progress : quiet, tty);
      const auto model = load_model(o.out);
      run["accuracy"] = r.eval.accuracy;
      run["steps_to_target"] = r.steps_to_target ? Json(*r.steps_to_target) : Json(nullptr);
      run["target"] = o.target;
      run["steps"] = r.steps;
      run["seconds"] = r.seconds;
      run["sigma"] = readout_sigma(*model);
      run["score_asymmetry"] = readout_score_asymmetry(*model, sequences);
      if (e.name == "kv") run["kv_cache_bytes_per_token"] = kv_cache_bytes_per_token(*model, sequences.front());
      if (o.task == "rps") {
        const Ranking ranking = beater_ranking(*model, seed);
        run["beater_top"] = ranking.mean;
        run["beater_top_max"] = ranking.max;
      }
      run["config"] = Json::parse(config_text(o));
      progress << fmt::format("{}: accuracy {:.4f}, {}, {:.1f} s\n", tty ? "  done" : "", r.eval.accuracy,
                              r.steps_to_target ? fmt::format("target at step {}", *r.steps_to_target)
                                                : std::string("target not reached"),
                              r.seconds)
               << std::flush;
      // Symmetric and rank-1 scores cannot put the 3-cycle of rps on top: see Ranking.
      const bool bounded = run["variant"] == "tied" || run["variant"] == "identity" || o.model.d_head == 1;
      if (o.task == "rps" && bounded && run["beater_top_max"].get<double>() > 2.0 / 3 + 1e-9)
        result.warnings.push_back(fmt::format("{}, seed {}: a symmetric or rank-1 score put every beater on top in "
                                              "a sequence, which it cannot: a bug", label_text(config.labels), seed));
      result.runs.push_back(std::move(run));
      ++done;
    }
  result.table = markdown_table(e.name, result.runs);
  for (const std::string& w : result.warnings) result.table += "\nWARNING: " + w + "\n";
  result.chart = accuracy_chart(e.name, result.runs);
  const Json file = {{"experiment", e.name}, {"quick", e.quick}, {"seeds", seeds}, {"runs", result.runs}};
  nn::write_atomically(out + "/results.json", file.dump(1) + "\n");
  nn::write_atomically(out + "/" + e.name + ".svg", result.chart);
  nn::write_atomically(out + "/table.md", result.table);
  return result;
}

}  // namespace qkv::cli
