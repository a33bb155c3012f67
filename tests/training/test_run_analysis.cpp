// What the program does with a run folder, as library calls: on a run of a task qkv does not know
// (a library program's, written with nn::save_config and nn::save_checkpoint).
#include "tests/helpers.hpp"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/circuits.hpp"
#include "qkv/tasks/dataset.hpp"
#include "qkv/tasks/vocabulary_task.hpp"
#include "qkv/training/run_analysis.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

// A run folder as a library program writes one: an untrained bidirectional pointer model over 5
// tokens, its config.json and a checkpoint; with `tokens`, config.json also names them.
nn::TransformerConfig write_library_run(const std::string& dir, const std::vector<std::string>& tokens = {}) {
  const nn::TransformerConfig config{.vocab_size = 5, .n_classes = 0, .max_len = 6, .readout = nn::Readout::pointer,
                                     .causal = false, .layers = 2, .d_model = 8, .heads = 2};
  Generator gen(7);
  nn::Transformer model(config, gen);
  const nn::RunLock lock(dir);
  nn::save_config(dir, config);
  if (!tokens.empty()) {
    std::ifstream in(dir + "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["tokens"] = tokens;
    std::ofstream(dir + "/config.json") << j.dump();
  }
  nn::save_checkpoint(dir, model, {}, {.step = 1});
  return config;
}

}  // namespace

TEST_CASE("a library program's run is inspected on the tokens given, with every head's circuits") {
  const std::string dir = scratch("library-run");
  write_library_run(dir);
  const std::unique_ptr<tasks::Task> task = training::run_task(dir);
  REQUIRE(dynamic_cast<const tasks::VocabularyTask*>(task.get()));
  CHECK(task->info().name == "run");
  CHECK(task->info().vocab_size == 5);
  CHECK(task->token_name(3) == "3");
  CHECK(task->encode("4 0 2") == std::vector<std::int64_t>{4, 0, 2});
  CHECK_THROWS_WITH(task->encode("0 5"), Contains("cannot read '5'"));
  CHECK_THROWS_WITH(training::inspect_run(dir, std::nullopt, false), Contains("the input must be given"));

  const training::RunInspection run = training::inspect_run(dir, std::vector<std::int64_t>{1, 4, 0, 2}, false);
  const analysis::Inspection& in = std::get<analysis::Inspection>(run);
  const auto model = nn::load_transformer(dir);
  REQUIRE(in.layers.size() == 2);
  for (std::size_t l = 0; l < 2; ++l) {
    REQUIRE(in.layers[l].size() == 2);
    for (std::size_t h = 0; h < 2; ++h)  // σ of the saved weights, computed apart
      CHECK(in.layers[l][h].sigma == Approx(nn::symmetric_share(nn::qk_circuit(model->blocks[l]->attn, h))).epsilon(1e-12));
  }
  CHECK(in.input_names == std::vector<std::string>{"1", "4", "0", "2"});
  CHECK(in.target_name.empty());  // no targets: the task is not known
  CHECK(in.composition.size() == 4);  // 2 heads of layer 0 into 2 of layer 1
  CHECK(in.layers[0][0].attention.shape() == std::vector<std::size_t>{4, 4});
  // The task draws no sequences: the head detectors read the input, 1 4 0 2 (a bidirectional
  // model: each query's weight on the key before it, over all four queries).
  CHECK_FALSE(in.detection_held_out);
  CHECK(in.detection_sequences == 1);
  const Array<double>& w = in.layers[1][1].attention;
  CHECK(in.layers[1][1].detection.previous_token == Approx((w(1, 0) + w(2, 1) + w(3, 2)) / 4).epsilon(1e-6));
  CHECK(in.layers[1][1].detection.duplicate_token == 0);  // no token twice
}

TEST_CASE("a library program's run names its tokens as config.json saved them, and bad names are refused") {
  const std::string dir = scratch("library-run-tokens");
  write_library_run(dir, {"a", "b", "c", "d", "e"});
  const std::unique_ptr<tasks::Task> task = training::run_task(dir);
  CHECK(task->token_name(2) == "c");
  CHECK(task->encode("e a 1") == std::vector<std::int64_t>{4, 0, 1});  // names, or ids
  CHECK(task->decode({3, 1}) == "d b");
  const auto in = std::get<analysis::Inspection>(training::inspect_run(dir, task->encode("b c d"), false));
  CHECK(in.vocabulary == std::vector<std::string>{"a", "b", "c", "d", "e"});
  CHECK(in.input_names == std::vector<std::string>{"b", "c", "d"});

  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"a", "b"}, "'tokens' holds 2 names for a vocabulary of 5"},
      {{"a", "b", "c", "d", "\x1b[2J"}, "'tokens'[4] must be 1 to 40 bytes of printable text without spaces"},
      {{"a", "b c", "c", "d", "e"}, "'tokens'[1] must be 1 to 40 bytes"},
      {{"a", "b", "c", "d", ""}, "'tokens'[4] must be 1 to 40 bytes"},
      {{"a", "3", "c", "d", "e"}, "'tokens'[1] is '3', the id of another token"},
      {{"a", "b", "a", "d", "e"}, "'tokens'[2] 'a' names two tokens"}};
  for (const auto& [tokens, message] : bad) {
    INFO(message);
    const std::string folder = scratch("library-run-bad-tokens");
    write_library_run(folder, tokens);
    CHECK_THROWS_WITH(training::run_task(folder), Contains(folder + "/config.json: " + message));
  }
}

TEST_CASE("save_model_config writes the names open_run reads, refuses bad ones before writing, and parse_input checks the input") {
  const std::string dir = scratch("library-run-saved-names");
  const nn::TransformerConfig config = write_library_run(dir);
  std::filesystem::remove(dir + "/config.json");
  CHECK_THROWS_WITH(training::save_model_config(dir, config, {"a", "b", "a", "d", "e"}),
                    Contains(dir + "/config.json: 'tokens'[2] 'a' names two tokens"));
  CHECK_THROWS_AS(training::save_model_config(dir, config, {"a", "b"}), std::invalid_argument);
  CHECK_FALSE(std::filesystem::exists(dir + "/config.json"));  // nothing written
  training::save_model_config(dir, config, {"orca", "seal", "krill", "algae", "salmon"});
  const training::RunInfo run = training::open_run(dir);
  CHECK(run.library_run());
  CHECK(run.input_positions == 6);
  CHECK(training::parse_input(run, "seal krill 4") == std::vector<std::int64_t>{1, 2, 4});
  CHECK_THROWS_WITH(training::parse_input(run, "   "), "holds no tokens");
  CHECK_THROWS_WITH(training::parse_input(run, "orca orca orca orca orca orca orca"),
                    "7 tokens, but the model has 6 positions");
  CHECK_THROWS_WITH(training::parse_input(run, "orca whale"), Contains("cannot read 'whale'"));
  // The same model and tokens as inspect_run on the folder sees them.
  const auto in = std::get<analysis::Inspection>(training::inspect_run(run, training::parse_input(run, "algae salmon"), false));
  CHECK(in.input_names == std::vector<std::string>{"algae", "salmon"});
}

TEST_CASE("a config.json that names a task qkv does not know is refused, listing the tasks") {
  const std::string dir = scratch("library-run-unknown-task");
  write_library_run(dir);
  std::ifstream in(dir + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["task"] = "foodchain";
  std::ofstream(dir + "/config.json") << j.dump();
  CHECK_THROWS_WITH(training::run_task(dir), Contains("'task' is 'foodchain'") && Contains("brackets"));
  CHECK_THROWS_WITH(training::inspect_run(dir, std::vector<std::int64_t>{1, 2}, false), Contains("'task' is 'foodchain'"));
}

TEST_CASE("inspect refuses a model whose token tables would not fit in memory, before it allocates them") {
  const nn::TransformerConfig config{.vocab_size = 200000, .n_classes = 0, .max_len = 4, .readout = nn::Readout::pointer,
                                     .causal = false, .layers = 1, .d_model = 2, .heads = 1};
  Generator gen(1);
  const nn::Transformer model(config, gen);
  const tasks::VocabularyTask task("run", config);
  CHECK_THROWS_WITH(analysis::inspect(model, task, {1, 2, 3}), Contains("a vocabulary of 200000") && Contains("GiB"));
}

TEST_CASE("a library program's run is evaluated and ablated on a data file, and fresh sequences are refused naming config.json") {
  const std::string dir = scratch("library-run-eval");
  write_library_run(dir);
  CHECK_THROWS_WITH(training::evaluate_run(dir, 64, 1),
                    Contains(dir + "/config.json: names no task (a library program's run)") && Contains("--data"));
  CHECK_THROWS_WITH(training::ablate_run(dir, 64, 1), Contains("no sequences for an ablation"));

  // Two sequences of the model's own pointers: the first's targets are its predictions (all right),
  // the second's are each moved one key along (all wrong): accuracy 1/2, one of two exact.
  const auto model = nn::load_transformer(dir);
  const IndexArray tokens = {{1, 4, 0, 2}, {3, 3, 1, 0}};
  const IndexArray predicted = nn::Transformer::predictions(model->forward(tokens).logits);
  IndexArray targets = predicted;
  for (std::size_t t = 0; t < 4; ++t) targets(1, t) = (predicted(1, t) + 1) % 4;
  tasks::write_dataset(dir + "/data.jsonl", {{.tokens = tokens, .targets = targets}});
  const nlohmann::json result = training::evaluate_run(dir, dir + "/data.jsonl");
  CHECK(result.at("task") == "run");
  CHECK(result.at("sequences") == 2);
  CHECK(result.at("accuracy") == 0.5);
  CHECK(result.at("exact_match") == 0.5);

  const analysis::Ablation a = training::ablate_run(dir, dir + "/data.jsonl");
  CHECK(a.dir == dir);
  CHECK(a.data == dir + "/data.jsonl");
  CHECK(a.clean.accuracy == 0.5);
  CHECK_FALSE(a.corrupted);  // the file gives no corrupted tokens
  REQUIRE(a.heads.size() == 4);
  CHECK(a.heads[0].read);
  CHECK_FALSE(a.heads[2].read);  // the readout is layer 1's head-0 scores
  CHECK_THROWS_WITH(training::evaluate_run(dir, dir + "/none.jsonl"), Contains(dir + "/none.jsonl"));
}

TEST_CASE("a library program's next-token run generates by its token names, as greedy decoding by hand does") {
  const std::string dir = scratch("library-run-generate");
  const nn::TransformerConfig config{.vocab_size = 5, .n_classes = 5, .max_len = 6, .layers = 1, .d_model = 8, .heads = 2};
  {
    Generator gen(11);
    nn::Transformer model(config, gen);
    const nn::RunLock lock(dir);
    training::save_model_config(dir, config, {"a", "b", "c", "d", "e"});
    nn::save_checkpoint(dir, model, {}, {.step = 1});
  }
  // By hand: the whole sequence through the model at each step, the likeliest next token appended.
  const auto model = nn::load_transformer(dir);
  std::vector<std::int64_t> tokens = {1, 3};
  for (int step = 0; step < 3; ++step) {
    const Array<double> logits = model->forward(tasks::one_row(tokens)).logits.to(DType::float64).value<double>();
    const std::size_t last = tokens.size() - 1;
    std::int64_t best = 0;
    for (std::int64_t v = 1; v < 5; ++v)
      if (logits(0, last, v) > logits(0, last, best)) best = v;
    tokens.push_back(best);
  }
  const char* const names[] = {"a", "b", "c", "d", "e"};
  std::string expected;
  for (const std::int64_t t : tokens) {
    if (!expected.empty()) expected += ' ';
    expected += names[t];
  }
  CHECK(training::generate_run(dir, "b d", {.tokens = 3}) == expected);
  CHECK(training::generate_run(dir, "1 3", {.tokens = 3, .cache = false}) == expected);
  CHECK_THROWS_WITH(training::generate_run(dir, "b d", {.tokens = 5}), Contains("--tokens: 5 after 2 input tokens pass the model's 6 positions"));
  CHECK_THROWS_WITH(training::generate_run(dir, "b z", {}), Contains("--input: ") && Contains("'z'"));
  CHECK_THROWS_WITH(training::generate_run(dir, "b", {.top_k = 2}), Contains("--top-k: needs --temperature"));
}
