// qkv-bench: times training steps of a small attention model; bench/torch_bench.py is its
// PyTorch twin and bench/compare.py runs both. One step is zero_grad + forward + backward + Adam,
// float32, on one batch of random tokens and targets drawn with a fixed seed:
//   x = tok[ids] + pos,  L × { x = x + MHA(x) } (causal, biases on all four projections),
//   loss = cross_entropy(Linear(D, V)(x), targets)  (mean over all B·T positions).
// With --decode it times greedy generation instead: the same model with positions for a start
// token and `decode_tokens` more writes them one at a time from a random start token per
// sequence, with the KV cache (each step runs the new token against the cached keys and values)
// or without (each step runs the whole sequence so far).
//
//   qkv-bench --config tiny [--threads N] [--seconds S]  -> one JSON line
//   qkv-bench --decode --config small --batch 1 [--no-cache] [--threads N] [--seconds S]
//   qkv-bench --peak [--threads N] [--seconds S]         -> the machine's sgemm rate, one JSON line
//                                                           (and, on x86-64, its cores' FMA limit)
#include <cblas.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <xtensor/xview.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/config.hpp"
#include "qkv/core/ops.hpp"
#include "qkv/core/runtime.hpp"
#include "qkv/core/random.hpp"
#include "qkv/core/autograd.hpp"
#include "qkv/nn/attention.hpp"
#include "qkv/nn/generate.hpp"
#include "qkv/nn/layers.hpp"
#include "qkv/optim/adam.hpp"

namespace {

using namespace qkv;
using Clock = std::chrono::steady_clock;

class BenchModel : public nn::Module {
 public:
  BenchModel(const bench::Config& c, std::size_t positions, Generator& gen)
      : tok(c.V, c.D, DType::float32, gen), pos(positions, c.D, DType::float32, gen) {
    register_module("tok", tok);
    register_module("pos", pos);
    for (std::size_t l = 0; l < c.L; ++l) {
      nn::MultiHeadAttentionOptions o;
      o.d_model = c.D;
      o.n_heads = c.H;
      layers.push_back(std::make_unique<nn::MultiHeadAttention>(o, gen));
      register_module(fmt::format("layers.{}", l), *layers.back());
    }
    head = std::make_unique<nn::Linear>(c.D, c.V, true, DType::float32, gen);
    register_module("head", *head);
  }

  Tensor loss(const IndexArray& ids, const IndexArray& targets) const {
    nn::AttentionMask causal;
    causal.causal = true;
    Tensor x = pos(tok(ids));
    for (const auto& layer : layers) x = x + layer->forward(x, causal).output;
    return cross_entropy((*head)(x), targets);
  }

  // The logits (B, n, V) of tokens (B, n) at positions offset … offset + n − 1: with `caches` (one
  // per layer) against their keys and values, which they then also hold for these positions.
  Tensor logits(const IndexArray& ids, std::size_t offset, std::vector<nn::KVCache>* caches) const {
    nn::AttentionMask causal;
    causal.causal = true;
    const auto n = std::int64_t(ids.shape()[1]);
    Tensor x = tok(ids) + slice(pos.weight, 0, std::int64_t(offset), std::int64_t(offset) + n);
    for (std::size_t l = 0; l < layers.size(); ++l)
      x = x + layers[l]->forward(x, causal, false, caches ? &(*caches)[l] : nullptr).output;
    return (*head)(x);
  }

  nn::Embedding tok;
  nn::LearnedPositionalEncoding pos;
  std::vector<std::unique_ptr<nn::MultiHeadAttention>> layers;
  std::unique_ptr<nn::Linear> head;
};

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs `step` for about `warmup` seconds untimed, then for `seconds`; returns steps and time.
template <class Step>
std::pair<std::size_t, double> timed(Step&& step, double warmup, double seconds) {
  for (auto t0 = Clock::now(); seconds_since(t0) < warmup;) step();
  std::size_t steps = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds || steps < 3) {
    step();
    ++steps;
    elapsed = seconds_since(t0);
  }
  return {steps, elapsed};
}

nlohmann::ordered_json run_config(const bench::Config& c, std::size_t threads, double seconds) {
  const double base_rss = peak_rss_mb();
  Generator gen(0);
  BenchModel model(c, c.T, gen);
  IndexArray ids = IndexArray::from_shape({c.B, c.T}), targets = IndexArray::from_shape({c.B, c.T});
  for (auto& i : ids) i = std::int64_t(gen.next_u64() % c.V);
  for (auto& t : targets) t = std::int64_t(gen.next_u64() % c.V);
  optim::Adam adam(model.parameters(), optim::AdamOptions{});
  std::size_t params = 0;
  for (const Tensor& p : model.parameters()) params += p.numel();
  double last_loss = 0;
  auto step = [&] {
    adam.zero_grad();
    const Tensor loss = model.loss(ids, targets);
    loss.backward();
    adam.step();
    last_loss = loss.item();
  };
  const auto [steps, elapsed] = timed(step, std::min(1.0, seconds / 4), seconds);
  const double per_step = elapsed / double(steps);
  nlohmann::ordered_json out;
  out["impl"] = "qkv";
  out["config"] = c.name;
  out["length"] = c.T;
  out["batch"] = c.B;
  out["threads"] = threads;
  out["steps_per_s"] = 1.0 / per_step;
  out["ms_per_step"] = 1e3 * per_step;
  out["params"] = params;
  out["gflops"] = bench::step_flops(c) / per_step / 1e9;
  out["peak_rss_mb"] = peak_rss_mb();
  out["steps"] = steps;
  out["loss"] = last_loss;
  out["base_rss_mb"] = base_rss;  // before the model was built
  out["blas"] = blas_kernels();
  return out;
}

// Greedy generation of bench::decode_tokens tokens after a start token, for `batch` sequences at once.
nlohmann::ordered_json run_decode(const bench::Config& c, std::size_t batch, bool use_cache, std::size_t threads,
                                  double seconds) {
  const double base_rss = peak_rss_mb();
  Generator gen(0);
  const std::size_t count = bench::decode_tokens;
  const BenchModel model(c, count + 1, gen);
  IndexArray start = IndexArray::from_shape({batch, 1});
  for (auto& t : start) t = std::int64_t(gen.next_u64() % c.V);
  NoGradGuard no_grad;
  auto generate = [&] {
    IndexArray seq = IndexArray::from_shape({batch, count + 1});
    xt::view(seq, xt::all(), 0) = xt::view(start, xt::all(), 0);
    std::vector<nn::KVCache> caches(c.L);
    for (std::size_t t = 0; t < count; ++t) {
      // With the cache: the newest token alone; without: the whole sequence, of which the last
      // position's logits are the next token's.
      const IndexArray ids = use_cache ? IndexArray(xt::view(seq, xt::all(), xt::range(t, t + 1)))
                                       : IndexArray(xt::view(seq, xt::all(), xt::range(0, t + 1)));
      const Tensor all = model.logits(ids, use_cache ? t : 0, use_cache ? &caches : nullptr);
      const std::int64_t n = std::int64_t(ids.shape()[1]);
      const Tensor last = reshape(slice(all, 1, n - 1, n), {std::int64_t(batch), std::int64_t(c.V)});
      xt::view(seq, xt::all(), t + 1) = xt::view(nn::next_tokens(last, {}, gen), xt::all(), 0);
    }
  };
  const auto [runs, elapsed] = timed(generate, std::min(1.0, seconds / 4), seconds);
  std::size_t params = 0;
  for (const Tensor& p : model.parameters()) params += p.numel();
  nlohmann::ordered_json out;
  out["impl"] = "qkv";
  out["config"] = c.name;
  out["batch"] = batch;
  out["cache"] = use_cache;
  out["threads"] = threads;
  out["tokens_per_s"] = double(runs * batch * count) / elapsed;
  out["ms_per_token"] = 1e3 * elapsed / double(runs * count);  // per step of the batch
  out["params"] = params;
  out["peak_rss_mb"] = peak_rss_mb();
  out["runs"] = runs;
  out["base_rss_mb"] = base_rss;
  out["blas"] = blas_kernels();
  return out;
}

#if defined(__x86_64__)
// `rounds` rounds of 12 independent fused multiply-adds on 512-bit (zmm) or 256-bit (ymm)
// registers, nothing loaded or stored: 12 chains hide the FMA latency on two pipes, so the time is
// the core's arithmetic limit. In assembly, so that no compiler spills an accumulator; vzeroall
// starts every register at zero (no denormals, whatever was left in them), and vzeroupper at the
// end spares the SSE code after it the penalty for dirty upper halves.
#define QKV_FMA(a) "vfmadd231ps %%" REG "14, %%" REG "15, %%" REG #a "\n\t"
#define QKV_FMA_ROUNDS                                                                                      \
  asm volatile("vzeroall\n1:\n\t" QKV_FMA(0) QKV_FMA(1) QKV_FMA(2) QKV_FMA(3) QKV_FMA(4) QKV_FMA(5) QKV_FMA(6) \
               QKV_FMA(7) QKV_FMA(8) QKV_FMA(9) QKV_FMA(10) QKV_FMA(11) "dec %0\n\tjnz 1b\n\tvzeroupper"      \
               : "+r"(rounds)                                                                               \
               :                                                                                            \
               : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",      \
                 "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc")

void fma_rounds_zmm(long rounds) {
#define REG "zmm"
  QKV_FMA_ROUNDS;
#undef REG
}
void fma_rounds_ymm(long rounds) {
#define REG "ymm"
  QKV_FMA_ROUNDS;
#undef REG
}
#undef QKV_FMA_ROUNDS
#undef QKV_FMA

// The float32 FLOP rate of `threads` cores each running FMAs of the widest vectors they have, all
// started at once: the FLOPs of all over the time from the common start to the last to finish,
// the best of three tries of about `seconds` / 3 (a virtual CPU is now and then held up by its
// host). 0 where the CPU has no FMA.
double fma_limit(std::size_t threads, double seconds) {
  const bool zmm = __builtin_cpu_supports("avx512f"), ymm = __builtin_cpu_supports("fma");
  if (!zmm && !ymm) return 0;
  const auto run = zmm ? fma_rounds_zmm : fma_rounds_ymm;
  const double flops_per_round = 12.0 * (zmm ? 16 : 8) * 2;
  const auto t0 = Clock::now();
  run(1'000'000);
  const long rounds = std::max(1L, long(1e6 * seconds / 3 / std::max(seconds_since(t0), 1e-6)));
  double best = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::latch ready(std::ptrdiff_t(threads) + 1), go(1);
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < threads; ++t)
      workers.emplace_back([&] {
        ready.count_down();
        go.wait();
        run(rounds);
      });
    ready.arrive_and_wait();
    const auto start = Clock::now();
    go.count_down();
    for (std::thread& w : workers) w.join();
    best = std::max(best, flops_per_round * double(rounds) * double(threads) / seconds_since(start) / 1e9);
  }
  return best;
}
#else
double fma_limit(std::size_t, double) { return 0; }
#endif

// The best sgemm rate over square sizes, with OpenBLAS's own `threads` threads; and on x86-64 the
// rate the cores' FMA units allow, which no product exceeds.
nlohmann::ordered_json run_peak(std::size_t threads, double seconds) {
  // First, while no OpenBLAS thread is spinning after a product.
  const double fma = fma_limit(threads, std::min(1.0, seconds / 4));
  openblas_set_num_threads(int(threads));
  nlohmann::ordered_json out;
  out["impl"] = "sgemm";
  out["threads"] = threads;
  double best = 0;
  for (const int n : {512, 1024, 2048}) {
    std::vector<float> a(std::size_t(n) * n, 0.5f), b(std::size_t(n) * n, 0.25f), c(std::size_t(n) * n, 0.0f);
    auto gemm = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    };
    const auto [calls, elapsed] = timed(gemm, 0.2, seconds / 3);
    const double gflops = 2.0 * n * n * double(n) * double(calls) / elapsed / 1e9;
    out["gflops_n" + std::to_string(n)] = gflops;
    best = std::max(best, gflops);
  }
  out["gflops"] = best;
  if (fma > 0) out["fma_gflops"] = fma;
  out["blas"] = blas_kernels();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  qkv::use_fastest_blas_kernels();
  qkv::reuse_freed_memory();
  CLI::App app{"qkv-bench: training-step speed of a small attention model"};
  std::string config;
  std::size_t threads = 1;
  double seconds = 10;
  bool peak = false, decode = false, no_cache = false;
  std::size_t batch = 0, length = 0;  // 0: the config's (training), 1 (decoding)
  app.add_option("--config", config, "tiny, small, medium, long, longer or wide")->check(CLI::IsMember(bench::config_names()));
  app.add_flag("--decode", decode, "time greedy generation of 256 tokens instead of training steps");
  app.add_option("--batch", batch, "sequences a training step takes (default: the config's), or generated at once (--decode; default 1)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--length", length, "sequence length of a training step, instead of the config's")
      ->check(CLI::Range(1, 1 << 16));
  app.add_flag("--no-cache", no_cache, "run the whole sequence at every step (--decode)");
  app.add_option("--threads", threads, "threads for BLAS and qkv's own work")->check(CLI::Range(1, 256));
  app.add_option("--seconds", seconds, "how long to time steps for, after a warm-up")->check(CLI::Range(0.1, 3600.0));
  app.add_flag("--peak", peak, "measure the machine's sgemm rate (and on x86-64 its FMA limit) instead");
  try {
    app.parse(argc, argv);
    if (peak == !config.empty()) throw CLI::ValidationError("--config", "give one of --config NAME and --peak");
    if (decode && length) throw CLI::ValidationError("--length", "is for training steps; --decode generates 256 tokens");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    qkv::set_num_threads(threads);
    bench::Config c = peak ? bench::Config{} : bench::config(config);
    if (length) c.T = length;
    if (batch && !decode) c.B = batch;
    const auto out = peak     ? run_peak(threads, seconds)
                     : decode ? run_decode(c, batch ? batch : 1, !no_cache, threads, seconds)
                              : run_config(c, threads, seconds);
    fmt::print("{}\n", out.dump());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "qkv-bench: {}\n", e.what());
    return 1;
  }
}
