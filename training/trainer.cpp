#include "qkv/training/trainer.hpp"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "qkv/analysis/history.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/optim/adam.hpp"
#include "qkv/optim/schedule.hpp"
#include "qkv/report/snapshots.hpp"
#include "qkv/tasks/evaluate.hpp"
#include "qkv/tasks/registry.hpp"
#include "qkv/training/checkpoint.hpp"
#include "qkv/training/kept_checkpoints.hpp"
#include "qkv/training/memory.hpp"
#include "qkv/training/metrics_log.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_folder.hpp"

namespace qkv::training {

using namespace analysis;
using namespace report;
using namespace tasks;

namespace fs = std::filesystem;

namespace {

// The signal that asked a run to stop (SIGINT, SIGTERM), or 0.
std::atomic<int> stop_signal{0};
// When the first of them came (CLOCK_MONOTONIC, in nanoseconds), or 0.
std::atomic<long long> first_stop_ns{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<long long>::is_always_lock_free);  // signal handler

}  // namespace

namespace {

// Which parameters a training step updates: those that get a gradient (so not the frozen ones, nor
// one the readout never reads), found by one step's backward on a sequence from a generator of
// its own.
template <class Model>
std::vector<bool> updated_parameters(const Model& model, const Task& task) {
  Generator probe(1);
  const Batch b = task.sample(1, probe);
  const std::vector<Tensor> params = model.parameters();
  forward(model, task, b, true, true).loss.backward();
  std::vector<bool> updated;
  for (Tensor p : params) {
    updated.push_back(p.requires_grad() && p.grad().defined());
    p.zero_grad();
  }
  return updated;
}

// A run that extends its steps on resume (--resume --steps N): its config.json says N from now on.
// Says whether it equals a run trained to N steps from the start: it does when the learning rates
// of the steps it took already are those of an N-step schedule.
void extend(const std::string& dir, const TrainOptions& recorded, std::size_t steps, std::size_t done,
            std::ostream& notes) {
  TrainOptions extended = recorded;
  extended.steps = steps;
  const optim::Schedule before = training_schedule(recorded), after = training_schedule(extended);
  std::size_t differs = 0;
  while (differs < done && before.lr_at(differs) == after.lr_at(differs)) ++differs;
  notes << fmt::format("qkv train: extending {} from {} to {} steps; from step {} on, the learning rate follows the "
                       "{}-step schedule",
                       dir, recorded.steps, steps, done, steps);
  if (differs == done)
    notes << fmt::format(", as it did before: the run equals one trained to {} steps from the start\n", steps);
  else
    notes << fmt::format(". Steps {} to {} followed the {}-step one ({:.6g} rather than {:.6g} at step {}): the run "
                         "differs from one trained to {} steps from the start (a schedule with --min-lr-ratio 1 "
                         "after its warmup extends exactly)\n",
                         differs, done - 1, recorded.steps, before.lr_at(differs), after.lr_at(differs), differs, steps);
  nn::write_atomically(dir + "/config.json", config_text(extended));
}

// Says where a resumed run will not be bit-identical to an uninterrupted one.
void note_differences(const TrainOptions& recorded, std::ostream& notes) {
  if (recorded.threads != get_num_threads())
    notes << fmt::format("qkv train: the run started on {} threads and resumes on {}: its results may differ in the "
                         "last bits from an uninterrupted run's\n",
                         recorded.threads, get_num_threads());
  if (!recorded.blas.empty() && recorded.blas != blas_kernels())
    notes << fmt::format("qkv train: the run started on the {} BLAS kernels and resumes on {}: its results may differ "
                         "in the last bits from an uninterrupted run's\n",
                         recorded.blas, blas_kernels());
}

// The run of the options `o` (checked, with this machine's threads and BLAS) on `model`, built
// from `gen`, which then draws the training batches.
template <class Model>
TrainResult run(Model& model, const TrainOptions& o, const Task& task, Generator& gen, std::ostream& progress, bool tty,
                const std::function<void(std::size_t, const Model&)>& observe) {
  constexpr bool decoder_only = std::is_same_v<Model, nn::Transformer>;
  optim::AdamW opt(model.parameters(), {.lr = o.lr, .beta2 = o.beta2, .weight_decay = o.weight_decay});
  const Split* split = task.split();  // a data-set task's
  const std::size_t batch = o.batch ? o.batch : split->train.tokens.shape()[0];  // 0: full batch (check_options)
  const optim::Schedule schedule = training_schedule(o);

  fs::path out = fs::path(o.out.empty() ? "runs/" + o.task : o.out).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "runs/x/" is "runs/x"
  RunFolder folder(out.string(), o);
  const std::string metrics_file = folder.path() + "/metrics.jsonl", snapshots_file = folder.path() + "/snapshots.jsonl";
  std::size_t first_step = 0;
  std::optional<std::size_t> resumed_target;  // the target's step, reached before the checkpoint resumed from
  if (o.resume) {
    const TrainOptions recorded = read_config(folder.path());
    check_resume_options(recorded, o);
    note_differences(recorded, progress);
    const CheckpointCheck check{.max_step = o.steps, .updated = updated_parameters(model, task)};
    CheckpointState state;
    const auto restore = [&](const nn::Checkpoint& c) { state = restore_checkpoint(c, model, opt, check); };
    std::ostringstream notes;  // what the resume passed over: each note as "qkv train: …"
    const bool resumed = nn::resume_checkpoint(folder.path(), restore, notes).has_value();
    std::istringstream lines(notes.str());
    for (std::string line; std::getline(lines, line);) progress << (line.starts_with(" ") ? "" : "qkv train: ") << line << "\n";
    if (resumed) {
      first_step = state.step;
      resumed_target = state.steps_to_target;
      gen.set_state(state.rng);
      progress << fmt::format("qkv train: resuming {} from step {} of {}\n", folder.path(), first_step, recorded.steps);
    } else {
      progress << fmt::format("qkv train: {} has no checkpoint yet; training from step 0\n", folder.path());
    }
    if (o.steps != recorded.steps) extend(folder.path(), recorded, o.steps, first_step, progress);
    truncate_metrics(metrics_file, first_step);
    // A run that starts again from step 0 writes its step-0 snapshot again.
    if (o.snapshot_every && first_step > 0) truncate_metrics(snapshots_file, first_step, snapshot_max_depth);
  } else {
    nn::write_atomically(folder.path() + "/config.json", config_text(o));
  }
  MetricsLog metrics(metrics_file, !o.resume);
  const std::optional<KeepSchedule> keep = keep_schedule(o.keep_checkpoints);
  if (keep) remove_partial_kept(folder.path());
  std::optional<MetricsLog> snapshots;
  std::optional<Snapshots> snapshot;
  if (o.snapshot_every) {  // check_options allows them for decoder-only models
    snapshots.emplace(snapshots_file, !o.resume || first_step == 0);
    snapshot.emplace(o, task);
  }

  const auto start = std::chrono::steady_clock::now();
  const auto since = [](auto t) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(); };
  double observing = 0;  // the observer's time, which the run's seconds leave out
  const auto elapsed = [&] { return since(start) - observing; };
  const auto observed = [&](std::size_t step) {
    const auto t = std::chrono::steady_clock::now();
    if constexpr (decoder_only) {
      if (snapshot && snapshot->due(step)) snapshots->write(snapshot->take(step, model).dump());
      if (keep && keep->due(step, o.steps)) keep_checkpoint(folder.path(), step, model);
    }
    if (observe) observe(step, model);
    observing += since(t);
  };
  const std::size_t last_step = o.stop_after ? std::min(o.stop_after, o.steps) : o.steps;
  TrainResult result;
  result.steps_to_target = resumed_target;
  double running_loss = 0, running_acc = 0;
  std::size_t since_log = 0;
  if (first_step == 0) observed(0);
  for (std::size_t step = first_step; step < last_step; ++step) {
    const Batch b = task.sample(batch, gen);
    schedule.apply(opt, step);
    opt.zero_grad();
    const Forward f = forward(model, task, b, o.mask_padding, true);
    f.loss.backward();
    if (o.clip > 0) optim::clip_grad_norm(model.parameters(), o.clip);
    opt.step();
    running_loss += f.loss.item();
    running_acc += score(f.predictions, b).accuracy;
    ++since_log;
    if ((step + 1) % o.log_every == 0 || step + 1 == o.steps) {
      nlohmann::json line = {{"step", step + 1}, {"loss", running_loss / double(since_log)},
                             {"accuracy", running_acc / double(since_log)}, {"lr", opt.lr()}};
      if constexpr (decoder_only)
        if (split) {  // the held-out split after this step, in the run's time
          const RowsScore test = score_rows(model, task, split->test, o.mask_padding);
          line["test_loss"] = test.loss;
          line["test_accuracy"] = test.metrics.accuracy;
        }
      const double seconds = elapsed(), rate = double(step + 1 - first_step) / seconds;
      line["seconds"] = seconds;
      metrics.write(line.dump());
      const std::string text = fmt::format("step {:>5}/{}  loss {:.4f}  accuracy {:6.2f}%  {:.0f} steps/s  ETA {:.0f}s",
                                           step + 1, o.steps, running_loss / double(since_log),
                                           100 * running_acc / double(since_log), rate,
                                           double(o.steps - step - 1) / rate);
      progress << (tty ? "\r\033[K" : "") << text << (tty ? "" : "\n") << std::flush;
      result.loss = running_loss / double(since_log);
      running_loss = running_acc = 0;
      since_log = 0;
    }
    if (o.target_every && !result.steps_to_target && (step + 1) % o.target_every == 0 &&
        evaluate(model, task, o.target_batches, o.batch, o.seed, o.mask_padding).accuracy >= o.target)
      result.steps_to_target = step + 1;
    observed(step + 1);
    // A signal is answered once: a caller that goes on after Interrupted is not stopped again.
    const int signal = step + 1 < last_step ? stop_signal.exchange(0) : 0;
    const bool due = (step + 1) % o.checkpoint_every == 0 || step + 1 == last_step;
    if (signal && !due && folder.replacing())  // the run it would replace stays whole, as --force promises
      throw Interrupted(signal, fmt::format("interrupted at step {} of {}, before its first checkpoint: {} keeps the run "
                                            "it had",
                                            step + 1, o.steps, out.string()));
    if (due || signal) {
      save_checkpoint(folder.path(), model, opt, {.step = step + 1, .rng = gen.state(), .steps_to_target = result.steps_to_target});
      folder.checkpointed();
    }
    if (signal) {
      if (tty) progress << "\n";
      throw Interrupted(signal, fmt::format("interrupted at step {} of {}; the checkpoint of step {} is in {}; continue "
                                            "with --resume",
                                            step + 1, o.steps, step + 1, folder.path()));
    }
  }
  if (tty) progress << "\n";
  result.steps = last_step;
  result.seconds = elapsed();
  result.eval = evaluate(model, task, o.eval_batches, o.batch, o.seed, o.mask_padding);
  return result;
}

// The model of the options, drawn from `gen`.
template <class Model, class Config>
std::unique_ptr<Model> build(const Config& config, Generator& gen) {
  try {
    return std::make_unique<Model>(config, gen);
  } catch (const std::invalid_argument& e) {
    throw OptionError("model", e.what());
  }
}

}  // namespace

namespace {

// A second request ends the program at once, but not one within a second of the first: that is
// the same request delivered twice (timeout(1) sends its signal to the program and to its process
// group; a terminal's Ctrl-C reaches every process of the foreground group).
void request_stop(int signal) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  const long long ns = now.tv_sec * 1'000'000'000LL + now.tv_nsec;
  long long first = 0;
  if (!first_stop_ns.compare_exchange_strong(first, ns) && ns - first >= 1'000'000'000LL) {
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  stop_signal.store(signal);
}

}  // namespace

int pending_stop() { return stop_signal.load(); }

int take_pending_stop() { return stop_signal.exchange(0); }

void stop_on_signals() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  first_stop_ns.store(0);
  sigemptyset(&action.sa_mask);
  for (const int signal : {SIGINT, SIGTERM}) {
    struct sigaction old {};
    // A signal ignored when the program started stays ignored (a background job's SIGINT).
    if (sigaction(signal, nullptr, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(signal, &action, nullptr);
  }
}

nlohmann::json result_json(const TrainOptions& o, const TrainResult& r) {
  return {{"task", o.task},
          {"accuracy", r.eval.accuracy},
          {"exact_match", r.eval.exact_match},
          {"steps", r.steps},
          {"seconds", r.seconds},
          {"loss", r.loss ? nlohmann::json(*r.loss) : nlohmann::json()},
          {"out", o.out.empty() ? "runs/" + o.task : o.out}};
}

TrainResult train(const TrainOptions& options, std::ostream& progress, bool tty, const TrainObserver& observe,
                  const Seq2SeqObserver& observe_seq2seq) {
  if (const int signal = stop_signal.exchange(0)) throw Interrupted(signal, "interrupted before the run started");
  TrainOptions o = options;
  o.threads = get_num_threads();
  if (!o.resume) o.blas = blas_kernels();
  check_options(o);
  check_memory(o, true);
  const auto task = make_task(o);
  Generator gen(o.seed);
  if (o.encoder_layers) {
    if (observe)
      fail("train", "the {} task trains an encoder-decoder: its observer is a Seq2SeqObserver, not a TrainObserver", o.task);
    return run(*build<nn::EncoderDecoder>(encoder_decoder_config(o), gen), o, *task, gen, progress, tty, observe_seq2seq);
  }
  if (observe_seq2seq)
    fail("train", "the {} task trains a decoder-only model: its observer is a TrainObserver, not a Seq2SeqObserver", o.task);
  return run(*build<nn::Transformer>(o.model, gen), o, *task, gen, progress, tty, observe);
}

}  // namespace qkv::training
