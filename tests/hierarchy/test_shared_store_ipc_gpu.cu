// A host store shared by hierarchies in two processes (issue 19 item 2, one process per
// GPU): this process creates the store by name (`shared_host_store::create`) and is its
// writer; it starts its own executable again as the reader (the hidden test case
// "[.ipc_reader]", told the store's name and the workload's seed through the environment),
// which opens the store by name and runs the hand-off of tests/hierarchy/handoff.cuh on its
// own: every step it waits with `wait_host(stream)` for the writer's backup of that step
// (the count in the segment, then the writer's interprocess event). The host pages of
// positions not yet committed are poisoned and the writer is delayed 2 ms twice per step,
// so a reader that fetched a row before the writer's copy of it logs wrong bytes.
//
// Also: the page lists live in the segment (both processes hold the request, its pages
// come back once both released it), a second writer in the other process is refused, a
// reader expecting another shape is refused naming both. The negative control
// ("[ipc-handoff-control]", run explicitly) has the reader wait for an event of its own
// stream instead: it must see wrong rows.
#include "handoff.cuh"
#include "random.hpp"

#include <dhisparse/shared_host_store.cuh>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

using namespace dhisparse;
namespace handoff = dhisparse::test::handoff;

namespace {

constexpr int steps = 24;

std::string env(char const* name)
{
  char const* v = std::getenv(name);
  return v == nullptr ? std::string{} : std::string(v);
}

/// This executable run again with `args`, with `vars` added to the environment, its output
/// in `log`. Returns the child's pid.
pid_t spawn_self(std::vector<std::string> const& args, std::vector<std::string> const& vars, std::string const& log)
{
  std::vector<std::string> arg_strings{"/proc/self/exe"};
  arg_strings.insert(arg_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : arg_strings) { argv.push_back(a.data()); }
  argv.push_back(nullptr);
  std::vector<std::string> env_strings(vars);
  for (char** e = environ; *e != nullptr; ++e) { env_strings.emplace_back(*e); }
  std::vector<char*> envp;
  for (auto& e : env_strings) { envp.push_back(e.data()); }
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid    = 0;
  int const rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  return pid;
}

/// Waits (at most `limit`) for `pid`; its exit status, -1 when it did not end in time (then
/// it is killed), -2 when it cannot be waited for.
int wait_for(pid_t pid, std::chrono::seconds limit)
{
  auto const end = std::chrono::steady_clock::now() + limit;
  int status     = 0;
  pid_t done     = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (done != pid) { return -2; }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string slurp(std::string const& path)
{
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The writer's side: creates the store, writes the prefill, starts the reader, steps, and
/// returns the reader's output (its exit status in `*status`).
std::string run_writer(bool control, int* status)
{
  std::uint64_t const salt = test::seeded_engine("shared store ipc handoff")();
  handoff::workload const w(salt, steps);
  std::string const name = "test.ipc." + std::to_string(::getpid()) + "." + std::to_string(salt % 100000);
  hierarchy_config base  = handoff::config(0);
  auto const store       = shared_host_store::create(name, base, handoff::Row::bytes);
  REQUIRE(store->cross_process());
  REQUIRE(store->free_pages() == base.host.capacity_pages);
  hierarchy_config wc   = base;
  wc.host               = store->config();
  wc.shared_host        = store;
  wc.shared_host_writer = true;
  std::string const log = "/tmp/dhisparse_ipc_reader." + std::to_string(::getpid()) + ".log";
  std::string out;
  {
    handoff::rank writer(wc, w);
    writer.admit(w, true);  // the prefill is written before the reader starts
    pid_t const reader = spawn_self({"[.ipc_reader]"},
                                    {"DHISPARSE_IPC_STORE=" + name, "DHISPARSE_IPC_SALT=" + std::to_string(salt),
                                     std::string("DHISPARSE_IPC_CONTROL=") + (control ? "1" : "0")},
                                    log);
    // Steps start once the reader holds the request too; the writer's host pauses before
    // every step, so a reader that does not wait for the writer's backups runs ahead of
    // them (and its stream is not delayed by the writer's, which belongs to another process).
    auto const ready_by = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    auto const reader_running = [&] {  // without reaping it
      siginfo_t info{};
      return ::waitid(P_PID, id_t(reader), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
    };
    while (store->holders(request_id{handoff::id}) < 2 && std::chrono::steady_clock::now() < ready_by &&
           reader_running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (int t = 0; t < steps; ++t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      writer.writer_step(t);
    }
    writer.check_counters(false, steps);
    REQUIRE(writer.wrong_rows(w) == 0);
    *status = wait_for(reader, std::chrono::seconds(240));  // the writer outlives the reader's waits
    out     = slurp(log);
    std::remove(log.c_str());
    INFO(out);
    // The reader let go of the request: the writer is its last holder.
    REQUIRE(store->holders(request_id{handoff::id}) == 1);
  }
  REQUIRE(store->holders(request_id{handoff::id}) == 0);
  REQUIRE(store->free_pages() == base.host.capacity_pages);
  return out;
}

}  // namespace

TEST_CASE("a reader in another process fetches a row only after the writer's backup of it",
          "[hierarchy][gpu][multi][ipc]")
{
  int status            = 0;
  std::string const out = run_writer(false, &status);
  INFO("reader output:\n" << out);
  REQUIRE(status == 0);
  REQUIRE(out.find("ipc reader: 0 wrong rows") != std::string::npos);
  REQUIRE(out.find("All tests passed") != std::string::npos);
}

// The negative control (run explicitly: `test_shared_store_ipc_gpu "[ipc-handoff-control]"`):
// a reader that waits for an event of its own stream does fetch rows the writer has not
// backed up yet, so the test above can see a missing wait across processes.
TEST_CASE("across processes, without the writer's event the reader sees unwritten rows", "[.][ipc-handoff-control]")
{
  int status            = 0;
  std::string const out = run_writer(true, &status);
  INFO("reader output:\n" << out);
  REQUIRE(status == 0);
  auto const at = out.find("ipc reader: ");
  REQUIRE(at != std::string::npos);
  int const wrong = std::atoi(out.c_str() + at + 12);
  WARN("reader rows that differ from the truth without the wait: " << wrong);
  REQUIRE(wrong > 0);
}

// The reader process (started by the tests above; does nothing when run by hand).
TEST_CASE("ipc reader", "[.ipc_reader]")
{
  std::string const name = env("DHISPARSE_IPC_STORE");
  if (name.empty()) {
    WARN("started without DHISPARSE_IPC_STORE: nothing to do");
    return;
  }
  bool const control       = env("DHISPARSE_IPC_CONTROL") == "1";
  std::uint64_t const salt = std::strtoull(env("DHISPARSE_IPC_SALT").c_str(), nullptr, 10);
  handoff::workload const w(salt, steps);
  hierarchy_config base = handoff::config(0);

  // Another shape is refused, naming both shapes; then the right one opens.
  hierarchy_config other = base;
  other.max_context      = 2048;
  REQUIRE_THROWS_WITH(shared_host_store::open(name, other, handoff::Row::bytes, std::chrono::seconds(10)),
                      Catch::Contains("max_context 1024") && Catch::Contains("max_context 2048"));
  auto const store = shared_host_store::open(name, base, handoff::Row::bytes, std::chrono::seconds(30));
  REQUIRE(store->cross_process());
  REQUIRE(store->holders(request_id{handoff::id}) == 1);  // the writer's admission, seen here

  hierarchy_config rc = base;
  rc.host             = store->config();
  rc.shared_host      = store;
  {  // the writer lives in the other process: a second one is refused
    hierarchy_config second   = rc;
    second.shared_host_writer = true;
    REQUIRE_THROWS_WITH(handoff::hierarchy(second, nullptr), Catch::Contains("writer"));
  }
  handoff::rank reader(rc, w);
  reader.admit(w, false);
  REQUIRE(store->holders(request_id{handoff::id}) == 2);

  cudaEvent_t own = nullptr;  // the control's wrong event
  DHISPARSE_CUDA_TRY(cudaEventCreateWithFlags(&own, cudaEventDisableTiming));
  for (int t = 0; t < steps; ++t) {
    reader.step(t);
    if (control) {
      DHISPARSE_CUDA_TRY(cudaEventRecord(own, reader.stream.s));
      reader.h->wait_host(own, reader.stream.s);
    } else {
      reader.h->wait_host(reader.stream.s, std::chrono::seconds(60));
    }
    reader.reader_finish_step(rc);
  }
  reader.check_counters(true, steps);
  cudaEventDestroy(own);
  int const wrong = reader.wrong_rows(w);
  std::printf("ipc reader: %d wrong rows of %d\n", wrong, steps * handoff::K);
  std::fflush(stdout);
  if (!control) { REQUIRE(wrong == 0); }
}
