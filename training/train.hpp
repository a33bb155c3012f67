#pragma once
// `qkv train TASK`: Adam with warmup + cosine and gradient clipping, evaluated on fresh
// held-out sequences.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "qkv/tasks/task.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"
#include "qkv/optim/schedule.hpp"

namespace qkv::cli {

// A bad command line: the program exits with code 2 (a fault in a file, or anything else, exits 1).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TrainOptions {
  std::string task;
  std::size_t n = 0;  // the task's size (line, cycle: its values); 0 for a task that has none
  std::string out;  // run folder; "" means runs/TASK
  std::uint64_t seed = 0;
  std::size_t steps = 2000, batch = 32, warmup = 100, log_every = 100;
  double lr = 3e-3, min_lr_ratio = 0.1, weight_decay = 0, clip = 1.0;
  std::size_t eval_batches = 32;  // of `batch` fresh sequences each
  std::size_t checkpoint_every = 500;  // and at the end
  // With N > 0, OUT/snapshots.jsonl keeps what the heads look like along training (snapshot.hpp)
  // at step 0, the log-spaced steps 10, 20, 30, 50, 100, … below N, every N steps and the last.
  std::size_t snapshot_every = 0;
  std::size_t threads = 1;             // recorded; the caller sets them (set_num_threads)
  // Bidirectional layers mask the padding keys (key_padding). Runs written before it was recorded
  // trained without, and are read back so.
  bool mask_padding = true;
  std::string blas;                    // the BLAS kernels the run started on (blas_kernels())
  std::size_t stop_after = 0;  // stop (checkpointed) after this step, to resume later; 0: run to the end
  bool resume = false;         // continue the run in `out` from its checkpoint
  // Replace a run already in `out`: the new run trains in OUT.new.tmp until its first checkpoint,
  // then takes OUT's place; until then the old run is untouched. Without it, train refuses such a
  // folder.
  bool force = false;
  // Every `target_every` steps (0: never), accuracy on `target_batches` held-out batches; the
  // first step where it reaches `target` is TrainResult::steps_to_target.
  double target = 0;
  std::size_t target_every = 0, target_batches = 4;
  // The decoder-only model; for a seq2seq task the encoder-decoder's decoder (layers, max_len: its
  // positions) and what both sides share (d_model, heads, qk, proj, mlp, positions), with:
  nn::TransformerConfig model;
  std::size_t encoder_layers = 0;  // the encoder's layers (0 for other tasks)
  std::size_t max_source_len = 0;  // the encoder's positions (0 for other tasks)
};

// The encoder-decoder of a seq2seq task's options (its vocabularies the task's).
nn::EncoderDecoderConfig encoder_decoder_config(const TrainOptions& options);

// The name config.json gives an OptionError's field: the same, but for an encoder-decoder run's
// model, whose file names the decoder's sizes its own way ("model.max_len" is "model.max_tgt_len").
std::string config_field(const TrainOptions& options, const std::string& field);

// The largest values train accepts. Memory is checked apart (check_memory), and refuses most runs
// long before these.
inline constexpr std::size_t max_steps = 1'000'000'000, max_batch = 1'000'000,
                             max_layers = nn::TransformerConfig::max_layers, max_width = nn::TransformerConfig::max_width,
                             max_threads = 1024;

// A value out of range: `field` is config.json's name for it ("batch", "model.d_model").
struct OptionError : std::invalid_argument {
  OptionError(std::string field, const std::string& message) : std::invalid_argument(message), field(std::move(field)) {}
  std::string field;
};

// Checks every value and their combinations (heads that divide d_model, the task's vocabulary,
// a learning rate Adam can take), and throws OptionError naming the first field at fault.
void check_options(const TrainOptions& options);
// Throws OptionError, naming the field to make smaller, when the model and a training step (or,
// without `training`, the weights and a forward pass) would need more memory than this machine
// has available (estimate_memory). train and load_model check it before they allocate anything.
void check_memory(const TrainOptions& options, bool training);

// The memory a run needs, in bytes, estimated from its options: the model with its gradients and
// Adam's state, and a training step's activations and their gradients.
struct MemoryEstimate {
  double model = 0, step = 0;
};
MemoryEstimate estimate_memory(const TrainOptions& options);

// The text of the config.json that records `options`.
std::string config_text(const TrainOptions& options);
// The options a run folder's config.json records; throws std::runtime_error naming the file and
// the field at fault.
TrainOptions read_config(const std::string& dir);
// The same from the text of a config.json; `file` names it in messages.
TrainOptions parse_config(std::string_view text, const std::string& file);

// The learning rate along a run: a linear warmup of options.warmup steps (at most half the run),
// then a cosine down to lr · min_lr_ratio at options.steps.
optim::Schedule training_schedule(const TrainOptions& options);

// A resume (options.resume) may raise options.steps, which extends the run: config.json records the
// new steps, and the learning rate follows the schedule of the new steps from the checkpoint on
// (equal to a run trained to the new steps from the start when the steps already taken had the
// same learning rates, as after a warmup with min_lr_ratio 1; train says which). Any other option
// that differs from the run's config.json is refused with UsageError, as are fewer steps than
// config.json records.
void check_resume_options(const TrainOptions& recorded, const TrainOptions& options);

// A run stopped by a signal after it committed a checkpoint of its last step (see
// stop_on_signals); the program exits with 128 + signal.
struct Interrupted : std::runtime_error {
  Interrupted(int signal, const std::string& message) : std::runtime_error(message), signal(signal) {}
  int signal;
};
// From now on, SIGINT or SIGTERM ask the run in progress to stop: it finishes its step, commits a
// checkpoint and throws Interrupted (a signal during the last step lets the run finish). A second
// signal ends the program at once (the checkpoint already committed stays whole). A signal the
// program was started ignoring (a background job's SIGINT) stays ignored.
void stop_on_signals();

// The defaults of each task (its TaskSpec's), with which `qkv train TASK` reaches its target.
TrainOptions default_options(const std::string& task, std::size_t n = 0);

struct TrainResult {
  Metrics eval;  // on held-out sequences
  std::size_t steps = 0;
  double seconds = 0;
  std::optional<double> loss;  // mean of the last logging window; none when no step ran
  std::optional<std::size_t> steps_to_target;  // with TrainOptions::target_every
};

// The name of each token id of the task, as config.json records them.
std::vector<std::string> token_names(const Task& task);

// Sees the model before the first step when the run starts from step 0, and after every step, with
// the number of steps done; it picks the steps it measures, and must not change the model. Its
// time is left out of the run's seconds (TrainResult, metrics.jsonl).
using TrainObserver = std::function<void(std::size_t step, const nn::Transformer& model)>;

// Trains, writes OUT/config.json, OUT/metrics.jsonl and checkpoints (see checkpoint.hpp), and shows
// progress on `progress` (an in-place line when `tty`, else a line per log step). A resumed run
// ends with weights bit-identical to those of an uninterrupted one. The options are checked, and
// the model and optimizer built, before the folder is touched; the folder is locked while the run
// writes it. An existing run in OUT is refused (UsageError) unless options.resume or options.force.
// A resume starts from the newest checkpoint that loads, and cuts metrics.jsonl back to its step.
TrainResult train(const TrainOptions& options, std::ostream& progress, bool tty, const TrainObserver& observe = {});

// The model of a run folder, once config.json passes the program's checks (its task, ranges and
// memory): nn::load_transformer, or for a seq2seq task's run nn::load_encoder_decoder. Throws
// std::runtime_error naming the file at fault (load_model: a seq2seq run's folder, naming its task).
std::unique_ptr<nn::Transformer> load_model(const std::string& dir);
std::unique_ptr<nn::EncoderDecoder> load_encoder_decoder(const std::string& dir);

// Appends one JSON object a line to a run's metrics.jsonl, flushed at once; a failed write throws
// std::runtime_error naming the file (a full disk fails the run, rather than losing its log).
class MetricsLog {
 public:
  // Opens `path` to append; with `truncate`, empties it first.
  MetricsLog(std::string path, bool truncate);
  void write(const std::string& line);

 private:
  std::string path_;
  std::unique_ptr<std::ofstream> out_;
};

// Cuts a metrics.jsonl (or snapshots.jsonl, whose lines nest `max_depth` deep) back to the lines
// of steps up to `step` (a resumed run writes the rest again), dropping a line cut short by a
// kill. Throws std::runtime_error naming the file.
void truncate_metrics(const std::string& path, std::size_t step, int max_depth = 1);

// The key-padding mask of a batch, (B, T) false at the task's pad token, when the model has a
// bidirectional layer (where real queries would see the padding); 0-d otherwise (a causal query
// never sees the padding after it).
MaskArray key_padding(const nn::Transformer& model, const Task& task, const IndexArray& tokens, bool mask_padding = true);

// The generator of the held-out sequences of `seed`: a stream no training batch draws from.
Generator held_out_generator(std::uint64_t seed);

// The source padding of a seq2seq batch, (B, S) false at the task's source_pad: no query attends it.
MaskArray source_padding(const Task& task, const IndexArray& source);

// Accuracy of `model` on `batches` fresh batches drawn from held_out_generator(seed); a seq2seq
// model's with teacher forcing (each position given the right output before it).
Metrics evaluate(const nn::Transformer& model, const Task& task, std::size_t batches, std::size_t batch_size, std::uint64_t seed,
                 bool mask_padding = true);
Metrics evaluate(const nn::EncoderDecoder& model, const Task& task, std::size_t batches, std::size_t batch_size,
                 std::uint64_t seed, bool mask_padding = true);
// The same sequences decoded greedily with the KV cache, from the start token alone: a position is
// right when the generated token is the output's (or the end token after it), a sequence when all
// are, up to its end token. (Equal to teacher forcing's exact match, but for ties of the logits.)
Metrics evaluate_generation(const nn::EncoderDecoder& model, const Seq2SeqTask& task, std::size_t batches,
                            std::size_t batch_size, std::uint64_t seed);

}  // namespace qkv::cli
