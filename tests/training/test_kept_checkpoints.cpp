#include "tests/training/short_run.hpp"

#include <fstream>
#include <sstream>

#include "qkv/nn/checkpoint.hpp"
#include "qkv/nn/files.hpp"
#include "qkv/training/kept_checkpoints.hpp"

using namespace qkv;
using namespace qkv::training;
using namespace qkv::test;
using Catch::Matchers::Contains;

TEST_CASE("kept checkpoints: the log and every:N schedules, and what is refused") {
  const KeepSchedule log = *keep_schedule("log");
  // Ten a decade, round(10^(i/10)), with step 0 and the last.
  CHECK(log.steps(1500) == std::vector<std::size_t>{0, 10, 13, 16, 20, 25, 32, 40, 50, 63, 79, 100, 126, 158, 200, 251,
                                                    316, 398, 501, 631, 794, 1000, 1259, 1500});
  CHECK(log.steps(5) == std::vector<std::size_t>{0, 5});
  for (const std::size_t step : log.steps(1500)) CHECK(log.due(step, 1500));
  CHECK_FALSE(log.due(11, 1500));
  CHECK_FALSE(log.due(1499, 1500));
  const KeepSchedule every = *keep_schedule("every:40");
  CHECK(every.steps(100) == std::vector<std::size_t>{0, 40, 80, 100});
  CHECK(every.due(80, 100));
  CHECK_FALSE(every.due(60, 100));
  CHECK_FALSE(keep_schedule(""));
  for (const char* bad : {"every:0", "every:", "every:x", "every:-3", "logs", "every:1000000001"}) {
    INFO(bad);
    CHECK_THROWS_WITH(keep_schedule(bad), Contains(fmt::format("is '{}': it must be log or every:N", bad)));
  }

  // Bounded in count and bytes, refused before anything is written.
  tasks::TrainOptions o = tasks::default_options("induction");
  o.keep_checkpoints = "every:1";
  o.steps = 999;
  check_options(o);  // 1,000 checkpoints of 0.05 MB
  o.steps = 1000;
  CHECK_THROWS_WITH(check_options(o), Contains("keeps 1001 checkpoints") && Contains("at most 1000 checkpoints"));
  o.keep_checkpoints = "every:1000";
  o.steps = 1'000'000'000;  // counted, not listed
  CHECK_THROWS_WITH(check_options(o), Contains("keeps 1000001 checkpoints"));
  o.steps = 2000;
  o.model.d_model = 1024;  // about 34 MB a checkpoint, 41 of them: past the bytes, not the count
  o.keep_checkpoints = "every:50";
  // The bytes of a checkpoint counted from a model built with these options, not from the estimate.
  std::size_t elements = 0;
  for (const auto& [name, tensor] : nn::Transformer(o.model).state_dict()) elements += tensor.numel();
  CHECK_THROWS_WITH(check_options(o), Contains(fmt::format("keeps 41 checkpoints of the model's weights, {:.1f} MB",
                                                           41.0 * double(elements) * 4 / 1e6)) &&
                                           Contains("at most 1000 checkpoints and 1074 MB"));
  try {
    check_options(o);
  } catch (const OptionError& e) {
    CHECK(e.field == "keep_checkpoints");
  }
}

TEST_CASE("kept checkpoints: a run keeps its weights at the schedule's steps, and a resumed run keeps the same bytes") {
  tasks::TrainOptions o = short_run("induction", "kept_whole", 60);
  o.keep_checkpoints = "every:25";
  std::ostringstream progress;
  train(o, progress, false);
  const auto kept = kept_checkpoints(o.out);
  REQUIRE(kept.size() == 4);
  CHECK(kept[0] == std::pair<std::size_t, std::string>{0, kept_checkpoint_path(o.out, 0)});
  CHECK(kept[1].first == 25);
  CHECK(kept[3].first == 60);
  // The last kept weights are the run's final model, with the step in the file's metadata.
  const nn::Safetensors last = nn::load_safetensors(kept[3].second);
  CHECK(last.metadata.at("step") == "60");
  const auto final_weights = nn::load_safetensors(o.out + "/model.safetensors").tensors;
  REQUIRE(last.tensors.size() == final_weights.size());
  for (std::size_t i = 0; i < last.tensors.size(); ++i) {
    INFO(last.tensors[i].first);
    CHECK(last.tensors[i].second.value<float>() == final_weights[i].second.value<float>());
  }
  CHECK(nn::load_safetensors(kept[0].second).tensors[0].second.value<float>() != final_weights[0].second.value<float>());
  CHECK(read_config(o.out).keep_checkpoints == "every:25");

  // Stopped at step 30 and resumed: the same files, byte for byte; what a keep that died left is
  // cleared, and a file of the user's in the folder is left alone.
  tasks::TrainOptions first = short_run("induction", "kept_resumed", 60);
  first.keep_checkpoints = "every:25";
  first.stop_after = 30;
  train(first, progress, false);
  CHECK(kept_checkpoints(first.out).size() == 2);
  nn::write_atomically(kept_checkpoint_path(first.out, 50) + ".tmp", "half a file");
  nn::write_atomically(first.out + "/checkpoints/notes.tmp", "mine");
  tasks::TrainOptions rest = read_config(first.out);
  rest.resume = true;
  train(rest, progress, false);
  CHECK_FALSE(std::filesystem::exists(kept_checkpoint_path(first.out, 50) + ".tmp"));
  CHECK(std::filesystem::exists(first.out + "/checkpoints/notes.tmp"));
  const auto resumed = kept_checkpoints(first.out);
  REQUIRE(resumed.size() == kept.size());
  for (std::size_t i = 0; i < kept.size(); ++i) {
    INFO("step " << kept[i].first);
    CHECK(resumed[i].first == kept[i].first);
    CHECK(nn::read_file(resumed[i].second, 1 << 24) == nn::read_file(kept[i].second, 1 << 24));
  }
  std::filesystem::remove_all(o.out);
  std::filesystem::remove_all(first.out);
}
