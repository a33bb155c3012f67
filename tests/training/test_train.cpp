#include "tests/helpers.hpp"

#include <numeric>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/memory.hpp"
#include "qkv/training/metrics_log.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"
#include "qkv/training/trainer.hpp"
#include "qkv/training/checkpoint.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/safetensors.hpp"
#include "tests/training/short_run.hpp"

#include <csignal>

#include <sys/wait.h>
#include <unistd.h>

using namespace qkv;
using qkv::test::check_same_weights;
using qkv::test::short_run;
using namespace qkv::test;


TEST_CASE("the same seed trains bit-identical weights, and another seed does not") {
  for (const std::string& task : task_names()) {
    INFO(task);
    std::ostringstream quiet;
    const std::size_t n = task == "modadd" ? 23 : 0;  // p = 23 rather than 113: 158 training pairs, not 3,830
    TrainOptions a = short_run(task, "a", 30, 500, n), b = short_run(task, "b", 30, 500, n), c = short_run(task, "c", 30, 500, n);
    c.seed = 1;
    train(a, quiet, false);
    train(b, quiet, false);
    train(c, quiet, false);
    const auto wa = nn::load_safetensors(a.out + "/model.safetensors").tensors;
    const auto wb = nn::load_safetensors(b.out + "/model.safetensors").tensors;
    const auto wc = nn::load_safetensors(c.out + "/model.safetensors").tensors;
    REQUIRE(wa.size() == wb.size());
    bool all_same_c = true;
    for (std::size_t i = 0; i < wa.size(); ++i) {
      CHECK(wa[i].first == wb[i].first);
      CHECK(wa[i].second.value<float>() == wb[i].second.value<float>());
      all_same_c = all_same_c && wa[i].second.value<float>() == wc[i].second.value<float>();
    }
    CHECK_FALSE(all_same_c);
  }
}

TEST_CASE("training writes its config, one metrics line per log step, and the model") {
  std::ostringstream progress;
  const TrainOptions o = short_run("brackets", "files");
  const TrainResult r = train(o, progress, false);
  CHECK(r.steps == 30);
  CHECK(std::filesystem::exists(o.out + "/config.json"));
  std::ifstream metrics(o.out + "/metrics.jsonl");
  std::size_t lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  CHECK(lines == 3);
  CHECK(progress.str().find("step    30/30") != std::string::npos);
  const auto state = nn::load_safetensors(o.out + "/model.safetensors");
  CHECK(state.tensors.front().first == "tok.weight");
  CHECK(state.metadata.at("step") == "30");
  const auto optimizer = nn::load_safetensors(o.out + "/optimizer.safetensors");
  CHECK(optimizer.metadata.at("step") == "30");
  CHECK(optimizer.tensors.front().first == "lr");
  CHECK(r.eval.scored > 0);
  const TrainOptions back = read_config(o.out);
  CHECK(back.task == "brackets");
  CHECK(back.steps == 30);
  CHECK(back.lr == o.lr);
  CHECK(back.model.readout == nn::Readout::pointer);
}

TEST_CASE("a one-step run trains and evaluates") {
  std::ostringstream quiet;
  const TrainOptions o = short_run("rps", "one", 1);
  CHECK(train(o, quiet, false).steps == 1);
}

TEST_CASE("train's observer sees the init and every step once, in order, and changes nothing") {
  std::ostringstream quiet;
  TrainOptions plain = short_run("brackets", "unobserved", 12);
  train(plain, quiet, false);
  TrainOptions watched = short_run("brackets", "observed", 12);
  std::vector<std::size_t> seen;
  std::vector<double> accuracies;
  const auto task = make_task("brackets");
  const TrainResult r = train(watched, quiet, false, [&](std::size_t step, const nn::Transformer& model) {
    seen.push_back(step);
    accuracies.push_back(evaluate(model, *task, 2, watched.batch, watched.seed).accuracy);
  });
  std::vector<std::size_t> expected(13);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(seen == expected);
  CHECK(accuracies.back() == r.eval.accuracy);  // the model the run ends with
  CHECK(accuracies.front() != accuracies.back());
  check_same_weights(plain.out, watched.out);
  // A resumed run is seen from the step after its checkpoint: no step 0.
  TrainOptions first = short_run("brackets", "observed_split", 12, 5);
  first.stop_after = 5;
  train(first, quiet, false);
  TrainOptions rest = read_config(first.out);
  rest.resume = true;
  seen.clear();
  train(rest, quiet, false, [&](std::size_t step, const nn::Transformer&) { seen.push_back(step); });
  CHECK(seen == std::vector<std::size_t>{6, 7, 8, 9, 10, 11, 12});
  for (const auto& o : {plain, watched, first}) std::filesystem::remove_all(o.out);
}

TEST_CASE("train's seq2seq observer sees the encoder-decoder, and each kind of observer is refused for the other model") {
  std::ostringstream quiet;
  TrainOptions plain = short_run("reverse", "seq2seq_unobserved", 8), watched = short_run("reverse", "seq2seq_observed", 8);
  train(plain, quiet, false);
  std::vector<std::size_t> seen;
  train(watched, quiet, false, {}, [&](std::size_t step, const nn::EncoderDecoder&) { seen.push_back(step); });
  CHECK(seen == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  check_same_weights(plain.out, watched.out);
  const auto decoder_only = [](std::size_t, const nn::Transformer&) {};
  const auto seq2seq = [](std::size_t, const nn::EncoderDecoder&) {};
  TrainOptions wrong = short_run("reverse", "seq2seq_wrong", 8);
  CHECK_THROWS_WITH(train(wrong, quiet, false, decoder_only), Catch::Contains("its observer is a Seq2SeqObserver"));
  wrong = short_run("brackets", "decoder_wrong", 8);
  CHECK_THROWS_WITH(train(wrong, quiet, false, {}, seq2seq), Catch::Contains("its observer is a TrainObserver"));
  CHECK(!std::filesystem::exists(wrong.out));  // refused before the folder was touched
  for (const auto& o : {plain, watched}) std::filesystem::remove_all(o.out);
}

TEST_CASE("a resumed run ends with weights bit-identical to an uninterrupted run") {
  std::ostringstream quiet;
  TrainOptions whole = short_run("brackets", "whole", 40, 10);
  train(whole, quiet, false);

  TrainOptions first = short_run("brackets", "split", 40, 10);
  first.stop_after = 25;  // not at a checkpoint boundary
  CHECK(train(first, quiet, false).steps == 25);
  TrainOptions rest = read_config(first.out);
  rest.resume = true;
  CHECK(train(rest, quiet, false).steps == 40);

  check_same_weights(whole.out, rest.out);
}

TEST_CASE("a run stopped by SIGINT or SIGTERM commits a checkpoint of its last step and resumes from it to the same weights") {
  std::ostringstream notes;
  TrainOptions whole = short_run("brackets", "signal_whole", 40);
  train(whole, notes, false);
  for (const int signal : {SIGINT, SIGTERM}) {
    INFO(signal);
    TrainOptions first = short_run("brackets", "signal", 40);  // checkpoints only at the end
    stop_on_signals();
    // Twice at once, as timeout(1) sends it (to the program and to its process group): one request.
    const auto send = [&](std::size_t step, const nn::Transformer&) {
      if (step == 13) {
        std::raise(signal);
        std::raise(signal);
      }
    };
    try {
      train(first, notes, false, send);
      FAIL("the run was not stopped");
    } catch (const Interrupted& e) {
      CHECK(e.signal == signal);
      CHECK_THAT(e.what(), Catch::Matchers::Contains("interrupted at step 13 of 40; the checkpoint of step 13 is in " + first.out));
    }
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    CHECK(nn::committed_checkpoint(first.out) == first.out + "/checkpoint-00000013");
    TrainOptions rest = read_config(first.out);
    rest.resume = true;
    notes.str("");
    CHECK(train(rest, notes, false).steps == 40);
    CHECK_THAT(notes.str(), Catch::Matchers::Contains("resuming " + first.out + " from step 13 of 40"));
    check_same_weights(whole.out, rest.out);
    std::filesystem::remove_all(first.out);
  }
  std::filesystem::remove_all(whole.out);
}

TEST_CASE("a second SIGTERM a second after the first ends the program at once") {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    stop_on_signals();
    std::raise(SIGTERM);
    std::raise(SIGTERM);  // the same request
    if (pending_stop() != SIGTERM) ::_exit(1);
    ::usleep(1'100'000);
    std::raise(SIGTERM);  // a second one
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
}

TEST_CASE("a resume with more steps extends the run, equal to a longer run where the schedule allows it, and says where not") {
  std::ostringstream notes;
  // A constant learning rate after the warmup: the steps taken had the longer run's rates.
  TrainOptions whole = short_run("brackets", "extend_whole", 80, 20);
  whole.min_lr_ratio = 1;
  train(whole, notes, false);
  TrainOptions first = short_run("brackets", "extend", 40, 20);
  first.min_lr_ratio = 1;
  train(first, notes, false);
  // The run in `dir` resumed to `steps`, with what it said.
  const auto extended = [&](const std::string& dir, std::size_t steps) {
    TrainOptions more = read_config(dir);
    more.resume = true;
    more.steps = steps;
    notes.str("");
    CHECK(train(more, notes, false).steps == steps);
    return notes.str();
  };
  CHECK_THAT(extended(first.out, 80), Catch::Matchers::Contains("extending " + first.out + " from 40 to 80 steps") &&
                                          Catch::Matchers::Contains("the run equals one trained to 80 steps from the start"));
  check_same_weights(whole.out, first.out);
  CHECK(read_config(first.out).steps == 80);

  // A cosine to the end: the steps taken had higher rates than a longer run's, and it says so.
  TrainOptions cosine = short_run("brackets", "extend_cosine", 40, 20);
  train(cosine, notes, false);
  CHECK_THAT(extended(cosine.out, 60), Catch::Matchers::Contains("Steps 6 to 39 followed the 40-step one") &&
                                           Catch::Matchers::Contains("the run differs from one trained to 60 steps from the start"));

  // Fewer steps, or any other option changed, is refused before anything is written.
  TrainOptions longer = read_config(cosine.out);
  longer.resume = true;
  longer.steps = 50;
  CHECK_THAT(qkv::test::error_message<UsageError>([&] { train(longer, notes, false); }),
             Catch::Matchers::Contains("--steps: is 50, fewer than the 60 of the run in " + cosine.out));
  longer.steps = 60;
  longer.lr = 1e-4;
  CHECK_THAT(qkv::test::error_message<UsageError>([&] { train(longer, notes, false); }),
             Catch::Matchers::Contains("a resume may change only --steps"));
  CHECK(read_config(cosine.out).steps == 60);
  for (const auto& o : {whole, first, cosine}) std::filesystem::remove_all(o.out);
}

TEST_CASE("a resume falls back to the newest checkpoint that loads, naming what it passed over") {
  std::ostringstream notes;
  const TrainOptions o = short_run("rps", "broken", 4, 2);
  train(o, notes, false);
  const std::string newest = *nn::committed_checkpoint(o.out);
  CHECK(newest == o.out + "/checkpoint-00000004");
  // An optimizer file from another step, as a save that died between the two files once left.
  const auto opt = nn::load_safetensors(newest + "/optimizer.safetensors");
  auto meta = opt.metadata;
  meta["step"] = std::to_string(2);
  nn::save_safetensors(newest + "/optimizer.safetensors", opt.tensors, meta);
  TrainOptions again = read_config(o.out);
  again.resume = true;
  notes.str("");
  CHECK(train(again, notes, false).steps == 4);
  CHECK_THAT(notes.str(), Catch::Matchers::Contains("resuming from " + o.out + "/checkpoint-00000002 (step 2)") &&
                              Catch::Matchers::Contains("the model is from step 4 but the optimizer from step 2"));
  CHECK(*nn::committed_checkpoint(o.out) == newest);  // written anew
  // With every checkpoint broken, the resume fails naming each.
  for (const auto& [step, folder] : nn::checkpoint_folders(o.out)) std::filesystem::remove(folder + "/model.safetensors");
  CHECK_THROWS_WITH(train(again, notes, false),
                    Catch::Matchers::Contains("no checkpoint loads") &&
                        Catch::Matchers::Contains("checkpoint-00000004/model.safetensors: cannot open") &&
                        Catch::Matchers::Contains("checkpoint-00000002/model.safetensors: cannot open"));
  CHECK_THROWS_WITH(read_config("/nonexistent/run"), Catch::Matchers::Contains("/nonexistent/run/config.json: cannot open"));
}

TEST_CASE("a run folder's model loads back and scores as it did after training") {
  std::ostringstream quiet;
  const TrainOptions o = short_run("induction", "load");
  const TrainResult r = train(o, quiet, false);
  const auto model = load_model(o.out);
  const Metrics again = evaluate(*model, *make_task("induction"), o.eval_batches, o.batch, o.seed);
  CHECK(again.accuracy == r.eval.accuracy);
  CHECK(again.scored == r.eval.scored);
}

TEST_CASE("a config.json that does not match the tensors is named") {
  std::ostringstream quiet;
  const TrainOptions o = short_run("rps", "mismatch");
  train(o, quiet, false);
  std::ifstream in(o.out + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("\"d_model\": 32");
  REQUIRE(at != std::string::npos);
  text.replace(at, 13, "\"d_model\": 16");
  nn::write_atomically(o.out + "/config.json", text);
  CHECK_THROWS_WITH(load_model(o.out), Catch::Matchers::Contains("model.safetensors: does not fit") &&
                                           Catch::Matchers::Contains("mis-shaped tok.weight (given (24,32), expected (24,16))"));
}

TEST_CASE("a checkpoint with missing or unexpected tensors is named") {
  std::ostringstream quiet;
  const TrainOptions o = short_run("rps", "names", 2);
  train(o, quiet, false);
  const std::string file = *nn::committed_checkpoint(o.out) + "/model.safetensors";
  auto model = nn::load_safetensors(file);
  const std::string dropped = model.tensors.back().first;
  model.tensors.pop_back();
  model.tensors.emplace_back("extra.weight", zeros({2}));
  nn::save_safetensors(file, model.tensors, model.metadata);
  TrainOptions again = read_config(o.out);
  again.resume = true;
  CHECK_THROWS_WITH(train(again, quiet, false), Catch::Matchers::Contains(file) &&
                                                    Catch::Matchers::Contains("missing " + dropped) &&
                                                    Catch::Matchers::Contains("unexpected extra.weight"));
  CHECK_THROWS_WITH(load_model(o.out), Catch::Matchers::Contains("does not fit"));
}

TEST_CASE("frozen embeddings keep the embeddings and LayerNorms at init, and train the rest") {
  std::ostringstream quiet;
  TrainOptions o = short_run("rps", "frozen", 10);
  o.model.frozen_embeddings = true;
  train(o, quiet, false);
  Generator gen(o.seed);
  const nn::Transformer init(o.model, gen);
  const auto trained = load_model(o.out);
  CHECK(read_config(o.out).model.frozen_embeddings);
  const StateDict after = trained->named_parameters();
  const StateDict before = init.named_parameters();
  REQUIRE(before.size() == after.size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    const std::string& name = before[i].first;
    INFO(name);
    REQUIRE(after[i].first == name);
    const bool same = before[i].second.value<float>() == after[i].second.value<float>();
    const bool frozen = name.rfind("tok.", 0) == 0 || name.rfind("pos.", 0) == 0 || name.find("ln") != std::string::npos;
    CHECK(same == frozen);
  }
}

TEST_CASE("steps to target: the first check at or above the target, none when never reached") {
  std::ostringstream quiet;
  TrainOptions o = short_run("rps", "target", 20);
  o.target_every = 5;
  o.target = 0;  // reached at the first check
  CHECK(train(o, quiet, false).steps_to_target == std::optional<std::size_t>(5));
  o.target = 1.5;  // never
  o.force = true;
  CHECK_FALSE(train(o, quiet, false).steps_to_target);
  CHECK(task_spec("induction").target == 0.95);
  CHECK(task_spec("brackets").target == 0.99);
}

TEST_CASE("a failed write to metrics.jsonl fails the run, naming the file") {
  MetricsLog log("/dev/full", false);
  CHECK_THROWS_WITH(log.write(R"({"step": 1})"), Catch::Matchers::Contains("/dev/full: writing failed"));
}

TEST_CASE("truncate_metrics keeps the lines up to a step, lines it did not write, and drops a cut-off line") {
  const std::string file = qkv::test::scratch("metrics") + "/metrics.jsonl";
  nn::write_atomically(file, "{\"step\":100}\n{\"step\":200}\nnot json\n{\"step\":300}\n{\"step\":4");
  truncate_metrics(file, 200);
  CHECK(nn::read_file(file, 1000) == "{\"step\":100}\n{\"step\":200}\nnot json\n");
  truncate_metrics(file + ".missing", 10);  // nothing to cut
  CHECK_FALSE(std::filesystem::exists(file + ".missing"));
}

TEST_CASE("train refuses a folder that holds a run, or files that are not one, and touches nothing") {
  std::ostringstream quiet;
  TrainOptions o = short_run("rps", "refuse", 2);
  train(o, quiet, false);
  const std::string config = nn::read_file(o.out + "/config.json", 1 << 20);
  CHECK_THROWS_AS(train(o, quiet, false), UsageError);
  o.lr = 100;
  o.force = true;
  CHECK_THROWS_AS(train(o, quiet, false), OptionError);
  CHECK(nn::read_file(o.out + "/config.json", 1 << 20) == config);
  // A folder of the user's own: refused as it is, with no lock left in it, and its .tmp kept.
  TrainOptions other = short_run("rps", "refuse_other", 2);
  std::filesystem::create_directories(other.out + "/build.tmp");
  nn::write_atomically(other.out + "/notes.txt", "mine");
  CHECK_THROWS_WITH(train(other, quiet, false), Catch::Matchers::Contains("and no qkv run"));
  CHECK(std::filesystem::exists(other.out + "/build.tmp"));
  CHECK_FALSE(std::filesystem::exists(other.out + "/run.lock"));
}

TEST_CASE("check_options names the field at fault, and estimate_memory grows with the batch and the model") {
  TrainOptions o = default_options("brackets");
  CHECK_NOTHROW(check_options(o));
  const auto field_of = [](const TrainOptions& bad) -> std::string {
    try {
      check_options(bad);
    } catch (const OptionError& e) {
      return e.field;
    }
    return "";
  };
  TrainOptions bad = o;
  bad.model.heads = 3;
  CHECK(field_of(bad) == "model.heads");
  bad = o;
  bad.model.max_len = 3;  // shorter than the task's sequences
  CHECK(field_of(bad) == "model.max_len");
  bad = o;
  bad.model.qk = nn::QK::tied;
  bad.model.kv_heads = 1;  // tied q and k need a kv head per head
  CHECK(field_of(bad) == "model.kv_heads");
  bad = o;
  bad.lr = std::numeric_limits<double>::infinity();
  CHECK(field_of(bad) == "lr");
  bad = o;
  bad.batch = 1'000'000;
  bad.model.d_model = 4096;
  CHECK(field_of(bad) == "");  // the sizes are each in range: memory is checked apart
  try {
    check_memory(bad, true);
    FAIL("check_memory passed a step of terabytes");
  } catch (const OptionError& e) {
    CHECK(e.field == "batch");
    CHECK_THAT(e.what(), Catch::Matchers::Contains("for a training step (batch 1000000 of 25 tokens"));
  }
  // modadd's model with an MLP a billion wide: its width, not the full batch it always has.
  TrainOptions wide = default_options("modadd");
  wide.model.d_mlp = 1'000'000'000;
  try {
    check_memory(wide, true);
    FAIL("check_memory passed an MLP of a billion units");
  } catch (const OptionError& e) {
    CHECK(e.field == "model.d_mlp");
  }
  CHECK_NOTHROW(check_memory(o, true));
  const MemoryEstimate small = estimate_memory(o);
  o.batch *= 2;
  CHECK(estimate_memory(o).step == Approx(2 * small.step).epsilon(0.01));
  CHECK(estimate_memory(o).model == small.model);
  // Each parameter takes 16 bytes (value, gradient, two Adam moments): the estimate counts them all,
  // and not many more.
  Generator gen(0);
  const nn::Transformer model(o.model, gen);
  double params = 0;
  for (const Tensor& p : model.parameters()) params += double(p.numel());
  CHECK(small.model >= 16 * params);
  CHECK(small.model <= 2 * 16 * params);
}

TEST_CASE("with the MLP, each block has a LayerNorm and two layers after its attention, and they train") {
  std::ostringstream quiet;
  TrainOptions o = short_run("induction", "mlp", 20);
  o.model.mlp = true;
  const TrainResult r = train(o, quiet, false);
  REQUIRE(r.loss);
  CHECK(std::isfinite(*r.loss));
  CHECK(read_config(o.out).model.mlp);
  Generator gen(o.seed);
  const nn::Transformer init(o.model, gen);
  const auto trained = load_model(o.out);
  const StateDict before = init.named_parameters(), after = trained->named_parameters();
  std::vector<std::string> mlp_names;
  for (std::size_t i = 0; i < before.size(); ++i)
    if (before[i].first.find(".fc.") != std::string::npos || before[i].first.find(".proj.") != std::string::npos ||
        before[i].first.find(".ln2.") != std::string::npos) {
      mlp_names.push_back(before[i].first);
      INFO(before[i].first);
      CHECK_FALSE(bool(before[i].second.value<float>() == after[i].second.value<float>()));
    }
  // Per layer: ln2 (weight, bias), fc (weight, bias), proj (weight, bias); the fc weight is (4·d_model, d_model).
  CHECK(mlp_names.size() == 6 * o.model.layers);
  CHECK(trained->blocks[0]->mlp->fc.weight.shape() == Shape{4 * o.model.d_model, o.model.d_model});
  // The memory estimate counts the MLP's weights.
  TrainOptions without = o;
  without.model.mlp = false;
  CHECK(estimate_memory(o).model > estimate_memory(without).model + 16.0 * 8 * double(o.model.d_model * o.model.d_model));
}

TEST_CASE("a seq2seq run trains an encoder-decoder that resumes bit-identically and loads back") {
  std::ostringstream quiet;
  TrainOptions whole = short_run("reverse", "s2s_whole", 40, 10);
  const TrainResult r = train(whole, quiet, false);
  CHECK(r.eval.scored > 0);
  // config.json's model is the library's EncoderDecoderConfig, read back into the options.
  const nn::EncoderDecoderConfig c = nn::load_encoder_decoder_config(whole.out);
  CHECK(c.encoder_layers == 2);
  CHECK(c.decoder_layers == 1);
  CHECK(c.src_vocab == 11);
  CHECK(c.tgt_vocab == 12);
  CHECK(c.max_src_len == 12);
  CHECK(c.max_tgt_len == 13);
  const TrainOptions back = read_config(whole.out);
  TrainOptions recorded = whole;
  recorded.blas = back.blas;  // the kernels train ran on
  CHECK(config_text(back) == config_text(recorded));
  CHECK(back.encoder_layers == 2);
  CHECK(back.max_source_len == 12);
  // The loaded model scores as the trained one did; the decoder-only loader names the run.
  const auto model = load_encoder_decoder(whole.out);
  const Metrics again = evaluate(*model, *make_task("reverse"), whole.eval_batches, whole.batch, whole.seed);
  CHECK(again.accuracy == r.eval.accuracy);
  CHECK(again.exact_match == r.eval.exact_match);
  CHECK_THROWS_WITH(load_model(whole.out), Catch::Matchers::Contains("a reverse run, whose model is an encoder-decoder"));
  CHECK_THROWS_WITH(load_encoder_decoder(short_run("rps", "s2s_other").out),
                    Catch::Matchers::Contains("config.json: cannot open"));

  TrainOptions first = short_run("reverse", "s2s_split", 40, 10);
  first.stop_after = 25;
  CHECK(train(first, quiet, false).steps == 25);
  TrainOptions rest = read_config(first.out);
  rest.resume = true;
  CHECK(train(rest, quiet, false).steps == 40);
  check_same_weights(whole.out, rest.out);
  for (const auto& o : {whole, first}) std::filesystem::remove_all(o.out);
}

TEST_CASE("a seq2seq task refuses what its encoder-decoder has not, and other tasks refuse an encoder") {
  const auto field = [](TrainOptions o) {
    try {
      check_options(o);
    } catch (const OptionError& e) {
      return e.field + ": " + e.what();
    }
    return std::string("accepted");
  };
  const TrainOptions s = default_options("sort");
  CHECK(field(s) == "accepted");
  TrainOptions o = s;
  o.model.kv_heads = 1;
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("model.kv_heads: is not for the sort task's encoder-decoder"));
  o = s, o.model.scale = false;
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("model.scale:"));
  o = s, o.model.frozen_embeddings = true;
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("model.embeddings:"));
  o = s, o.model.causal = false;
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("model.causal_layers:"));
  o = s, o.snapshot_every = 10;
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("snapshot_every:"));
  o = s, o.encoder_layers = 0;
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("encoder_layers: is 0, out of range"));
  o = s, o.max_source_len = 11;  // sort's sources reach 12 tokens
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("max_source_len: is 11, out of range [12,"));
  o = s, o.model.heads = 3;
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("model.heads:") && Catch::Matchers::Contains("does not divide d_model 64"));
  o = s, o.model.max_len = 12;  // the decoder needs the longest output and the end token
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("model.max_len: is 12, out of range [13,"));
  o = default_options("brackets"), o.encoder_layers = 1;
  CHECK_THAT(field(o), Catch::Matchers::StartsWith("encoder_layers: is for seq2seq tasks"));
  // The memory a step needs grows with the source's positions too.
  o = s, o.max_source_len = 1000;
  CHECK(estimate_memory(o).step > estimate_memory(s).step);
}

TEST_CASE("translate trains with its defaults to exact outputs, teacher-forced and generated alike") {
  std::ostringstream quiet;
  TrainOptions o = default_options("translate");
  o.out = qkv::test::temp_folder("train_translate");
  std::filesystem::remove_all(o.out);
  const TrainResult r = train(o, quiet, false);
  CHECK(r.eval.exact_match >= 0.99);
  const auto model = load_encoder_decoder(o.out);
  const auto task = make_task("translate");
  const Metrics forced = evaluate(*model, *task, 8, 32, 5), written = evaluate_generation(*model, *as_seq2seq(*task), 8, 32, 5);
  CHECK(forced.sequences == 256);
  CHECK(written.sequences == 256);
  CHECK(written.exact_match >= 0.99);
  // Greedy decoding writes a whole output right exactly when teacher forcing predicts every token
  // of it (but for ties of the logits, and for the cache's rounding).
  CHECK(std::abs(written.exact_match - forced.exact_match) <= 1.0 / 256);
  std::filesystem::remove_all(o.out);
}

namespace {

// Each position points at the one before it (position 0 is not scored).
class PreviousPosition : public tasks::Task {
 public:
  PreviousPosition() { info_ = {.name = "previous", .description = "the position before", .vocab_size = 8, .max_len = 10,
                                .readout = nn::Readout::pointer}; }
  const tasks::TaskInfo& info() const override { return info_; }
  tasks::Batch sample(std::size_t batch, Generator& gen) const override {
    tasks::Batch b{IndexArray::from_shape({batch, 10}), IndexArray::from_shape({batch, 10})};
    for (std::size_t r = 0; r < batch; ++r)
      for (std::size_t p = 0; p < 10; ++p) {
        b.tokens(r, p) = std::int64_t(gen.next_u64() % 8);
        b.targets(r, p) = p == 0 ? tasks::ignore_target : std::int64_t(p) - 1;
      }
    return b;
  }
  std::string decode(const std::vector<std::int64_t>& tokens) const override { return tasks::numbers_text(tokens); }
  std::vector<std::int64_t> encode(const std::string& text) const override { return tasks::parse_numbers(text, 8, "previous"); }
  std::string token_name(std::int64_t token) const override { return std::to_string(token); }

 private:
  tasks::TaskInfo info_;
};

}  // namespace

TEST_CASE("a registered task trains, records and reads back by name as a built-in one does") {
  tasks::register_task({.name = "previous", .make = [](std::size_t) { return std::make_unique<PreviousPosition>(); }});
  CHECK(task_names().back() == "previous");
  TrainOptions o = short_run("previous", "registered", 300);
  CHECK(o.model.readout == nn::Readout::pointer);
  CHECK(o.model.vocab_size == 8);
  std::ostringstream notes;
  const TrainResult r = train(o, notes, false);
  CHECK(r.eval.accuracy >= 0.99);
  const TrainOptions read = read_config(o.out);
  CHECK(read.task == "previous");
  CHECK(read.model.max_len == 10);
  // Resumed and extended by name.
  CHECK(train(resumed_options(o.out, "previous", 320), notes, false).steps == 320);
  CHECK_THROWS_WITH(resumed_options(o.out, "brackets"),
                    Catch::Matchers::Contains("--resume: the run in " + o.out + " is a previous run, not brackets"));
  std::filesystem::remove_all(o.out);

  const auto make = [](std::size_t) { return std::make_unique<PreviousPosition>(); };
  CHECK_THROWS_WITH(tasks::register_task({.name = "brackets", .make = make}),
                    "register_task: 'brackets' is a built-in task's name; give the task another");
  CHECK_THROWS_WITH(tasks::register_task({.name = "a/b", .make = make}),
                    Catch::Matchers::Contains("a task's name is 1 to 64 letters, digits, '_' or '-', not 'a/b'"));
  CHECK_THROWS_WITH(tasks::register_task({.name = "none", .make = {}}), "register_task: the none task has no `make`");
}
