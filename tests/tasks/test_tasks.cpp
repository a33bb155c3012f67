#include "tests/helpers.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>

#include "qkv/tasks/builtin.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/memory.hpp"
#include "qkv/training/metrics_log.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/trainer.hpp"
#include "tests/training/short_run.hpp"

using namespace qkv;
using Catch::Matchers::Contains;
using qkv::test::invalid_argument_message;
using namespace qkv::test;

namespace {

std::vector<std::int64_t> row(const IndexArray& a, std::size_t b) {
  return std::vector<std::int64_t>(a.begin() + std::ptrdiff_t(b * a.shape()[1]), a.begin() + std::ptrdiff_t((b + 1) * a.shape()[1]));
}

}  // namespace

TEST_CASE("brackets: balanced Dyck-2 words of even length 4-24 and depth at most 6, after BOS") {
  const BracketsTask task;
  Generator gen(1);
  std::set<std::size_t> lengths;
  std::size_t deepest = 0;
  for (int batch = 0; batch < 20; ++batch) {
    const Batch b = task.sample(64, gen);
    for (std::size_t i = 0; i < 64; ++i) {
      const auto tokens = row(b.tokens, i);
      REQUIRE(tokens[0] == BracketsTask::bos);
      std::size_t len = 0, depth = 0;
      std::vector<std::int64_t> stack;
      for (std::size_t t = 1; t < tokens.size() && tokens[t] != BracketsTask::pad; ++t, ++len) {
        if (tokens[t] == BracketsTask::open_round || tokens[t] == BracketsTask::open_square) {
          stack.push_back(tokens[t]);
          depth = std::max(depth, stack.size());
          CHECK(b.targets(i, t) == ignore_target);
        } else {
          REQUIRE_FALSE(stack.empty());
          CHECK(tokens[t] == stack.back() + 1);
          stack.pop_back();
          // The target is the opener's position, and that position holds the matching opener.
          CHECK(tokens[std::size_t(b.targets(i, t))] == tokens[t] - 1);
        }
      }
      CHECK(stack.empty());
      CHECK(len % 2 == 0);
      CHECK(len >= 4);
      CHECK(len <= 24);
      lengths.insert(len);
      deepest = std::max(deepest, depth);
    }
  }
  CHECK(lengths.size() == 11);  // every even length from 4 to 24 appears
  CHECK(deepest == 6);
}

TEST_CASE("brackets: openers, closers and targets by hand") {
  const BracketsTask task;
  const auto tokens = task.encode("([])[]");
  CHECK(tokens == std::vector<std::int64_t>{0, 1, 3, 4, 2, 3, 4});
  CHECK(BracketsTask::matching_openers(tokens) == std::vector<std::int64_t>{-100, -100, -100, 2, 1, -100, 5});
  CHECK(task.decode(tokens) == "([])[]");
  CHECK_THAT(invalid_argument_message([&] { task.encode("(x)"); }), Contains("cannot read 'x'"));
  CHECK_THAT(invalid_argument_message([&] { BracketsTask::matching_openers(task.encode("(]")); }),
             Contains("the closer at position 2 has no matching opener"));
}

TEST_CASE("the same seed gives the same batches") {
  for (const std::string& name : task_names()) {
    INFO(name);
    const auto task = make_task(name);
    Generator a(9), b(9);
    const Batch x = task->sample(8, a), y = task->sample(8, b);
    CHECK(x.tokens == y.tokens);
    CHECK(x.targets == y.targets);
  }
}

TEST_CASE("rps: all three symbols, one payload per symbol, and the beater's payload as target") {
  const RpsTask task;
  Generator gen(2);
  for (int batch = 0; batch < 20; ++batch) {
    const Batch b = task.sample(32, gen);
    const std::size_t T = b.tokens.shape()[1];
    CHECK(T >= 6);
    CHECK(T <= 12);
    for (std::size_t i = 0; i < 32; ++i) {
      std::map<std::int64_t, std::int64_t> payload_of;  // symbol -> payload
      for (std::size_t t = 0; t < T; ++t) {
        const std::int64_t symbol = b.tokens(i, t) / RpsTask::n_payloads, payload = b.tokens(i, t) % RpsTask::n_payloads;
        if (payload_of.count(symbol)) CHECK(payload_of[symbol] == payload);
        payload_of[symbol] = payload;
      }
      REQUIRE(payload_of.size() == 3);
      CHECK(std::set<std::int64_t>{payload_of[0], payload_of[1], payload_of[2]}.size() == 3);
      for (std::size_t t = 0; t < T; ++t) {
        const std::int64_t symbol = b.tokens(i, t) / RpsTask::n_payloads;
        CHECK(b.targets(i, t) == payload_of[(symbol + 1) % 3]);  // R→P, P→S, S→R
      }
    }
  }
  CHECK(task.decode(task.encode("Ra Pb Sc")) == "Ra Pb Sc");
  CHECK(task.encode("Ra Pb Sc") == std::vector<std::int64_t>{0, 9, 18});
  CHECK_THAT(invalid_argument_message([&] { task.encode("Ra Qb"); }), Contains("cannot read 'Qb'"));
}

TEST_CASE("induction: a block of distinct tokens repeated, scored on the second copy") {
  const InductionTask task;
  Generator gen(3);
  const Batch b = task.sample(16, gen);
  const std::size_t T = b.tokens.shape()[1], n = T / 2;
  CHECK(T % 2 == 0);
  CHECK(n >= 8);
  CHECK(n <= 16);
  for (std::size_t i = 0; i < 16; ++i) {
    std::set<std::int64_t> block;
    for (std::size_t t = 0; t < n; ++t) {
      block.insert(b.tokens(i, t));
      CHECK(b.tokens(i, t + n) == b.tokens(i, t));
      CHECK(b.tokens(i, t) < 48);
    }
    CHECK(block.size() == n);
    for (std::size_t t = 0; t < T; ++t)
      CHECK(b.targets(i, t) == (t >= n && t + 1 < T ? b.tokens(i, t + 1) : ignore_target));
  }
  CHECK(task.encode("3 17 5") == std::vector<std::int64_t>{3, 17, 5});
  CHECK_THAT(invalid_argument_message([&] { task.encode("3 48"); }), Contains("cannot read '48'"));
}

TEST_CASE("score: accuracy over scored positions and exact match over sequences") {
  Batch b{IndexArray{{0, 0, 0}, {0, 0, 0}}, IndexArray{{-100, 1, 2}, {-100, -100, 4}}};
  const Metrics m = score(IndexArray{{9, 1, 0}, {9, 9, 4}}, b);
  CHECK(m.scored == 3);
  CHECK(m.sequences == 2);
  // A sequence with nothing scored counts in neither denominator.
  Batch c{IndexArray{{0, 0}, {0, 0}}, IndexArray{{1, -100}, {-100, -100}}};
  const Metrics n = score(IndexArray{{1, 0}, {5, 5}}, c);
  CHECK(n.sequences == 1);
  CHECK(n.exact_match == 1.0);
  CHECK(m.accuracy == Approx(2.0 / 3));
  CHECK(m.exact_match == Approx(0.5));
}

TEST_CASE("an unknown task is named, with the known ones") {
  CHECK(invalid_argument_message([] { make_task("sorting"); }) ==
        "task: unknown task 'sorting' (known: brackets, rps, induction, line, cycle, reverse, sort, translate, modadd)");
}

TEST_CASE("token names label every token of each task") {
  const BracketsTask brackets;
  CHECK(brackets.token_name(0) == "BOS");
  CHECK(brackets.token_name(4) == "]");
  CHECK(brackets.token_name(5) == "pad");
  const RpsTask rps;
  CHECK(rps.token_name(0) == "Ra");
  CHECK(rps.token_name(9) == "Pb");  // 8 · P + b
  CHECK(rps.token_name(23) == "Sh");
  const InductionTask induction;
  CHECK(induction.token_name(17) == "17");
}

TEST_CASE("every registered task is whole: its generator, defaults that pass the checks, a target and budgets") {
  // The tasks the docs describe are there, each name once, each in a file of its own: a new task
  // adds its file and its registry line, and no list here.
  const std::vector<std::string> names = task_names();
  for (const char* documented : {"brackets", "rps", "induction", "line", "cycle", "reverse", "sort", "translate"})
    CHECK(std::count(names.begin(), names.end(), documented) == 1);
  for (const std::string& name : names) {
    INFO(name);
    CHECK(std::count(names.begin(), names.end(), name) == 1);
    CHECK(std::filesystem::exists(std::string(QKV_SOURCE_DIR) + "/tasks/" + name + ".cpp"));
  }
  for (const TaskSpec& spec : task_registry()) {
    INFO(spec.name);
    const auto task = spec.make(spec.default_size);
    CHECK((spec.sizes.empty() && spec.max_size == 0) == (spec.default_size == 0));
    if (spec.max_size > 0) CHECK((spec.min_size <= spec.default_size && spec.default_size <= spec.max_size));
    for (std::size_t n : spec.sizes) CHECK_NOTHROW(check_options(default_options(spec.name, n)));
    CHECK(task->info().name == spec.name);
    const TrainOptions o = default_options(spec.name);
    CHECK_NOTHROW(check_options(o));
    CHECK(o.model.vocab_size == task->info().vocab_size);
    CHECK(o.model.readout == task->info().readout);
    CHECK(spec.target > 0.5);
    CHECK(spec.target <= 1.0);
    for (const LongerLengths& l : spec.longer) CHECK(l.make()->info().max_len > task->info().max_len);
    CHECK(token_names(*task).size() == task->info().vocab_size);
    // A seq2seq task trains an encoder-decoder, with the positions of its sources.
    CHECK((as_seq2seq(*task) != nullptr) == task->info().seq2seq.has_value());
    CHECK((o.encoder_layers > 0) == task->info().seq2seq.has_value());
    if (task->info().seq2seq) CHECK(o.max_source_len == task->info().seq2seq->max_source_len);
  }
  CHECK(default_options("rps").model.layers == 1);
  CHECK(default_options("brackets").lr == 1e-2);
  CHECK(task_spec("induction").target == 0.95);
}

TEST_CASE("a pointer task's targets on an input: brackets point each closer at its opener") {
  const auto task = make_task("brackets");
  CHECK(task->pointer_targets(task->encode("([])")) == std::vector<std::int64_t>{-100, -100, -100, 2, 1});
  CHECK_FALSE(task->pointer_targets(task->encode("(]")));
  CHECK_FALSE(make_task("rps")->pointer_targets({0, 9, 17}));
}

TEST_CASE("line and cycle: every value once, each pointing at the position of the next value") {
  Generator gen(3);
  const auto line = make_task("line", 5), cycle = make_task("cycle");
  CHECK(line->info().vocab_size == 5);
  CHECK(cycle->info().vocab_size == 5);  // cycle's default size
  CHECK_FALSE(line->info().causal);
  CHECK(line->info().readout == nn::Readout::pointer);
  // By hand: in "3 0 4 1 2", 0 → 1 at position 3, 1 → 2 at 4, 2 → 3 at 0, 3 → 4 at 2; 4 points
  // nowhere on a line and at 0 (position 1) on a cycle.
  CHECK(line->pointer_targets(line->encode("3 0 4 1 2")) == std::vector<std::int64_t>{2, 3, -100, 4, 0});
  CHECK(cycle->pointer_targets(cycle->encode("3 0 4 1 2")) == std::vector<std::int64_t>{2, 3, 1, 4, 0});
  CHECK_FALSE(line->pointer_targets({0, 0, 1, 2, 3}));  // a value twice
  for (const auto* task : {line.get(), cycle.get()}) {
    const Batch b = task->sample(64, gen);
    for (std::size_t i = 0; i < 64; ++i) {
      const auto tokens = row(b.tokens, i);
      CHECK(std::set<std::int64_t>(tokens.begin(), tokens.end()).size() == 5);
      CHECK(row(b.targets, i) == *task->pointer_targets(tokens));
    }
  }
  CHECK(invalid_argument_message([] { make_task("cycle", 4); }) == "cycle: n must be one of 3, 5, 7, not 4");
  CHECK(invalid_argument_message([] { make_task("rps", 4); }) == "rps: the rps task takes no size (n), got 4");
  CHECK_THAT(invalid_argument_message([&] { line->encode("3 x"); }), Contains("cannot read 'x'"));
}

TEST_CASE("the relation probe: an untied head ranks a cycle, a symmetric one cannot put every successor on top") {
  std::ostringstream quiet;
  const auto trained = [&](const std::string& qk) {
    TrainOptions o = qkv::test::short_run("cycle", "probe_" + qk, 600);
    o.model.qk = *nn::from_name(nn::all_qk, qk);
    train(o, quiet, false);
    return load_model(o.out);
  };
  const auto untied = trained("untied");
  const Probe u = task_spec("cycle").probe(*untied, 1);
  const auto value = [](const Probe& p, const std::string& key) {
    for (const auto& [k, v] : p.values)
      if (k == key) return v;
    FAIL("no " << key);
    return 0.0;
  };
  CHECK(value(u, "top1") > 0.99);
  CHECK(value(u, "pairwise") > 0.99);
  CHECK(value(u, "alignment") > 0.3);  // the table's antisymmetric part points along the cycle
  CHECK(u.violations.empty());
  for (const std::string qk : {"tied", "symmetric"}) {
    INFO(qk);
    const Probe s = task_spec("cycle").probe(*trained(qk), 1);
    CHECK(value(s, "top1_max") <= 4.0 / 5);  // the bound: at most n − 1 of n
    CHECK(std::abs(value(s, "alignment")) < 1e-6);  // a symmetric table has no antisymmetric part
    CHECK(s.violations.empty());
  }
}

namespace {

// Each row of a seq2seq batch holds its example: the source then padding, the decoder's input
// (start, the output, then end) and its targets (the output, end, then nothing scored).
void check_batch(const Seq2SeqTask& task, const Batch& b, const std::vector<Seq2SeqExample>& examples) {
  const Seq2SeqInfo& s = task.sides();
  REQUIRE(b.source.shape()[0] == examples.size());
  for (std::size_t i = 0; i < examples.size(); ++i) {
    const Seq2SeqExample& e = examples[i];
    for (std::size_t t = 0; t < b.source.shape()[1]; ++t)
      CHECK(b.source(i, t) == (t < e.source.size() ? e.source[t] : s.source_pad));
    for (std::size_t t = 0; t < b.tokens.shape()[1]; ++t) {
      CHECK(b.tokens(i, t) == (t == 0 ? s.start : t <= e.output.size() ? e.output[t - 1] : s.end));
      CHECK(b.targets(i, t) == (t < e.output.size() ? e.output[t] : t == e.output.size() ? s.end : ignore_target));
    }
  }
}

std::vector<std::vector<std::size_t>> positions(std::initializer_list<std::size_t> each) {
  std::vector<std::vector<std::size_t>> out;
  for (std::size_t p : each) out.push_back({p});
  return out;
}

}  // namespace

TEST_CASE("reverse, sort and translate: outputs and alignments by hand") {
  const auto reverse = make_task("reverse"), sort = make_task("sort"), translate = make_task("translate");
  const Seq2SeqTask& r = *as_seq2seq(*reverse);
  const Seq2SeqTask& s = *as_seq2seq(*sort);
  const Seq2SeqTask& t = *as_seq2seq(*translate);
  CHECK_FALSE(as_seq2seq(*make_task("brackets")));

  auto e = r.example(r.encode("3 1 4 1"));
  REQUIRE(e);
  CHECK(e->output == std::vector<std::int64_t>{1, 4, 1, 3});
  CHECK(e->alignment == positions({3, 2, 1, 0}));
  CHECK(r.decode({1, 4, 1, 3, 11, 7}) == "1 4 1 3");  // up to the end token
  CHECK(r.token_name(10) == "BOS");
  CHECK(r.source_token_name(10) == "pad");
  CHECK_FALSE(r.example(r.encode("3 1")));  // shorter than the task's sources

  e = s.example(s.encode("31 4 17 0"));
  REQUIRE(e);
  CHECK(e->output == std::vector<std::int64_t>{0, 4, 17, 31});
  CHECK(e->alignment == positions({3, 1, 2, 0}));  // where each value is: content, not position
  CHECK_FALSE(s.example(s.encode("5 3 5")));  // sort's values are distinct
  CHECK_THAT(invalid_argument_message([&] { s.encode("3 32"); }), Contains("cannot read '32'"));

  e = t.example(t.encode("big cat chases small mouse"));
  REQUIRE(e);
  CHECK(t.decode(e->output) == "ookii neko chiisai nezumi ou");
  CHECK(e->alignment == positions({0, 1, 3, 4, 2}));  // the verb goes last
  e = t.example(t.encode("dog sees old bear"));
  REQUIRE(e);
  CHECK(t.decode(e->output) == "inu furui kuma miru");
  CHECK(e->alignment == positions({0, 2, 3, 1}));
  CHECK_FALSE(t.example(t.encode("cat mouse chases")));
  CHECK_FALSE(t.example(t.encode("big chases mouse")));
  CHECK_FALSE(t.example(t.encode("cat chases mouse mouse")));
  CHECK_THAT(invalid_argument_message([&] { t.encode("cat chases unicorn"); }), Contains("cannot read 'unicorn'"));

  // A batch of given examples, padded.
  const std::vector<Seq2SeqExample> examples = {*t.example(t.encode("cat eats fish")),
                                                *t.example(t.encode("young lion helps red bird"))};
  const Batch b = t.batch(examples);
  CHECK(b.source.shape() == std::vector<std::size_t>{2, 5});
  CHECK(b.tokens.shape() == std::vector<std::size_t>{2, 6});
  check_batch(t, b, examples);
}

TEST_CASE("seq2seq batches hold the examples the task draws, whatever the seed") {
  for (const char* name : {"reverse", "sort", "translate"}) {
    INFO(name);
    const auto task = make_task(name);
    const Seq2SeqTask& s = *as_seq2seq(*task);
    Generator a(5), b(5);
    std::vector<Seq2SeqExample> drawn;
    for (int i = 0; i < 64; ++i) drawn.push_back(s.draw(a));
    const Batch batch = s.sample(64, b);
    check_batch(s, batch, drawn);
    std::set<std::size_t> lengths;
    for (const Seq2SeqExample& e : drawn) {
      lengths.insert(e.source.size());
      const auto again = s.example(e.source);  // each drawn source is one of the task's
      REQUIRE(again);
      CHECK(again->output == e.output);
      // Each output token comes from the source position it is aligned with.
      REQUIRE(e.alignment.size() == e.output.size());
      for (std::size_t i = 0; i < e.output.size(); ++i) CHECK(e.source[e.alignment[i].at(0)] == e.output[i]);
    }
    CHECK(lengths.size() > 2);
  }
}

TEST_CASE("the registry line docs/cli.md shows to copy is the registry's, with the worked example's task") {
  std::vector<std::string> want = task_names();
  want.push_back("successor");
  for (const char* page : {"/docs/cli.md"}) {
    INFO(page);
    std::ifstream in(std::string(QKV_SOURCE_DIR) + page);
    REQUIRE(in.good());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t at = text.find("#define QKV_TASKS(TASK)");
    REQUIRE(at != std::string::npos);
    const std::string line = text.substr(at, text.find("\n```", at) - at);
    std::vector<std::string> shown;
    const std::regex task(R"(TASK\((\w+)\))");
    for (auto it = std::sregex_iterator(line.begin(), line.end(), task); it != std::sregex_iterator(); ++it)
      if ((*it)[1] != "TASK") shown.push_back((*it)[1]);
    CHECK(shown == want);
  }
}
