// qkv sweep FILE [--out DIR] [-j N] [--list] [--index I --of N] [--collect [--partial]]
//   [--slurm [--per-task K] [--throttle P] [--sbatch LINE] [--submit]]: a grid of runs
// (sweep/sweep.hpp) on every core, a slice of it on one worker of many, or a Slurm job array.
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "examples/cli/command.hpp"
#include "qkv/sweep/sweep.hpp"
#include "qkv/training/trainer.hpp"

#ifdef QKV_MPI
#include <mpi.h>
#endif

extern char** environ;

namespace qkv::cli {

namespace {

struct SweepArgs {
  std::string file, out;
  std::uint64_t jobs = default_jobs();
  std::uint64_t index = 0, of = 1;
  bool list = false, collect = false, partial = false;
  bool slurm = false, submit = false;
  std::uint64_t per_task = 1, throttle = 0;
  std::vector<std::string> sbatch;
};

// The path of this program, for the job array's tasks to run.
std::string this_program() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) throw std::runtime_error("sweep: cannot find the qkv program's path (/proc/self/exe) for the job script");
  return self.string();
}

// Writes DIR/sweep.sbatch, and with --submit hands it to sbatch.
int write_slurm(const sweep::Sweep& s, const std::string& out, const SweepArgs& a) {
  const std::string script = sweep::write_slurm_script(
      s, {.out = out, .program = this_program(), .per_task = std::size_t(a.per_task), .throttle = std::size_t(a.throttle),
          .sbatch = a.sbatch});
  fmt::print("wrote {}: {} runs, {} a task\n", script, s.runs.size(), a.per_task);
  if (!a.submit) {
    fmt::print("submit it with: sbatch {}\n", script);
    return 0;
  }
  std::fflush(stdout);
  const char* argv[] = {"sbatch", script.c_str(), nullptr};
  pid_t pid = 0;
  if (::posix_spawnp(&pid, "sbatch", nullptr, nullptr, const_cast<char* const*>(argv), environ) != 0)
    throw std::runtime_error("sbatch: cannot run it (is Slurm installed here?)");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(fmt::format("sbatch {} failed (exit {})", script, WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  fmt::print("once it has ended: qkv sweep {} --out {} --collect\n", a.file, out);
  return 0;
}

// Merges the results, prints the summary, and says what failed (exit 1) or is missing.
int collect_and_show(const sweep::Sweep& s, const std::string& out, bool partial) {
  const sweep::Collected c = sweep::collect(s, out, partial);
  fmt::print("{}\n", c.summary);
  fmt::print("{} runs merged into {}/results.jsonl, results.csv and summary.md", c.results.size(), out);
  if (!c.missing.empty()) fmt::print("; {} runs have no result yet", c.missing.size());
  fmt::print("\n");
  if (c.failed > 0) {
    fmt::print(stderr, "qkv: {} of {} runs failed: their errors are in {}/results.jsonl\n", c.failed, c.results.size(), out);
    return 1;
  }
  return 0;
}

// The ranks of an MPI job (`mpirun -n N qkv sweep ...`): each runs its slice of the runs (one at
// a time: the ranks are the parallelism), and rank 0, once all have ended, merges the results.
// Started without mpirun, or built without MPI, there is one rank.
class MpiWorld {
 public:
  MpiWorld() {
#ifdef QKV_MPI
    for (const char* launched : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
      if (std::getenv(launched)) {
        MPI_Init(nullptr, nullptr);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
        active_ = true;
        break;
      }
#endif
  }
  ~MpiWorld() {
#ifdef QKV_MPI
    if (active_) MPI_Finalize();
#endif
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Waits for every rank; the number of failed runs summed over them.
  std::size_t all_done(std::size_t failed) const {
#ifdef QKV_MPI
    unsigned long mine = failed, total = 0;
    if (active_) MPI_Allreduce(&mine, &total, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
    return active_ ? total : failed;
#else
    return failed;
#endif
  }
  void barrier() const {
#ifdef QKV_MPI
    if (active_) MPI_Barrier(MPI_COMM_WORLD);
#endif
  }
  bool active() const { return active_; }
  // Ends every rank: one that fails alone would leave the others waiting for it.
  [[noreturn]] void abort(const std::string& why, int code) const {
    fmt::print(stderr, "qkv: rank {}: {}\n", rank_, why);
#ifdef QKV_MPI
    if (active_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    std::exit(code);
  }

 private:
  int rank_ = 0, size_ = 1;
  bool active_ = false;
};

// A sweep on the ranks of an MPI job: rank 0 prepares the folder, each rank runs its slice, rank 0
// merges.
// Any error, or a signal, on one rank ends them all (MPI_Abort).
int run_ranks(const sweep::Sweep& s, const std::string& out, const MpiWorld& world) {
  sweep::WorkerReport r;
  try {
    if (world.rank() == 0) sweep::prepare_folder(s, out);
    world.barrier();
    r = sweep::run_workers(s, {.out = out, .jobs = 1, .index = std::size_t(world.rank()), .of = std::size_t(world.size())},
                           std::cerr);
  } catch (const training::Interrupted& e) {
    world.abort(e.what(), 128 + e.signal);
  } catch (const training::UsageError& e) {
    world.abort(e.what(), 2);
  } catch (const std::exception& e) {
    world.abort(fmt::format("error: {}", e.what()), 1);
  }
  const std::size_t failed = world.all_done(r.failed);
  if (world.rank() != 0) return failed > 0 ? 1 : 0;
  return collect_and_show(s, out, false);
}

int run_sweep(const SweepArgs& a) {
  if (a.index >= a.of) usage("--index", "must be below --of ({}), got {}", a.of, a.index);
  const sweep::Sweep s = sweep::read_sweep(a.file);
  if (a.list) {
    for (const sweep::Run& run : s.runs) fmt::print("{}\n", run.id);
    return 0;
  }
  const std::string out = a.out.empty() ? "runs/sweep-" + std::filesystem::path(a.file).stem().string() : a.out;
  if (a.collect) return collect_and_show(s, out, a.partial);
  if (a.slurm) return write_slurm(s, out, a);
  const MpiWorld world;
  if (world.active()) {  // one rank a process (fork after MPI_Init is not safe)
    if (a.of > 1) usage("--index", "an MPI job slices the runs by rank: drop --index and --of");
    fmt::print(stderr, "{} runs in {}; MPI rank {} of {}\n", s.runs.size(), out, world.rank(), world.size());
    return run_ranks(s, out, world);
  }
  fmt::print(stderr, "{} runs in {}; {} worker process{}{}\n", s.runs.size(), out, a.jobs, a.jobs == 1 ? "" : "es",
             a.of > 1 ? fmt::format(", slice {} of {}", a.index, a.of) : "");
  const sweep::WorkerReport r =
      sweep::run_workers(s, {.out = out, .jobs = std::size_t(a.jobs), .index = std::size_t(a.index), .of = std::size_t(a.of)},
                         std::cerr);
  if (a.of > 1) {  // one worker of many: the results are merged by --collect once all are done
    fmt::print("{}\n", nlohmann::json({{"slice", a.index}, {"of", a.of}, {"ran", r.ran}, {"failed", r.failed},
                                        {"finished", r.finished}, {"busy", r.busy}})
                           .dump());
    return r.failed > 0 ? 1 : 0;
  }
  if (r.busy > 0) {  // other workers hold some runs: the results are merged once they are done
    fmt::print(stderr, "qkv: {} runs are held by other workers; once they are done: qkv sweep {} --out {} --collect\n",
               r.busy, a.file, out);
    return 1;
  }
  return collect_and_show(s, out, false);
}

}  // namespace

void add_sweep(CLI::App& app, Command& run) {
  auto a = std::make_shared<SweepArgs>();
  auto* sub = app.add_subcommand("sweep", "Run a grid of runs from a sweep file, on every core or a slice of a cluster's workers");
  sub->add_option("FILE", a->file, "Sweep file: {\"tasks\": [...], \"grid\": {option: [values]}, \"fixed\": {option: "
                                   "value}, \"seeds\": {\"start\": S, \"count\": K}}")
      ->required();
  sub->add_option("--out", a->out, "Folder of the runs and results (default runs/sweep-NAME, NAME the file's)");
  add_jobs_option(*sub, a->jobs);
  sub->add_flag("--list", a->list, "Print the run ids, one a line, and run nothing");
  auto* index = sub->add_option("--index", a->index, "Run the I-th slice of --of (from 0): runs I, I + N, ...")->check(whole(0, 1'000'000));
  auto* of = sub->add_option("--of", a->of, "Slices the runs are cut into")->check(whole(1, 1'000'000));
  index->needs(of);
  of->needs(index);
  auto* collect = sub->add_flag("--collect", a->collect, "Merge the results in --out (naming runs without one), and run nothing");
  sub->add_flag("--partial", a->partial, "With --collect: merge the results there are")->needs(collect);
  auto* slurm = sub->add_flag("--slurm", a->slurm, "Write DIR/sweep.sbatch, a Slurm job array of the runs, and run nothing");
  sub->add_option("--per-task", a->per_task, "With --slurm: runs a task of the array runs, one after another")
      ->check(whole(1, sweep::max_runs))
      ->needs(slurm);
  sub->add_option("--throttle", a->throttle, "With --slurm: at most N tasks of the array at once (--array=...%N)")
      ->check(whole(1, 1'000'000))
      ->needs(slurm);
  sub->add_option("--sbatch", a->sbatch, "With --slurm: an #SBATCH line's options, e.g. --sbatch=--partition=short (repeatable)")
      ->needs(slurm);
  sub->add_flag("--submit", a->submit, "With --slurm: hand the script to sbatch")->needs(slurm);
  sub->callback([&run, a] { run = [a] { return run_sweep(*a); }; });
}

}  // namespace qkv::cli
