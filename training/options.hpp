#pragma once
// A run's options as the library checks them and config.json records them: their ranges and
// combinations, the file's text and its reading, the schedule they give, and what a resume may change.
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "qkv/nn/seq2seq.hpp"
#include "qkv/optim/schedule.hpp"
#include "qkv/tasks/train_options.hpp"

namespace qkv::training {

using tasks::TrainOptions;

// A bad command line: the program exits with code 2 (a fault in a file, or anything else, exits 1).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The encoder-decoder of a seq2seq task's options (its vocabularies the task's).
nn::EncoderDecoderConfig encoder_decoder_config(const TrainOptions& options);

// The name config.json gives an OptionError's field: the same, but for an encoder-decoder run's
// model, whose file names the decoder's sizes its own way ("model.max_len" is "model.max_tgt_len").
std::string config_field(const TrainOptions& options, const std::string& field);

// A value out of range: `field` is config.json's name for it ("batch", "model.d_model").
struct OptionError : std::invalid_argument {
  OptionError(std::string field, const std::string& message) : std::invalid_argument(message), field(std::move(field)) {}
  std::string field;
};

// Checks every value and their combinations (heads that divide d_model, the task's vocabulary,
// a learning rate Adam can take), and throws OptionError naming the first field at fault.
void check_options(const TrainOptions& options);

// The rows of a training step: `batch`, or a data-set task's whole training split for batch 0.
std::size_t step_rows(const TrainOptions& options);

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

// The options that resume the `task` run in `dir` (its config.json's, with resume set), extended to
// `steps` when given; UsageError when the run in `dir` is another task's.
TrainOptions resumed_options(const std::string& dir, const std::string& task, std::optional<std::size_t> steps = {});
}  // namespace qkv::training
