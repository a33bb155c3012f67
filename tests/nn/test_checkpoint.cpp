#include "tests/helpers.hpp"

#include <fcntl.h>
#include <sys/file.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/nn/layers.hpp"
#include "qkv/nn/safetensors.hpp"
#include "qkv/nn/seq2seq.hpp"
#include "qkv/nn/transformer.hpp"

using namespace qkv;
using namespace qkv::nn;
using namespace qkv::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::vector<std::size_t> steps_of(const std::string& dir) {
  std::vector<std::size_t> steps;
  for (const auto& [step, path] : checkpoint_folders(dir)) steps.push_back(step);
  return steps;
}

}  // namespace

TEST_CASE("a checkpoint is committed whole, the previous one is kept, and readers find files through links") {
  const std::string dir = scratch("commit");
  CHECK_FALSE(committed_checkpoint(dir));
  commit_checkpoint(dir, 10, {{"a.bin", "ten"}, {"b.bin", "TEN"}});
  CHECK(committed_checkpoint(dir) == dir + "/checkpoint-00000010");
  CHECK(read_file(dir + "/a.bin", 100) == "ten");
  commit_checkpoint(dir, 20, {{"a.bin", "twenty"}, {"b.bin", "TWENTY"}});
  commit_checkpoint(dir, 30, {{"a.bin", "thirty"}, {"b.bin", "THIRTY"}});
  CHECK(read_file(dir + "/a.bin", 100) == "thirty");
  CHECK(read_file(dir + "/b.bin", 100) == "THIRTY");
  CHECK(steps_of(dir) == std::vector<std::size_t>{30, 20});
  CHECK(fs::is_symlink(dir + "/a.bin"));
  CHECK(fs::read_symlink(dir + "/checkpoint") == "checkpoint-00000030");
  CHECK_THROWS_AS(commit_checkpoint(dir, 30, {{"a.bin", "again"}}), std::logic_error);
}

TEST_CASE("what a save killed midway leaves is never committed, and remove_partial_files clears it") {
  const std::string dir = scratch("killed");
  commit_checkpoint(dir, 10, {{"a.bin", "ten"}});
  // Killed while writing step 20's files, and while linking its pointer.
  fs::create_directories(dir + "/checkpoint-00000020.tmp");
  write_durably(dir + "/checkpoint-00000020.tmp/a.bin", "twe");
  fs::create_symlink("checkpoint-00000020", dir + "/checkpoint.tmp");
  write_durably(dir + "/config.json.tmp", "{");
  write_durably(dir + "/notes.tmp", "a user's own");
  CHECK(committed_checkpoint(dir) == dir + "/checkpoint-00000010");
  CHECK(read_file(dir + "/a.bin", 100) == "ten");
  remove_partial_files(dir, {"config.json"});
  CHECK_FALSE(fs::exists(dir + "/checkpoint-00000020.tmp"));
  CHECK_FALSE(fs::exists(fs::symlink_status(dir + "/checkpoint.tmp")));
  CHECK_FALSE(fs::exists(dir + "/config.json.tmp"));
  CHECK(read_file(dir + "/notes.tmp", 100) == "a user's own");
  CHECK(read_file(dir + "/a.bin", 100) == "ten");
  // A stale .tmp from an earlier death does not stop the next save.
  fs::create_directories(dir + "/checkpoint-00000020.tmp");
  commit_checkpoint(dir, 20, {{"a.bin", "twenty"}});
  CHECK(read_file(dir + "/a.bin", 100) == "twenty");
}

TEST_CASE("recommit_checkpoint points back at an older checkpoint, and the next commit drops the abandoned ones") {
  const std::string dir = scratch("recommit");
  for (std::size_t step : {10, 20, 30}) commit_checkpoint(dir, step, {{"a.bin", std::to_string(step)}});
  recommit_checkpoint(dir, 20);
  CHECK(read_file(dir + "/a.bin", 100) == "20");
  commit_checkpoint(dir, 25, {{"a.bin", "25"}});
  CHECK(steps_of(dir) == std::vector<std::size_t>{25, 20});
}

TEST_CASE("checkpoint_step reads a checkpoint folder's step from its name") {
  CHECK(checkpoint_step("runs/x/checkpoint-00001000") == std::optional<std::size_t>(1000));
  CHECK(checkpoint_step("checkpoint-7") == std::optional<std::size_t>(7));
  CHECK_FALSE(checkpoint_step("runs/x"));
  CHECK_FALSE(checkpoint_step("runs/x/checkpoint-"));
  CHECK_FALSE(checkpoint_step("runs/x/checkpoint-12a"));
}

TEST_CASE("a run folder's lock is exclusive, names its holder, and is released with its holder") {
  const std::string dir = scratch("lock");
  {
    const RunLock first(dir);
    CHECK_THROWS_WITH(RunLock(dir), Contains(dir + ": in use by another process (pid " + std::to_string(::getpid()) + ")"));
  }
  CHECK_NOTHROW(RunLock(dir));
}

TEST_CASE("a lock taken a moment ago names its holder once it writes its pid, and a shorter pid replaces a longer one") {
  const std::string dir = scratch("lock_moment");
  write_durably(dir + "/run.lock", "123456789012345\n");  // a holder's of long ago
  {
    const RunLock lock(dir);
    CHECK(read_file(dir + "/run.lock", 100).find(std::to_string(::getpid()) + " ") == 0);
    CHECK(read_file(dir + "/run.lock", 100).find("12345678") == std::string::npos);
  }
  // Another process's lock, taken just now: its pid is written 50 ms later.
  fs::remove(dir + "/run.lock");
  const int fd = ::open((dir + "/run.lock").c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  ssize_t written = 0;
  std::thread holder([fd, &written] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    written = ::pwrite(fd, "4242\n", 5, 0);
  });
  CHECK_THROWS_WITH(RunLock(dir), Contains("(pid 4242)"));
  holder.join();
  CHECK(written == 5);
  ::close(fd);
}

TEST_CASE("a checkpoint that cannot be written leaves no partial folder or link, and nothing is written over a folder in a link's place") {
  const std::string dir = scratch("commit_fails");
  commit_checkpoint(dir, 10, {{"a.bin", "ten"}});
  {
    FileSizeLimit full(1000);
    CHECK_THAT(runtime_error_message([&] { commit_checkpoint(dir, 20, {{"a.bin", std::string(5000, 'x')}}); }),
               Contains("checkpoint-00000020.tmp/a.bin: writing failed"));
  }
  CHECK_FALSE(fs::exists(dir + "/checkpoint-00000020.tmp"));
  CHECK(committed_checkpoint(dir) == dir + "/checkpoint-00000010");
  // A folder of the user's where the run links a file: refused before anything is written.
  fs::remove(dir + "/a.bin");
  fs::create_directories(dir + "/a.bin");
  CHECK_THAT(runtime_error_message([&] { commit_checkpoint(dir, 20, {{"a.bin", "twenty"}}); }),
             Contains(dir + "/a.bin: is a folder, where the run keeps its link to checkpoint/a.bin"));
  CHECK(steps_of(dir) == std::vector<std::size_t>{10});
  CHECK_FALSE(fs::exists(fs::symlink_status(dir + "/a.bin.tmp")));
  CHECK_FALSE(fs::exists(dir + "/checkpoint-00000020.tmp"));
}

TEST_CASE("a checkpoint link that points out of the run is named, and a resume falls back to the run's own checkpoints and repairs it") {
  const std::string dir = scratch("bad_link");
  const Linear model(2, 3);
  for (const std::string target : {"/etc", "checkpoint", "../elsewhere/checkpoint-00000010"}) {
    INFO(target);
    fs::remove_all(dir);
    fs::create_directories(dir);
    save_checkpoint(dir, model, {}, {.step = 10});
    save_checkpoint(dir, model, {}, {.step = 20});
    fs::remove(dir + "/checkpoint");
    fs::create_symlink(target, dir + "/checkpoint");
    const std::string fault =
        dir + "/checkpoint: is a link to '" + target + "', not a link to one of the run's checkpoint-STEP folders";
    CHECK_THAT(runtime_error_message([&] { committed_checkpoint(dir); }), Contains(fault));
    std::ostringstream notes;
    const auto found = resume_checkpoint(dir, [](const Checkpoint&) {}, notes);
    REQUIRE(found);
    CHECK(found->info.step == 20);
    CHECK_THAT(notes.str(), Contains("resuming from " + dir + "/checkpoint-00000020 (step 20)") && Contains(fault));
    CHECK(committed_checkpoint(dir) == dir + "/checkpoint-00000020");
  }
  // A folder in the link's place is the user's: named, never replaced.
  fs::remove(dir + "/checkpoint");
  fs::create_directories(dir + "/checkpoint");
  CHECK_THAT(runtime_error_message([&] { committed_checkpoint(dir); }), Contains(dir + "/checkpoint: is not a link"));
  CHECK_THAT(runtime_error_message([&] { committed_checkpoint(dir); }), Contains("(move it away)"));
  CHECK_THAT(runtime_error_message([&] { save_checkpoint(dir, model, {}, {.step = 30}); }),
             Contains(dir + "/checkpoint: is a folder, where the run keeps its link to a checkpoint-STEP folder"));
  std::ostringstream notes;
  CHECK_THAT(runtime_error_message([&] { resume_checkpoint(dir, [](const Checkpoint&) {}, notes); }),
             Contains(dir + "/checkpoint: is a folder"));
  CHECK(notes.str().empty());
  CHECK(fs::is_directory(fs::symlink_status(dir + "/checkpoint")));
  // A link to elsewhere and no checkpoint folder left: the run is named, never restarted from step 0.
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_symlink("/etc", dir + "/checkpoint");
  CHECK_THAT(runtime_error_message([&] { resume_checkpoint(dir, [](const Checkpoint&) {}, notes); }),
             Contains(dir + ": no checkpoint loads") && Contains("is a link to '/etc'"));
}

TEST_CASE("replace_folder swaps a new folder in and removes the old one") {
  const std::string parent = scratch("replace");
  fs::create_directories(parent + "/run");
  write_durably(parent + "/run/old", "old");
  fs::create_directories(parent + "/run.new");
  write_durably(parent + "/run.new/new", "new");
  replace_folder(parent + "/run", parent + "/run.new");
  CHECK(read_file(parent + "/run/new", 100) == "new");
  CHECK_FALSE(fs::exists(parent + "/run/old"));
  CHECK_FALSE(fs::exists(parent + "/run.new"));
}

namespace {

// A name as runs saved it before weights were named on the paths of the hook points.
std::string older_name(std::string name) {
  const auto swap = [&](const std::string& from, const std::string& to) {
    const auto at = name.find(from);
    if (at != std::string::npos) name.replace(at, from.size(), to);
  };
  swap("mlp.fc.", "fc.");
  swap("mlp.proj.", "proj.");
  if (name.rfind("blocks.", 0) == 0) name.replace(0, 7, "layers.");
  swap("encoder.blocks.", "encoder.");
  if (name.rfind("decoder.blocks.", 0) == 0) {
    name.replace(0, 15, "decoder.");
    const auto dot = name.find('.', 8);
    if (name.compare(dot, 6, ".attn.") == 0) name.replace(dot, 6, ".self_attn.");
  }
  if (name.rfind("ln_final.", 0) == 0) name.replace(0, 9, "ln_f.");
  return name;
}

template <class Model, class Config>
void check_loads_older_names(const Config& config) {
  Generator gen(4), other(5);
  const Model saved(config, gen);
  StateDict older;
  for (const auto& [name, t] : saved.state_dict()) older.emplace_back(older_name(name), t);
  const std::string file = scratch("older-names") + "/model.safetensors";
  save_safetensors(file, older);
  Model loaded(config, other);
  load_weights(load_safetensors(file), file, loaded);
  const StateDict a = saved.state_dict(), b = loaded.state_dict();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].second.value<float>() == b[i].second.value<float>());
}

}  // namespace

TEST_CASE("weights saved under the older names load into today's models") {
  // Each older name, by hand, for the models with their MLP.
  CHECK(older_name("blocks.1.mlp.fc.weight") == "layers.1.fc.weight");
  CHECK(older_name("decoder.blocks.0.attn.q_proj.bias") == "decoder.0.self_attn.q_proj.bias");
  CHECK(older_name("decoder.blocks.0.cross_attn.q_proj.bias") == "decoder.0.cross_attn.q_proj.bias");
  CHECK(older_name("encoder.blocks.1.mlp.proj.weight") == "encoder.1.proj.weight");
  check_loads_older_names<Transformer>(
      TransformerConfig{.vocab_size = 5, .n_classes = 3, .max_len = 6, .layers = 2, .d_model = 8, .heads = 2, .mlp = true});
  check_loads_older_names<EncoderDecoder>(EncoderDecoderConfig{.src_vocab = 5, .tgt_vocab = 6, .max_src_len = 4,
                                                               .max_tgt_len = 5, .encoder_layers = 2, .decoder_layers = 2,
                                                               .d_model = 8, .heads = 2, .mlp = true});

  // A run's model.safetensors as the program wrote it before (a pointer model of one layer).
  const std::string dir = QKV_FIXTURES "/older_names";
  Generator gen(0);
  Transformer model(load_config(dir), gen);
  const Safetensors file = load_safetensors(dir + "/model.safetensors");
  load_weights(file, dir + "/model.safetensors", model);
  const StateDict state = model.state_dict();
  REQUIRE(state.size() == file.tensors.size());
  for (std::size_t i = 0; i < state.size(); ++i) {
    CHECK(older_name(state[i].first) == file.tensors[i].first);
    CHECK(state[i].second.value<float>() == file.tensors[i].second.value<float>());
  }

  // A module of one's own whose weights are named layers.L.* loads as saved, renamed nothing.
  struct Stack : Module {
    Stack() { register_module("layers.0", a), register_module("blocks.0", b); }
    Linear a{2, 3}, b{3, 2};
  } mine, theirs;
  CHECK(older_weight_names(mine.state_dict(), theirs).front().first == "layers.0.weight");
  const std::string own = scratch("older-names-own") + "/model.safetensors";
  save_safetensors(own, mine.state_dict());
  load_weights(load_safetensors(own), own, theirs);
  CHECK(theirs.a.weight.value<float>() == mine.a.weight.value<float>());
  CHECK(theirs.b.weight.value<float>() == mine.b.weight.value<float>());
}
