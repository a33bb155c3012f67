#pragma once
// `qkv train TASK`: Adam with warmup + cosine and gradient clipping, evaluated on fresh
// held-out sequences, in a run folder (run_folder.hpp) that it can resume and extend.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/tasks/task.hpp"
#include "qkv/tasks/train_options.hpp"

namespace qkv::training {

using tasks::TrainOptions;

// A run stopped by a signal after it committed a checkpoint of its last step (see
// stop_on_signals); the program exits with 128 + signal.
struct Interrupted : std::runtime_error {
  Interrupted(int signal, const std::string& message) : std::runtime_error(message), signal(signal) {}
  int signal;
};
// From now on, SIGINT or SIGTERM ask the run in progress to stop: it finishes its step, commits a
// checkpoint and throws Interrupted (a signal during the last step lets the run finish). A second
// signal, a second or more after the first, ends the program at once (the checkpoint already
// committed stays whole); one sooner is the same request delivered twice, as timeout(1) does. A
// signal the program was started ignoring (a background job's SIGINT) stays ignored.
void stop_on_signals();
// The signal that asked the run to stop and has not been answered yet (SIGINT, SIGTERM), or 0:
// for a program that waits on runs in other processes and passes it on.
int pending_stop();
// The same, answered: it is no longer pending (for a caller that passes a stop on once its run has
// ended, as the Python module hands a Ctrl-C during a run's last step back to Python).
int take_pending_stop();

struct TrainResult {
  tasks::Metrics eval;  // on held-out sequences
  std::size_t steps = 0;
  double seconds = 0;
  std::optional<double> loss;  // mean of the last logging window; none when no step ran
  std::optional<std::size_t> steps_to_target;  // with TrainOptions::target_every
};

// What `qkv train` prints when a run ends: task, accuracy, exact_match, steps, seconds, loss (null
// when no step ran) and out (the run's folder).
nlohmann::json result_json(const TrainOptions& options, const TrainResult& result);


// Sees the model before the first step when the run starts from step 0, and after every step, with
// the number of steps done; it picks the steps it measures, and must not change the model. Its
// time is left out of the run's seconds (TrainResult, metrics.jsonl).
using TrainObserver = std::function<void(std::size_t step, const nn::Transformer& model)>;
// The same for a seq2seq task's encoder-decoder.
using Seq2SeqObserver = std::function<void(std::size_t step, const nn::EncoderDecoder& model)>;

// Trains, writes OUT/config.json, OUT/metrics.jsonl and checkpoints (see checkpoint.hpp), and shows
// progress on `progress` (an in-place line when `tty`, else a line per log step). A resumed run
// ends with weights bit-identical to those of an uninterrupted one. The options are checked, and
// the model and optimizer built, before the folder is touched; the folder is locked while the run
// writes it. An existing run in OUT is refused (UsageError) unless options.resume or options.force.
// A resume starts from the newest checkpoint that loads, and cuts metrics.jsonl back to its step.
// `observe` sees a decoder-only model, `observe_seq2seq` an encoder-decoder; the other one given is
// an error (std::invalid_argument) before anything is written.
TrainResult train(const TrainOptions& options, std::ostream& progress, bool tty, const TrainObserver& observe = {},
                  const Seq2SeqObserver& observe_seq2seq = {});
}  // namespace qkv::training
