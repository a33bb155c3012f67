#include "tests/helpers.hpp"

#include <fstream>

#include "qkv/analysis/ablate.hpp"
#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/dataset.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/vocabulary_task.hpp"
#include "tests/training/short_run.hpp"

using namespace qkv;
using namespace qkv::test;
using Catch::Matchers::Contains;

namespace {

std::string write_lines(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// The message read_dataset gives for a file of `text`.
std::string refusal(const std::string& text, const Task& task, std::size_t positions = 8) {
  const std::string path = write_lines(scratch("dataset_refusal") + "/data.jsonl", text);
  return invalid_argument_message([&] { read_dataset(path, task, positions); });
}

}  // namespace

TEST_CASE("read_dataset: rows of one length batched together in file order, ids or the task's text, null and -100 unscored") {
  const nn::TransformerConfig config{.vocab_size = 5, .n_classes = 3, .max_len = 8, .layers = 1, .d_model = 8, .heads = 1};
  const tasks::VocabularyTask task("run", config, {"a", "b", "c", "d", "e"});
  std::string text = "{\"tokens\": [0, 1, 2], \"targets\": [-100, 1, 2]}\n"
                     "\n"
                     "{\"tokens\": \"e d c b a\", \"targets\": [0, null, 1, 2, 0]}\n"
                     "{\"tokens\": [4, 4, 4], \"targets\": [null, null, 0]}\n";
  const std::string dir = scratch("dataset");
  Dataset d = read_dataset(write_lines(dir + "/a.jsonl", text), task, 8);
  CHECK(d.file == dir + "/a.jsonl");
  REQUIRE(d.batches.size() == 2);
  CHECK(d.sequences() == 3);
  CHECK(d.scored() == 7);
  CHECK(d.corrupted.empty());
  CHECK(d.corruption.empty());
  const IndexArray first_tokens = {{0, 1, 2}, {4, 4, 4}}, first_targets = {{-100, 1, 2}, {-100, -100, 0}};
  CHECK(bool(d.batches[0].tokens == first_tokens));
  CHECK(bool(d.batches[0].targets == first_targets));
  const IndexArray second_tokens = {{4, 3, 2, 1, 0}}, second_targets = {{0, -100, 1, 2, 0}};
  CHECK(bool(d.batches[1].tokens == second_tokens));
  CHECK(bool(d.batches[1].targets == second_targets));

  // More rows of a length than a batch holds: batch_rows, then the rest.
  text.clear();
  for (std::size_t i = 0; i < batch_rows + 10; ++i)
    text += R"({"tokens": [1, 2], "targets": [0, 1], "corrupted": [3, 3]})" "\n";
  d = read_dataset(write_lines(dir + "/b.jsonl", text), task, 8);
  REQUIRE(d.batches.size() == 2);
  CHECK(d.batches[0].tokens.shape()[0] == batch_rows);
  CHECK(d.batches[1].tokens.shape()[0] == 10);
  REQUIRE(d.corrupted.size() == 2);
  CHECK(bool(d.corrupted[1] == filled(10, 2, 3)));
  CHECK_THAT(d.corruption, Contains("b.jsonl"));
}

TEST_CASE("read_dataset refuses a bad line naming the file, the line and the field") {
  const nn::TransformerConfig config{.vocab_size = 5, .n_classes = 3, .max_len = 8, .layers = 1, .d_model = 8, .heads = 1};
  const tasks::VocabularyTask task("run", config);
  const std::string ok = R"({"tokens": [0, 1], "targets": [1, 2]})" "\n";
  CHECK_THAT(refusal("", task), Contains("holds no sequences"));
  CHECK_THAT(refusal(ok + "{\"tokens\": [0, 1]", task), Contains("data.jsonl line 2: invalid JSON"));
  CHECK_THAT(refusal(R"({"tokens": [[[0]]], "targets": [1]})", task), Contains("line 1: ") && Contains("deep"));
  CHECK_THAT(refusal("[1, 2]\n", task), Contains("line 1: a line is one object"));
  CHECK_THAT(refusal(R"({"tokens": [0], "targets": [1], "weights": [1]})", task), Contains("unknown field 'weights'"));
  CHECK_THAT(refusal(R"({"targets": [1]})", task), Contains("'tokens' is missing"));
  CHECK_THAT(refusal(R"({"tokens": [1]})", task), Contains("'targets' is missing"));
  CHECK_THAT(refusal(R"({"tokens": [0, 5], "targets": [1, 1]})", task), Contains("'tokens'[1] is 5, not a token id 0-4"));
  CHECK_THAT(refusal(R"({"tokens": [0, -1], "targets": [1, 1]})", task), Contains("'tokens'[1] is -1"));
  CHECK_THAT(refusal(R"({"tokens": [0, 1.5], "targets": [1, 1]})", task), Contains("'tokens'[1] is 1.5"));
  CHECK_THAT(refusal(R"({"tokens": [], "targets": []})", task), Contains("'tokens' holds no tokens"));
  CHECK_THAT(refusal(R"({"tokens": {"a": 1}, "targets": []})", task), Contains("'tokens' is object"));
  CHECK_THAT(refusal(R"({"tokens": [0, 1, 2], "targets": [1, 1, 1]})", task, 2),
             Contains("'tokens' holds 3 tokens, but the model has 2 positions"));
  CHECK_THAT(refusal(R"({"tokens": "0 1 9", "targets": [1, 1, 1]})", task), Contains("'tokens': run: cannot read '9'"));
  CHECK_THAT(refusal(R"({"tokens": [0, 1], "targets": [1]})", task), Contains("'targets' holds 1 values for 2 tokens"));
  CHECK_THAT(refusal(R"({"tokens": [0, 1], "targets": [1, 3]})", task), Contains("'targets'[1] is 3, not a class 0-2"));
  CHECK_THAT(refusal(R"({"tokens": [0, 1], "targets": [-1, 0]})", task), Contains("'targets'[0] is -1"));
  CHECK_THAT(refusal(ok + R"({"tokens": [0, 1], "targets": [1, 1], "corrupted": [1, 1]})", task),
             Contains("line 2: 'corrupted' is given here but missing on line 1"));
  CHECK_THAT(refusal(R"({"tokens": [0, 1], "targets": [1, 1], "corrupted": [1]})", task),
             Contains("'corrupted' holds 1 tokens and 'tokens' 2"));
  CHECK_THAT(refusal(R"({"tokens": [0, 1], "targets": [null, -100]})", task), Contains("no target is scored"));

  // A pointer readout's target is a key position of the sequence.
  const nn::TransformerConfig pointer{.vocab_size = 5, .max_len = 8, .readout = nn::Readout::pointer, .layers = 1,
                                      .d_model = 8, .heads = 1};
  const tasks::VocabularyTask pointer_task("run", pointer);
  CHECK_THAT(refusal(R"({"tokens": [0, 1, 2], "targets": [0, 3, 1]})", pointer_task),
             Contains("'targets'[1] is 3, not a key position 0-2"));
  CHECK(refusal(R"({"tokens": [0, 1, 2], "targets": [0, 2, 1]})", pointer_task).empty());
}

TEST_CASE("a data file of held-out sequences scores and ablates as the sequences drawn from their seed") {
  // Brackets: padded rows of several lengths in a batch, read back as rows of one length.
  Generator init(2);
  TrainOptions o = default_options("brackets");
  o.model.dtype = DType::float64;
  const nn::Transformer brackets(o.model, init);
  const BracketsTask bt;
  std::vector<Batch> drawn;
  Generator gen = held_out_generator(9);
  for (int i = 0; i < 3; ++i) drawn.push_back(bt.sample(16, gen));
  const std::string dir = scratch("dataset_held_out");
  write_dataset(dir + "/brackets.jsonl", drawn);
  const Dataset read = read_dataset(dir + "/brackets.jsonl", bt, o.model.max_len);
  CHECK(read.sequences() == 48);
  const Metrics from_seed = evaluate(brackets, bt, 3, 16, 9), from_file = evaluate(brackets, bt, read);
  CHECK(from_file.accuracy == from_seed.accuracy);
  CHECK(from_file.exact_match == from_seed.exact_match);
  CHECK(from_file.scored == from_seed.scored);
  CHECK(from_seed.accuracy > 0);  // an untrained model still gets some right, and some wrong
  CHECK(from_seed.accuracy < 1);

  // Induction with its corruption: the same ablation, patching included.
  nn::TransformerConfig c = default_options("induction").model;
  c.heads = 2;
  c.dtype = DType::float64;
  Generator init2(4);
  nn::Transformer model(c, init2);
  const InductionTask task;
  const std::optional<Corruption>& corruption = task_spec("induction").corruption;
  REQUIRE(corruption);
  const Ablation seeded = ablate(model, task, corruption, 2, 8, 5);
  std::vector<Batch> batches;
  std::vector<IndexArray> corrupted;
  Generator sequences = held_out_generator(5), corrupt_gen(held_out_generator(5).next_u64());
  for (int i = 0; i < 2; ++i) {
    batches.push_back(task.sample(8, sequences));
    corrupted.push_back(corruption->make(task, batches.back(), corrupt_gen));
  }
  write_dataset(dir + "/induction.jsonl", batches, corrupted);
  const Ablation filed = ablate(model, task, read_dataset(dir + "/induction.jsonl", task, c.max_len));
  CHECK(filed.data == dir + "/induction.jsonl");
  CHECK(filed.sequences == seeded.sequences);
  REQUIRE(filed.corrupted);
  CHECK(filed.corrupted->accuracy == seeded.corrupted->accuracy);
  CHECK(filed.corrupted->loss == Approx(seeded.corrupted->loss).epsilon(1e-12));
  REQUIRE(filed.heads.size() == seeded.heads.size());
  for (std::size_t i = 0; i < filed.heads.size(); ++i) {
    const HeadAblation &f = filed.heads[i], &s = seeded.heads[i];
    CHECK(f.zero.accuracy == s.zero.accuracy);
    CHECK(f.mean.loss == Approx(s.mean.loss).epsilon(1e-12));
    REQUIRE(f.denoised);
    CHECK(f.denoised->loss == Approx(s.denoised->loss).epsilon(1e-12));
    CHECK(f.noised->accuracy == s.noised->accuracy);
  }
}
