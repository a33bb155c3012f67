#include "tests/helpers.hpp"

#include <map>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xtensor-blas/xlinalg.hpp>

#include "qkv/report/heatmap.hpp"
#include "qkv/analysis/inspect.hpp"
#include "qkv/report/explore.hpp"
#include "qkv/report/inspect.hpp"
#include "qkv/training/run_analysis.hpp"
#include "qkv/analysis/history.hpp"
#include "qkv/report/snapshots.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/optim/adam.hpp"
#include "tests/training/short_run.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

// LayerNorm of each row, by hand, with gain g and bias b.
Array<double> layer_norm_rows(const Array<double>& x, const Array<double>& g, const Array<double>& b, double eps) {
  Array<double> out = x;
  for (std::size_t i = 0; i < x.shape()[0]; ++i) {
    double mean = 0, var = 0;
    for (std::size_t j = 0; j < x.shape()[1]; ++j) mean += x(i, j);
    mean /= double(x.shape()[1]);
    for (std::size_t j = 0; j < x.shape()[1]; ++j) var += (x(i, j) - mean) * (x(i, j) - mean);
    var /= double(x.shape()[1]);
    for (std::size_t j = 0; j < x.shape()[1]; ++j) out(i, j) = (x(i, j) - mean) / std::sqrt(var + eps) * g(j) + b(j);
  }
  return out;
}

Array<double> f64_of(const Tensor& t) { return t.to(DType::float64).value<double>(); }

}  // namespace

TEST_CASE("inspect: circuits of a model loaded from its checkpoint equal the in-memory model's") {
  // An in-memory model a few Adam steps from its init, written as a run folder and loaded back.
  TrainOptions o = short_run("brackets", "inspect");
  Generator gen(o.seed);
  nn::Transformer model(o.model, gen);
  const Array<double> init = nn::qk_circuit(model.blocks[1]->attn, 0);
  optim::Adam opt(model.parameters(), {.lr = 1e-2});
  const BracketsTask task;
  for (int step = 0; step < 3; ++step) {
    const Batch b = task.sample(8, gen);
    opt.zero_grad();
    model.loss(model.forward(b.tokens), b.targets).backward();
    opt.step();
  }
  const bool changed = !(nn::qk_circuit(model.blocks[1]->attn, 0) == init);
  CHECK(changed);
  std::filesystem::create_directories(o.out);
  nn::write_atomically(o.out + "/config.json", config_text(o));
  nn::save_safetensors(o.out + "/model.safetensors", model.state_dict());
  const auto loaded = load_model(o.out);
  for (std::size_t l = 0; l < o.model.layers; ++l)
    for (std::size_t h = 0; h < o.model.heads; ++h) {
      const bool same_qk = nn::qk_circuit(model.blocks[l]->attn, h) == nn::qk_circuit(loaded->blocks[l]->attn, h);
      const bool same_ov = nn::ov_circuit(model.blocks[l]->attn, h) == nn::ov_circuit(loaded->blocks[l]->attn, h);
      CHECK(same_qk);
      CHECK(same_ov);
    }
  const auto input = typical_input(task);
  CHECK(input.size() >= 19);  // 3/4 of 25 positions
  CHECK(to_json(inspect(model, task, input)) == to_json(inspect(*loaded, task, input)));
  std::filesystem::remove_all(o.out);
}

TEST_CASE("inspect: token QK table, attention, score asymmetry and opener weight, independently") {
  Generator gen(3);
  const BracketsTask task;
  const TrainOptions o = default_options("brackets");
  const nn::Transformer model(o.model, gen);
  const std::vector<std::int64_t> input = task.encode("(()[])");  // BOS ( ( ) [ ] )
  const Inspection in = inspect(model, task, input, "mem");
  REQUIRE(in.layers.size() == 2);
  REQUIRE(in.layers[0].size() == 2);
  CHECK(in.input_names == std::vector<std::string>{"BOS", "(", "(", ")", "[", "]", ")"});
  CHECK(in.vocabulary == std::vector<std::string>{"BOS", "(", ")", "[", "]", "pad"});

  // Token table of layer 0, head 1: (LN(E) W_qᵀ + b_q)(LN(E) W_kᵀ + b_k)ᵀ / √d_head, by hand.
  const nn::TransformerBlock& block = *model.blocks[0];
  const std::size_t d_head = 8, h = 1;
  const Array<double> x = layer_norm_rows(f64_of(model.tok.weight), f64_of(block.ln1->weight), f64_of(block.ln1->bias),
                                          block.ln1->eps);
  const Array<double> wq = f64_of(block.attn.q_proj->weight), bq = f64_of(block.attn.q_proj->bias);
  const Array<double> wk = f64_of(block.attn.k_proj->weight), bk = f64_of(block.attn.k_proj->bias);
  const Array<double> q = xt::view(xt::linalg::dot(x, xt::transpose(wq)) + bq, xt::all(), xt::range(h * d_head, (h + 1) * d_head));
  const Array<double> k = xt::view(xt::linalg::dot(x, xt::transpose(wk)) + bk, xt::all(), xt::range(h * d_head, (h + 1) * d_head));
  const Array<double> expected = xt::linalg::dot(q, xt::transpose(k)) / std::sqrt(double(d_head));
  check_close(in.layers[0][1].token_qk, expected, 1e-5);  // float32 model

  for (const auto& heads : in.layers)
    for (const HeadInspection& hi : heads) {
      INFO("layer " << hi.layer << " head " << hi.head);
      // Causal weights: rows sum to 1, nothing after the query.
      for (std::size_t i = 0; i < input.size(); ++i) {
        const double row_sum = xt::sum(xt::view(hi.attention, i))();
        CHECK(row_sum == Approx(1).epsilon(1e-6));
        for (std::size_t j = i + 1; j < input.size(); ++j) {
          CHECK(hi.attention(i, j) == 0);
          CHECK(std::isinf(hi.scores(i, j)));
        }
      }
      // Openers of the closers at 3, 5 and 6: positions 2, 4 and 1.
      REQUIRE(hi.target_attention);
      CHECK(*hi.target_attention == Approx((hi.attention(3, 2) + hi.attention(5, 4) + hi.attention(6, 1)) / 3));
      CHECK_FALSE(hi.score_asymmetry);  // causal: no two positions see each other both ways
      CHECK(hi.qk_spectrum.rank <= d_head);
      CHECK(hi.sigma == Approx(nn::symmetric_share(hi.qk)));
      REQUIRE(hi.shapes.size() == 4);
      CHECK(hi.shapes[0] == Shape{16, 8});
      CHECK(hi.shapes[3] == Shape{8, 16});
      const double wq_norm = std::sqrt(xt::sum(xt::square(f64_of(model.blocks[hi.layer]->attn.W_q(hi.head))))());
      CHECK(hi.norms[0] == Approx(wq_norm));
    }
}

TEST_CASE("inspect: a bidirectional model's score asymmetry is the softmax-invariant one of its scores, and a tied model's is 0") {
  const RpsTask task;
  const std::vector<std::int64_t> input = typical_input(task);
  CHECK(input.size() >= 9);  // 3/4 of 12
  for (const nn::QK qk : {nn::QK::untied, nn::QK::tied}) {
    TrainOptions o = default_options("rps");
    o.model.qk = qk;
    Generator gen(5);
    const nn::Transformer model(o.model, gen);
    const Inspection in = inspect(model, task, input);
    const HeadInspection& h = in.layers[0][0];
    REQUIRE(h.score_asymmetry);
    CHECK(*h.score_asymmetry == Approx(*nn::softmax_invariant_asymmetry(h.scores, xt::ones<bool>(h.scores.shape()))).epsilon(1e-12));
    CHECK_FALSE(h.target_attention);
    if (qk == nn::QK::tied) {
      CHECK(*h.score_asymmetry < 1e-6);  // q = k for every token: S = Sᵀ up to float32 rounding
      CHECK(std::abs(h.sigma - 1) < 1e-12);
      CHECK(nn::antisymmetry(h.token_qk) < 1e-6);
    } else {
      CHECK(*h.score_asymmetry > 0.1);
    }
  }
}

TEST_CASE("inspect --json parses and has the keys of the issue") {
  Generator gen(4);
  const InductionTask task;
  TrainOptions o = default_options("induction");
  o.model.heads = 2;
  const nn::Transformer model(o.model, gen);
  const auto input = task.encode("3 1 4 1");
  const Inspection in = inspect(model, task, input, "runs/x");
  const nlohmann::json j = nlohmann::json::parse(to_json(in).dump());
  CHECK(j.at("task") == "induction");
  REQUIRE(j.at("layers").size() == 2);
  const auto& head = j.at("layers")[1].at("heads")[0];
  for (const char* key : {"sigma", "antisymmetry", "singular_values", "stable_rank", "rank", "eigenvalues", "token_qk"})
    CHECK(head.contains(key));
  CHECK(head.at("singular_values").size() == 32);
  CHECK(head.at("eigenvalues").size() == 32);
  CHECK(head.at("eigenvalues")[0].size() == 2);  // [re, im]
  CHECK(head.at("token_qk").at("tokens").size() == 48);
  CHECK(head.at("token_qk").at("scores").size() == 48);
  CHECK(head.at("token_qk").at("scores")[0].size() == 48);
  CHECK(head.at("rank").get<std::size_t>() <= 16);
  const auto& input_json = j.at("input");
  CHECK(input_json.at("tokens") == nlohmann::json({"3", "1", "4", "1"}));
  REQUIRE(input_json.at("attention").size() == 2);
  REQUIRE(input_json.at("attention")[0].size() == 2);
  CHECK(input_json.at("attention")[0][0].size() == 4);
  CHECK(input_json.at("scores")[0][0][0][1].is_null());  // masked: after the query
  CHECK(input_json.at("score_asymmetry")[1].size() == 2);
  CHECK_FALSE(input_json.contains("opener_attention"));
  CHECK(head.at("sigma").get<double>() == Approx(in.layers[1][0].sigma));
  // Every head of layer 0 into every head of layer 1, writer by writer.
  REQUIRE(j.at("composition").size() == 4);
  const auto& c = j.at("composition")[2];
  CHECK(c.at("from") == "L0H1");
  CHECK(c.at("to") == "L1H0");
  for (const auto& [key, kind] : {std::pair{"q", nn::Composition::q}, {"k", nn::Composition::k}, {"v", nn::Composition::v}})
    CHECK(c.at(key).get<double>() == nn::composition_score(model.blocks[0]->attn, 1, model.blocks[1]->attn, 0, kind));
  std::ostringstream report;
  print_report(report, in, false);
  CHECK_THAT(report.str(), Contains("L0H1  L1H0"));
  CHECK_THAT(report.str(), Contains("← the largest"));
  CHECK_THAT(to_html(in), Contains("<h2>Composition</h2>"));
}

TEST_CASE("inspect: the report, the page and the SVG files") {
  Generator gen(6);
  const BracketsTask task;
  const nn::Transformer model(default_options("brackets").model, gen);
  const Inspection in = inspect(model, task, task.encode("([])"), "runs/b");
  std::ostringstream plain, coloured;
  print_report(plain, in, false);
  print_report(coloured, in, true);
  CHECK_THAT(plain.str(), Contains("layer 1 head 0"));
  CHECK_THAT(plain.str(), Contains("input: BOS ( [ ] )"));
  CHECK_THAT(plain.str(), Contains("weight on opener"));
  CHECK(plain.str().find('\x1b') == std::string::npos);
  CHECK_THAT(coloured.str(), Contains("\x1b[38;5;"));
  const std::string html = to_html(in);
  CHECK_THAT(html, Contains("<svg"));
  // No fetch: the one URL is the SVG namespace, and the page's one script loads nothing.
  for (std::size_t at = html.find("http"); at != std::string::npos; at = html.find("http", at + 1))
    CHECK(html.compare(at, 26, "http://www.w3.org/2000/svg") == 0);
  CHECK(html.find("<script>") == html.rfind("<script"));
  for (const char* load : {"src=", "fetch(", "XMLHttpRequest", "import(", "url("}) CHECK(html.find(load) == std::string::npos);
  // Each head's link and pictures, the first head shown, the others hidden until picked.
  CHECK_THAT(html, Contains("<a href=\"#L1H1\">L1H1</a>"));
  CHECK_THAT(html, Contains("<section class=\"head\" id=\"L0H0\">"));
  CHECK_THAT(html, Contains("<section class=\"head\" id=\"L1H1\" hidden>"));
  const auto dir = std::filesystem::temp_directory_path() / ("qkv_svgs_" + std::to_string(::getpid()));
  const auto files = write_svgs(in, dir.string());
  CHECK(files.size() == 2 * 2 * 4);
  for (const auto& f : files) CHECK(std::filesystem::file_size(f) > 500);
  std::filesystem::remove_all(dir);
}

TEST_CASE("heatmaps: shades by magnitude, signs, masked cells, and SVG cells with escaped labels") {
  Heatmap map{Array<double>({{1.0, -0.6}, {0.2, NAN}}), {"a", "<b>"}, {"x", "y"}, "t", true};
  const std::string text = heatmap_text(map, false);
  // 1 → █ (full), −0.6 → # (≥ 0.55, negative), 0.2 → ░, masked → ··
  CHECK_THAT(text, Contains("\n  a ██##\n"));
  CHECK_THAT(text, Contains("<b> ░░··"));
  const std::string svg = heatmap_svg(map);
  std::size_t cells = 0;
  for (std::size_t at = svg.find("<title>"); at != std::string::npos; at = svg.find("<title>", at + 1)) ++cells;
  CHECK(cells == 3);  // the masked cell shows the grey background
  CHECK_THAT(svg, Contains("&lt;b&gt;"));
  CHECK_THAT(svg, Contains("fill=\"#b2182b\""));  // the largest value: full red
  CHECK_THAT(svg, Contains("fill=\"#d9d9d9\""));  // masked: grey
  CHECK(svg.find("<b>") == std::string::npos);
  // Labels of two characters are written downwards, rather than run together: "12" over "7".
  const Heatmap numbers{Array<double>({{1.0, 0.0}}), {"a"}, {"12", "7"}, "t", false};
  CHECK_THAT(heatmap_text(numbers, false), Contains("t\n  1 7 \n  2   \na ██  \n"));
}

namespace {

// A short induction run of 4 layers of 4 heads (d_model 64): the page's size bound is for it.
TrainOptions wide_run(const std::string& name, std::size_t steps) {
  TrainOptions o = short_run("induction", name, steps, 10);
  o.model.layers = 4;
  o.model.heads = 4;
  o.model.d_model = 64;
  return o;
}

}  // namespace

TEST_CASE("inspect --html: every head's pictures are on the page, and 4 layers of 4 heads stay within 2 MB") {
  // A short run of 4 layers of 4 heads with snapshots: each head's four pictures and its attention
  // along training, the readout heads of the last layers as much as the first.
  std::ostringstream quiet;
  TrainOptions o = wide_run("page_heads", 20);
  o.snapshot_every = 10;
  train(o, quiet, false);
  const auto task = make_task("induction");
  Inspection in = inspect(*load_model(o.out), *task, typical_input(*task), o.out);
  in.history = read_history(o.out, o.model);
  const std::string page = to_html(in);
  for (std::size_t l = 0; l < 4; ++l)
    for (std::size_t h = 0; h < 4; ++h)
      for (const char* picture : {"attention on the input<", "token QK<", "position QK<", "QK circuit A", "at step 20<"}) {
        const std::string title = fmt::format("L{}H{} {}", l, h, picture);
        INFO(title);
        CHECK(page.find(title) != std::string::npos);
      }
  CHECK(page.size() < 2'000'000);
  std::filesystem::remove_all(o.out);
}

TEST_CASE("inspect --html: the Explore section's attention along training, packed, and thinned to its bound") {
  // 4 layers of 4 heads, every step kept: the slider's data are the kept checkpoints' attention.
  std::ostringstream quiet;
  TrainOptions o = wide_run("page_explore", 12);
  o.keep_checkpoints = "every:1";
  train(o, quiet, false);
  const auto task = make_task("induction");
  const auto model = load_model(o.out);
  Inspection in = inspect(*model, *task, typical_input(*task), o.out);
  in.along_training = training::attention_along_training(o.out, in.input, in.history);
  in.along_training_from = "kept checkpoints";
  REQUIRE(in.along_training.size() == 13);
  // The last step's attention is the model's own, as the page's pictures draw it.
  CHECK(in.along_training.back().attention[3][2](5, 1) == Approx(in.layers[3][2].attention(5, 1)).epsilon(1e-12));
  const auto data_of = [](const std::string& page) {
    const std::string start = "<script type=\"application/json\" id=\"explore-data\">";
    const std::size_t at = page.find(start) + start.size();
    return nlohmann::json::parse(page.substr(at, page.find("</script>", at) - at));
  };
  const std::string page = to_html(in);
  CHECK_THAT(page, Contains("over all 13 of the run's 13 kept checkpoints"));
  const nlohmann::json data = data_of(page);
  REQUIRE(data["steps"].size() == 13);
  CHECK(data["steps"][4]["step"] == 4);
  // Each weight as two digits of the alphabet, within 1/8190 of the model's; "~~" where masked.
  const std::string digits = data["digits"], cells = data["steps"][12]["attention"][3 * 4 + 2];
  const std::size_t T = in.input.size();
  REQUIRE(cells.size() == 2 * T * T);
  const Array<double>& w = in.along_training.back().attention[3][2];
  for (std::size_t q = 0; q < T; ++q)
    for (std::size_t k = 0; k < T; ++k) {
      const std::string c = cells.substr(2 * (q * T + k), 2);
      if (k > q) {
        CHECK(c == "~~");  // causal: the keys after the query
        continue;
      }
      CHECK(std::abs(double(digits.find(c[0]) * 64 + digits.find(c[1])) / 4095 - w(q, k)) <= 0.5 / 4095 + 1e-12);
    }
  CHECK(data["steps"][12]["sigma"][3 * 4 + 2].get<double>() == in.along_training.back().sigma[3][2]);

  // A hundred steps would pass the bound: an even choice of them, the first and the last kept.
  const std::vector<StepAttention> twelve = in.along_training;
  in.along_training.clear();
  for (std::size_t i = 0; i < 100; ++i) {
    in.along_training.push_back(twelve[i % twelve.size()]);
    in.along_training.back().step = 10 * i;
  }
  in.input_names[0] = "</script><b>";  // a token name cannot close the data's element
  const std::string thinned = to_html(in);
  const nlohmann::json few = data_of(thinned);
  const std::size_t per_step = 2 * 16 * T * T, fit = report::max_explore_bytes / per_step;
  CHECK(few["steps"].size() == fit);
  CHECK(few["steps"][0]["step"] == 0);
  CHECK(few["steps"][fit - 1]["step"] == 990);
  CHECK(few["tokens"][0] == "</script><b>");
  CHECK_THAT(thinned, Contains(fmt::format("over an even choice of {} of the run's 100 kept checkpoints", fit)));
  CHECK(thinned.size() < 2'000'000);
  // A step larger than the bound alone: the last step alone. A run that kept none: the trained
  // model, with no step to name.
  CHECK(report::explore_steps(5, report::max_explore_bytes + 1) == std::vector<std::size_t>{4});
  CHECK(report::explore_steps(3, report::max_explore_bytes / 3) == std::vector<std::size_t>{0, 1, 2});
  in.along_training.clear();
  const nlohmann::json alone = data_of(to_html(in));
  REQUIRE(alone["steps"].size() == 1);
  CHECK(alone["steps"][0]["step"].is_null());
  CHECK(alone["steps"][0]["sigma"][3 * 4 + 2].get<double>() == in.layers[3][2].sigma);
  std::filesystem::remove_all(o.out);
}

TEST_CASE("heatmaps: packed cells hold what the elements would, in a tenth of the bytes") {
  const Heatmap map{Array<double>({{1.0, -0.5}, {NAN, 0.25}}), {"(", ")"}, {"(", ")"}, "t", true, "query", "key", true};
  const std::string packed = heatmap_svg(map, Cells::packed);
  // Row by row, each cell's colour and value ("-" masked), and the names of the hover text.
  CHECK_THAT(packed, Contains("data-cells=\"b2182b:1 ") && Contains(":-0.5 - ") && Contains(":0.25\">"));
  CHECK_THAT(packed, Contains("data-rows=\"[&quot;query 0 (()&quot;,&quot;query 1 ())&quot;]\""));
  CHECK_THAT(packed, Contains("data-cols=\"[&quot;key 0 (()&quot;,&quot;key 1 ())&quot;]\""));
  CHECK(packed.find("<title>") == std::string::npos);
  CHECK_THAT(heatmap_svg(map), Contains("<title>query 1 ()) → key 1 ()): 0.25</title>"));
  CHECK_THAT(heatmap_script(), Contains("rows[r] + ' → ' + cols[c] + ': ' + value"));
  // A 32 × 32 map: a tenth of the bytes.
  const Heatmap large{xt::ones<double>({std::size_t(32), std::size_t(32)}), std::vector<std::string>(32, "a"),
                      std::vector<std::string>(32, "b"), "t", false, "query", "key", true};
  CHECK(heatmap_svg(large, Cells::packed).size() * 5 < heatmap_svg(large).size());
}

TEST_CASE("heatmaps: upright column labels of two digits stand apart, rather than read as one number") {
  // 25 tokens of two digits, in cells too narrow for two labels side by side: "21" "12" must not
  // read "2112". Between two labels of a line, at least 0.3 em (the browser test's bound).
  std::vector<std::string> names;
  for (std::size_t i = 0; i < 25; ++i) names.push_back(std::to_string(10 + (i * 7) % 40));
  const Heatmap map{xt::zeros<double>({std::size_t(25), std::size_t(25)}), names, names, "t", false, "query", "key", true};
  const std::string svg = heatmap_svg(map);
  // Each upright column label: its centre, line and size (the width of DejaVu Sans Mono: 0.602 em a character).
  const std::regex label(R"re(<text x="([0-9.]+)" y="([0-9.]+)" font-size="([0-9.]+)" text-anchor="middle">([0-9]+)</text>)re");
  std::map<std::string, std::vector<std::pair<double, double>>> lines;  // y: (centre, size)
  std::size_t labels = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator(); ++it, ++labels)
    lines[(*it)[2]].emplace_back(std::stod((*it)[1]), std::stod((*it)[3]));
  CHECK(labels == 25);
  for (auto& [y, line] : lines) {
    std::sort(line.begin(), line.end());
    for (std::size_t i = 1; i < line.size(); ++i) {
      const double size = line[i].second, width = 2 * 0.602 * size;
      INFO("labels at x " << line[i - 1].first << " and " << line[i].first << ", " << size << " px");
      CHECK(line[i].first - line[i - 1].first >= width + 0.3 * size);
    }
  }
}

TEST_CASE("inspect rejects an input longer than the model's positions, or outside its vocabulary") {
  Generator gen(7);
  const BracketsTask task;
  const nn::Transformer model(default_options("brackets").model, gen);
  CHECK_THAT(invalid_argument_message([&] { inspect(model, task, std::vector<std::int64_t>(26, 1)); }),
             Contains("inspect: the input holds 26 tokens, but the model has 25 positions"));
  CHECK_THAT(invalid_argument_message([&] { inspect(model, task, {0, 9}); }),
             Contains("inspect: token 9 is outside the vocabulary of 6"));
  CHECK_THAT(invalid_argument_message([&] { inspect(model, task, {}); }), Contains("the input holds no tokens"));
}

TEST_CASE("heads along training: a panel of many lines names the eight that stand out and gathers the rest in grey") {
  // 4 layers of 4 heads: 96 pairs of heads in different layers, 288 composition lines, and 16
  // heads' σ. Pair p's Q score ends at p / 1000 (K and V lower), so the strongest eight at the end
  // are pairs 95 … 88's Q; head i's σ moves by i / 100 from its start, so the heads that moved most
  // are the last eight.
  TrainingHistory h;
  for (std::size_t step : {0, 100}) {
    TrainingHistory::Snapshot s;
    s.step = step;
    s.accuracy = 0.5;
    s.sigma.assign(4, std::vector<double>(4, 0.5));
    s.score_asymmetry.assign(4, std::vector<std::optional<double>>(4));
    for (std::size_t i = 0; i < 16; ++i) s.sigma[i / 4][i % 4] = 0.5 + (step ? double(i) / 100 : 0);
    std::size_t p = 0;
    for (std::size_t l1 = 0; l1 < 4; ++l1)
      for (std::size_t l2 = l1 + 1; l2 < 4; ++l2)
        for (std::size_t h1 = 0; h1 < 4; ++h1)
          for (std::size_t h2 = 0; h2 < 4; ++h2, ++p)
            s.composition.push_back({l1, h1, l2, h2, step ? double(p) / 1000 : 0.2, 0.01, 0.02});
    h.snapshots.push_back(std::move(s));
  }
  const auto charts = training_charts(h);
  REQUIRE(charts.size() == 2);
  const std::string& svg = charts[1].second;
  // Legend entries are <text> elements; line titles are "panel / series".
  const auto named = [&](const std::string& series) { return svg.find(">" + series + "</text>") != std::string::npos; };
  CHECK(named("the other 280 scores"));
  CHECK(named("the other 8 heads"));
  CHECK(named("L2H3→L3H3 Q"));   // pair 95
  CHECK(named("L2H2→L3H0 Q"));   // pair 88
  CHECK_FALSE(named("L2H1→L3H3 Q"));  // pair 87: gathered
  CHECK_FALSE(named("L0H0→L1H0 V"));
  CHECK(named("L3H3"));
  CHECK(named("L2H0"));
  CHECK_FALSE(named("L1H3"));
  std::size_t legend = 0;
  for (std::size_t at = svg.find("width=\"18\" height=\"4\""); at != std::string::npos;
       at = svg.find("width=\"18\" height=\"4\"", at + 1))
    ++legend;
  CHECK(legend == 2 * (8 + 1));
  CHECK(svg.find("fill=\"#aaa\"") != std::string::npos);
  CHECK_THAT(svg, Contains("<title>composition / the other 280 scores</title>"));
}
