#include "tests/helpers.hpp"

#include <nlohmann/json.hpp>

#include "qkv/tasks/registry.hpp"
#include "qkv/training/options.hpp"
#include "qkv/training/run_options.hpp"

using namespace qkv;
using namespace qkv::test;
using namespace qkv::training;
using Catch::Matchers::Contains;
using Json = nlohmann::json;

namespace {

std::string option_error(const std::string& task, const Json& given, std::string* option = nullptr) {
  try {
    run_options(task, given);
  } catch (const RunOptionError& e) {
    if (option) *option = e.option;
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("run options by name: the task's defaults, then each option given, as text or as JSON") {
  const TrainOptions defaults = tasks::default_options("line", 0);
  const TrainOptions o = run_options("line", {{"n", 5},
                                             {"steps", "300"},
                                             {"d_model", 48},
                                             {"heads", 3},
                                             {"qk", "tied"},
                                             {"proj", "frozen"},
                                             {"no-scale", true},
                                             {"mlp", "true"},
                                             {"embeddings", "frozen"},
                                             {"attention", "causal,bidirectional"},
                                             {"lr", "0.002"},
                                             {"batch", 16},
                                             {"seed", "18446744073709551615"}});
  CHECK(o.task == "line");
  CHECK(o.n == 5);
  CHECK(o.steps == 300);
  CHECK(o.model.d_model == 48);
  CHECK(o.model.heads == 3);
  CHECK(o.model.qk == nn::QK::tied);
  CHECK(o.model.proj == nn::Projection::frozen);
  CHECK_FALSE(o.model.scale);
  CHECK(o.model.mlp);
  CHECK(o.model.frozen_embeddings);
  CHECK(o.model.causal_layers == std::vector<bool>{true, false});
  CHECK(o.lr == 0.002);
  CHECK(o.batch == 16);
  CHECK(o.seed == UINT64_MAX);
  CHECK(o.warmup == defaults.warmup);  // no option: the default stays
  CHECK(o.model.vocab_size == tasks::default_options("line", 5).model.vocab_size);

  // A flag given false is the flag not given; the same run as text or as numbers.
  const TrainOptions plain = run_options("line", {{"no-scale", false}, {"mlp", "false"}});
  CHECK(plain.model.scale);
  CHECK_FALSE(plain.model.mlp);
  CHECK(config_text(run_options("brackets", {{"steps", "40"}, {"lr", 0.01}})) ==
        config_text(run_options("brackets", {{"steps", 40}, {"lr", "0.01"}})));
  // A seq2seq task: --layers sets both sides unless --encoder-layers says otherwise; --max-len too.
  const TrainOptions r = run_options("reverse", {{"layers", 3}, {"max-len", 20}});
  CHECK(r.encoder_layers == 3);
  CHECK(r.model.layers == 3);
  CHECK(r.max_source_len == 20);
  CHECK(run_options("reverse", {{"layers", 3}, {"encoder-layers", 1}}).encoder_layers == 1);
}

TEST_CASE("run options refuse what qkv train refuses, naming the option") {
  std::string option;
  CHECK(option_error("brackets", {{"steps", 0}}, &option) == "must be a whole number from 1 to 1000000000, got '0'");
  CHECK(option == "steps");
  CHECK(option_error("brackets", {{"steps", -3}}) == "must be a whole number from 1 to 1000000000, got '-3'");
  CHECK(option_error("brackets", {{"steps", 2.5}}) == "must be a whole number from 1 to 1000000000, got '2.5'");
  CHECK(option_error("brackets", {{"steps", "1e3"}}) == "must be a whole number from 1 to 1000000000, got '1e3'");
  CHECK(option_error("brackets", {{"steps", true}}) == "must be a whole number from 1 to 1000000000, got 'true'");
  CHECK(option_error("brackets", {{"qk", "both"}}, &option) == "must be one of untied, tied, symmetric, got 'both'");
  CHECK(option == "qk");
  CHECK(option_error("brackets", {{"mlp", 1}}) == "must be true or false, got '1'");
  CHECK(option_error("brackets", {{"lr", "fast"}}) == "must be a number, got 'fast'");
  // A number out of range is check_options' to refuse, as for a run's config.json.
  CHECK_THROWS_AS(check_options(run_options("brackets", {{"lr", "inf"}})), OptionError);
  CHECK(option_error("brackets", {{"attention", "causal,"}}) == "'' is not causal or bidirectional");
  CHECK(option_error("brackets", {{"width", 3}}, &option) == "is not an option of qkv train");
  CHECK(option == "width");
  CHECK(option_error("brackets", {{"out", "x"}}) == "is not an option of qkv train");  // where, not what
  CHECK_THAT(option_error("brackets", {{"n", 4}}, &option), Contains("the brackets task takes no size"));
  CHECK(option == "n");
  CHECK(option_error("brackets", {{"encoder-layers", 2}}, &option) ==
        "is for seq2seq tasks; the brackets task trains a decoder-only model");
  CHECK(option_error("brackets", Json::array()) == "the options are array, not an object of names and values");
  // Underscores read as dashes; every option in the table is found by its name.
  for (const RunOption& o : run_option_table()) {
    REQUIRE(find_run_option(o.name) == &o);
    std::string underscored = o.name;
    std::replace(underscored.begin(), underscored.end(), '-', '_');
    CHECK(find_run_option(underscored) == &o);
  }
  CHECK(option_of_field("model.d_model") == "d-model");
  CHECK(option_of_field("warmup") == "warmup");
  CHECK(option_of_field("min_lr_ratio") == "min-lr-ratio");
  CHECK(option_of_field("model.vocab_size").empty());
}
