// A task of your own, trained, saved, loaded and inspected through the library alone.
//
// The task: a food chain, orca > seal > salmon > herring > krill > algae. Each sequence holds the
// six in a random order, each animal with a random tag 0-3 (token = 4 · animal + tag); at every
// position the model must name the tag of what that animal eats (algae eats nothing and is not
// scored). The tag is only at the prey's position, so the answer needs attention, and "eats" is a
// directed relation: the orca's query must find the seal's key, while the seal must not find the
// orca. One bidirectional attention layer learns it; its token table (the score each query token
// gives each key token) shows the direction.
//
//   custom_task [RUN_FOLDER]     (default: a new folder under the system's temporary directory)
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <variant>

#include <qkv/core/autograd.hpp>
#include <qkv/core/runtime.hpp>
#include <qkv/nn/checkpoint.hpp>
#include <qkv/nn/files.hpp>
#include <qkv/nn/transformer.hpp>
#include <qkv/optim/adam.hpp>
#include <qkv/report/inspect.hpp>
#include <qkv/tasks/dataset.hpp>
#include <qkv/training/run_analysis.hpp>
#include <xtensor/xview.hpp>

using namespace qkv;

constexpr std::int64_t n = 6, tags = 4;
const char* const animals[n] = {"orca", "seal", "salmon", "herring", "krill", "algae"};

// tokens (B, 6): a shuffle of the six animals, each tagged; targets (B, 6): the prey's tag, -100
// for algae.
std::pair<IndexArray, IndexArray> sample(std::size_t batch, Generator& gen) {
  IndexArray tokens = IndexArray::from_shape({batch, std::size_t(n)}), targets = tokens;
  for (std::size_t b = 0; b < batch; ++b) {
    std::int64_t animal[n] = {0, 1, 2, 3, 4, 5}, tag[n];
    for (std::int64_t i = n - 1; i > 0; --i) std::swap(animal[i], animal[gen.next_u64() % std::uint64_t(i + 1)]);
    for (std::int64_t a = 0; a < n; ++a) tag[a] = std::int64_t(gen.next_u64() % tags);
    for (std::int64_t t = 0; t < n; ++t) {
      tokens(b, t) = tags * animal[t] + tag[animal[t]];
      targets(b, t) = animal[t] + 1 < n ? tag[animal[t] + 1] : -100;
    }
  }
  return {tokens, targets};
}

// The same animals with fresh tags: every answer changes, so a head that carries the prey's tag
// carries the change (activation patching, qkv ablate).
IndexArray retag(const IndexArray& tokens, Generator& gen) {
  IndexArray out = tokens;
  for (std::int64_t& t : out) t = tags * (t / tags) + std::int64_t(gen.next_u64() % tags);
  return out;
}

double accuracy(const nn::Transformer& model, const IndexArray& tokens, const IndexArray& targets) {
  NoGradGuard no_grad;
  const IndexArray predicted = nn::Transformer::predictions(model.forward(tokens).logits);
  double right = 0, scored = 0;
  for (std::size_t i = 0; i < targets.size(); ++i)
    if (targets.data()[i] >= 0) scored += 1, right += predicted.data()[i] == targets.data()[i];
  return right / scored;
}

int main(int argc, char** argv) {
  use_fastest_blas_kernels();
  const std::string dir = argc > 1 ? argv[1]
                                   : (std::filesystem::temp_directory_path() /
                                      ("qkv_custom_task_" + std::to_string(::getpid()))).string();
  if (std::filesystem::exists(dir + "/config.json")) {  // a run is never overwritten
    std::fprintf(stderr, "custom_task: %s holds a run already; give a new folder\n", dir.c_str());
    return 2;
  }
  const nn::TransformerConfig config{.vocab_size = n * tags, .n_classes = tags, .max_len = n, .causal = false,
                                     .layers = 1, .d_model = 16, .heads = 1};
  Generator gen(0);
  nn::Transformer model(config, gen);
  optim::Adam adam(model.parameters(), {.lr = 1e-2});
  for (std::size_t step = 1; step <= 400; ++step) {
    const auto [tokens, targets] = sample(32, gen);
    adam.zero_grad();
    const Tensor loss = model.loss(model.forward(tokens), targets);
    loss.backward();
    adam.step();
    if (step % 100 == 0) std::printf("step %3zu  loss %.4f\n", step, loss.item());
  }

  // A run folder: config.json with a name for each token ("orca0" … "algae3") and a committed
  // checkpoint; then the model as a user would load it.
  std::vector<std::string> names;
  for (const char* animal : animals)
    for (std::int64_t tag = 0; tag < tags; ++tag) names.push_back(animal + std::to_string(tag));
  std::filesystem::create_directories(dir);
  {
    nn::RunLock lock(dir);
    training::save_model_config(dir, config, names);
    nn::save_checkpoint(dir, model, adam.state_dict(), {.step = 400});
  }
  const auto loaded = nn::load_transformer(dir);
  Generator held_out(12345);
  const auto [tokens, targets] = sample(256, held_out);
  const double acc = accuracy(*loaded, tokens, targets);
  std::printf("saved to %s; loaded back: held-out accuracy %.17g\n", dir.c_str(), acc);
  // The held-out sequences as a data file, with a corrupted copy of each: `qkv eval DIR --data FILE`
  // scores the run on them, and `qkv ablate DIR --data FILE` takes its head away and patches it.
  tasks::write_dataset(dir + "/held_out.jsonl", {{.tokens = tokens, .targets = targets}}, {retag(tokens, held_out)});
  std::printf("wrote held_out.jsonl, for qkv eval %s --data %s/held_out.jsonl\n", dir.c_str(), dir.c_str());

  // What `qkv inspect DIR --input TEXT` shows, by its calls: the report as text (uncoloured, as in a
  // file), JSON and the HTML page (which draws the run's training, here none).
  const char* const text = "seal2 orca1 krill0 algae3 salmon1 herring2";
  const training::RunInfo run = training::open_run(dir);
  const std::vector<std::int64_t> input = training::parse_input(run, text);
  const auto in = std::get<analysis::Inspection>(training::inspect_run(run, input, false));
  std::ostringstream report;
  report::print_report(report, in, false);
  nn::write_atomically(dir + "/report.txt", report.str());
  nn::write_atomically(dir + "/report.json", report::to_json(in).dump() + "\n");
  nn::write_atomically(dir + "/report.html", report::to_html(std::get<analysis::Inspection>(training::inspect_run(run, input, true))));
  std::printf("wrote report.txt, report.json and report.html, as qkv inspect %s --input \"%s\" shows them\n", dir.c_str(),
              text);

  // The token table of the head (the scores of a stream that holds one token's embedding, after
  // the layer's LayerNorm), averaged over the tags: row = query animal, column = key animal. Its
  // largest entry per row is the prey; the reverse entry (the prey asking for its predator) is low.
  const analysis::HeadInspection& head = in.layers[0][0];
  Array<double> table = xt::zeros<double>({n, n});
  for (std::int64_t i = 0; i < n * tags; ++i)
    for (std::int64_t j = 0; j < n * tags; ++j) table(i / tags, j / tags) += head.token_qk(i, j) / (tags * tags);
  std::printf("%-8s %-8s %8s %8s\n", "query", "top key", "score", "reverse");
  for (std::int64_t a = 0; a + 1 < n; ++a) {
    const auto row = xt::view(table, a, xt::all());
    const auto top = std::int64_t(std::max_element(row.begin(), row.end()) - row.begin());
    std::printf("%-8s %-8s %8.2f %8.2f\n", animals[a], animals[top], table(a, top), table(top, a));
  }
  std::printf("QK circuit: symmetric share sigma %.3f (1 for a symmetric, tied head)\n", head.sigma);
  return acc > 0.99 ? 0 : 1;
}
