// coordinator_load: load generator for ulysses-coordinator.
//
// Starts a real coordinator process (optionally pinned with `taskset -c CORE`), connects
// N simulated workers (Session streams on gRPC's async API, spread over several channels and
// --client-queues completion queues), each
// sending a heartbeat with request_ack every --heartbeat-s seconds, plus a stream of job
// submissions and GetJob/ListWorkers reads. Reports p50/p99/max latency per RPC kind
// (heartbeat = session round trip heartbeat -> ack), coordinator CPU (from
// /proc/<pid>/stat over the measurement window) and RSS.
//
//   build/bin/coordinator_load --workers 2000 --seconds 30 --core 0 [--tls]
//
// --tls: the coordinator serves TLS with certificates from scripts/dev_certs.sh (run from
// the repository root), and every channel verifies it against the dev CA (as deployed);
// without it the channels are loopback plaintext.
//
// --restart-after S: S seconds into the measurement the coordinator is killed with
// SIGKILL and started again on the same port and state directory; every agent whose
// session ended reconnects as ulysses-worker does (Register again, then a new session,
// after a jittered exponential backoff of 200 ms .. 5 s: docs/API.md "Reconnects").
// Reported: the time until every agent is back (an ack on its new session), and the
// workers SUSPECT or LOST at the end.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "bench/coordinator_load_agents.h"
#include "common/contract/cli11.h"
#include "common/file_tree.h"
#include "common/grpc/grpc_util.h"
#include "common/process/process_init.h"
#include "httplib.h"
#include "ulysses/v1/job_service.grpc.pb.h"
#include "ulysses/v1/worker_service.grpc.pb.h"

namespace {
using namespace ulysses::bench;  // NOLINT: the bench's own clients, Clock and v1.

// The coordinator's ulysses_scheduling_pass_seconds histogram, read from its /metrics:
// the passes hold the coordinator's mutex, so their length is a floor under the tail of
// every call that waits for it.
struct PassHistogram {
  std::vector<std::pair<double, double>> buckets;  // (le, cumulative count), +Inf last.
  double sum = 0;
  double count = 0;
};

std::optional<PassHistogram> ScrapePasses(int metrics_port) {
  httplib::Client http("127.0.0.1", metrics_port);
  http.set_read_timeout(10, 0);
  auto res = http.Get("/metrics");
  if (!res || res->status != 200) return std::nullopt;
  PassHistogram out;
  std::istringstream lines(res->body);
  const std::string name = "ulysses_scheduling_pass_seconds";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name, 0) != 0) continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    const double value = std::strtod(line.c_str() + space + 1, nullptr);
    if (line.rfind(name + "_bucket{le=\"", 0) == 0) {
      const size_t from = name.size() + 12;  // After `_bucket{le="`.
      const std::string le = line.substr(from, line.find('"', from) - from);
      out.buckets.emplace_back(le == "+Inf" ? INFINITY : std::strtod(le.c_str(), nullptr), value);
    } else if (line.rfind(name + "_sum ", 0) == 0) {
      out.sum = value;
    } else if (line.rfind(name + "_count ", 0) == 0) {
      out.count = value;
    }
  }
  return out;
}

// The passes between two scrapes: count, mean, and the bucket bounds of p99 and max.
std::string PassSummary(const PassHistogram& from, const PassHistogram& to, double seconds) {
  const double n = to.count - from.count;
  if (n <= 0) return "scheduling passes: none in the window";
  auto at = [&](size_t i) {
    return to.buckets[i].second - (i < from.buckets.size() ? from.buckets[i].second : 0);
  };
  auto bound = [&](double fraction) -> double {
    for (size_t i = 0; i < to.buckets.size(); ++i) {
      if (at(i) >= fraction * n) return to.buckets[i].first * 1e3;
    }
    return INFINITY;
  };
  char buf[240];
  snprintf(buf, sizeof(buf),
           "scheduling passes (under the coordinator's lock): %.0f (%.1f/s), mean %.2f ms, "
           "p99 <= %.0f ms, max <= %.0f ms, %.1f%% of the window",
           n, n / seconds, (to.sum - from.sum) / n * 1e3, bound(0.99), bound(1.0),
           (to.sum - from.sum) / seconds * 100);
  return buf;
}

// The coordinator process: started, killed with SIGKILL, started again on its port.
struct CoordinatorProcess {
  pid_t pid = -1;
  int port = 0;
  int metrics_port = 0;
};

// Starts `bin` on 127.0.0.1:`port` (0 = any) over `state_dir`; waits for its
// "listening" line. pid -1 when it did not start.
CoordinatorProcess StartCoordinator(const std::string& bin, const std::string& state_dir, int port,
                                    int core, bool tls, const std::string& certs) {
  CoordinatorProcess out;
  int out_pipe[2];
  if (pipe(out_pipe) != 0) return out;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    close(out_pipe[0]);
    setenv("ULYSSES_LOG_LEVEL", "warning", 1);
    std::vector<std::string> args;
    if (core >= 0) args = {"/usr/bin/taskset", "-c", std::to_string(core)};
    for (std::string a : {bin, std::string("--listen"), absl::StrCat("127.0.0.1:", port),
                          std::string("--state-dir"), state_dir, std::string("--metrics-listen"),
                          std::string("127.0.0.1:0")}) {
      args.push_back(a);
    }
    // The bench's config (written by main): stream caps sized for --watchers.
    for (std::string a : {std::string("--config"), state_dir + "/load.yaml"}) args.push_back(a);
    if (tls) {
      for (std::string a : {std::string("--tls-cert"), certs + "/server.pem",
                            std::string("--tls-key"), certs + "/server.key"}) {
        args.push_back(a);
      }
    }
    std::vector<char*> argv2;
    for (auto& a : args) argv2.push_back(a.data());
    argv2.push_back(nullptr);
    execv(argv2[0], argv2.data());
    _exit(127);
  }
  close(out_pipe[1]);
  FILE* child_out = fdopen(out_pipe[0], "r");
  char line[512];
  while (fgets(line, sizeof(line), child_out)) {
    if (sscanf(line, "ulysses-coordinator listening grpc=%d metrics=%d", &out.port,
               &out.metrics_port) == 2) {
      break;
    }
  }
  if (out.port == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return out;
  }
  out.pid = pid;
  return out;  // Its stdout pipe stays open (it writes little past the first line).
}

struct ProcStat {
  double user_s = 0;
  double sys_s = 0;
  double rss_mib = 0;
};

// This process's own CPU (the load generator), user and system.
ProcStat SelfCpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  ProcStat out;
  out.user_s = u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6;
  out.sys_s = u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
  return out;
}

// "user U s + sys S s = P % of one core" over `wall` seconds.
std::string CpuLine(const ProcStat& a, const ProcStat& b, double wall) {
  const double user = b.user_s - a.user_s, sys = b.sys_s - a.sys_s;
  char buf[160];
  snprintf(buf, sizeof(buf), "user %.2f s + sys %.2f s = %.1f%% of one core", user, sys,
           100.0 * (user + sys) / wall);
  return buf;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

ProcStat ReadProc(pid_t pid) {
  ProcStat out;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t close = content.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(content.substr(close + 2));
    std::vector<std::string> f;
    std::string tok;
    while (rest >> tok) f.push_back(tok);
    // Fields after ")" start at field 3 (state); utime = field 14, stime = field 15.
    if (f.size() > 13) {
      out.user_s = std::stod(f[11]) / sysconf(_SC_CLK_TCK);
      out.sys_s = std::stod(f[12]) / sysconf(_SC_CLK_TCK);
    }
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) out.rss_mib = std::stod(line.substr(6)) / 1024.0;
  }
  return out;
}

// Counts `key(item)` over every page of a paged list RPC (ListWorkers, ListJobs): `call`
// runs one page's request; `items` gives a page's entries.
template <class Request, class Response, class Call, class Items, class Key>
std::map<std::string, int> CountPages(const char* name, Call call, Items items, Key key) {
  std::map<std::string, int> out;
  Request req;
  req.set_page_size(1000);
  do {
    Response resp;
    grpc::ClientContext ctx;
    Authorize(&ctx);
    SetDeadlineAfter(&ctx, absl::Seconds(30));
    grpc::Status s = call(&ctx, req, &resp);
    if (!s.ok()) {
      out[absl::StrCat("(", name, " failed: ", s.error_message(), ")")]++;
      break;
    }
    for (const auto& item : items(resp)) out[key(item)]++;
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return out;
}

// Counts `key(job)` over every job (ListJobs, every page).
template <class Key>
std::map<std::string, int> CountJobs(v1::JobService::Stub* jobs, Key key) {
  return CountPages<v1::ListJobsRequest, v1::ListJobsResponse>(
      "ListJobs",
      [&](grpc::ClientContext* c, const v1::ListJobsRequest& r, v1::ListJobsResponse* o) {
        return jobs->ListJobs(c, r, o);
      },
      [](const v1::ListJobsResponse& r) { return r.jobs(); }, key);
}

// Each job's generation and state name, by job id.
std::map<std::string, std::pair<int64_t, std::string>> JobGenerations(v1::JobService::Stub* jobs) {
  std::map<std::string, std::pair<int64_t, std::string>> out;
  for (const auto& [key, n] : CountJobs(jobs, [](const v1::Job& j) {
         return absl::StrCat(j.id(), " ", j.generation(), " ", v1::JobState_Name(j.state()));
       })) {
    std::istringstream fields(key);
    std::string id, state;
    int64_t generation = 0;
    if (fields >> id >> generation >> state) out[id] = {generation, state};
  }
  return out;
}

// Workers by state.
std::map<std::string, int> WorkerStates(v1::JobService::Stub* jobs) {
  return CountPages<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      "ListWorkers",
      [&](grpc::ClientContext* c, const v1::ListWorkersRequest& r, v1::ListWorkersResponse* o) {
        return jobs->ListWorkers(c, r, o);
      },
      [](const v1::ListWorkersResponse& r) { return r.workers(); },
      [](const v1::Worker& w) { return v1::WorkerState_Name(w.state()); });
}

// Jobs by state (failed ones with the start of their reason).
std::map<std::string, int> JobStates(v1::JobService::Stub* jobs) {
  return CountJobs(jobs, [](const v1::Job& j) {
    std::string key = v1::JobState_Name(j.state());
    if (j.state() == v1::JOB_STATE_FAILED) key += " [" + j.reason().substr(0, 80) + "]";
    return key;
  });
}

// Simulated agent i: name sim-i, eight agents per node label, a unique 10.x.y.z host.
v1::RegisterRequest RegisterRequestFor(int i) {
  v1::RegisterRequest req;
  req.set_name(absl::StrCat("sim-", i));
  req.set_node_label(absl::StrCat("node-", i / 8));
  req.set_device("cpu");
  req.set_host(absl::StrCat("10.", i / 65536, ".", (i / 256) % 256, ".", i % 256));
  return req;
}

std::string JobYaml(int i) {
  return absl::StrCat(
      "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata:\n  name: load-", i,
      "\nspec:\n  model: {preset: tiny}\n  data:\n    synthetic: {generator: random}\n"
      "  stages:\n    - {seq_len: 256, steps: 100000, sp_degree: 2}\n");
}

}  // namespace

int main(int argc, char** argv) {
  ulysses::InitProcess(argv[0]);  // Crash traces; Abseil's deadlock detector off.
  CLI::App app{"Load generator for ulysses-coordinator"};
  int workers = 2000;
  double seconds = 30;
  double warmup = 5;
  double heartbeat_s = 1.0;
  double submit_per_s = 2.0;
  int channels = 16;
  int core = 0;
  std::string bin;
  bool tls = false;
  bool check = false;
  double restart_after = -1;
  int watchers = 0;
  int session_queues = 0;
  int client_queues = 4;
  double max_heartbeats_per_s = -1;
  app.add_option("--workers", workers, "Simulated workers");
  app.add_flag("--tls", tls, "Serve and connect over TLS (dev certs; run from the repo root)");
  app.add_option("--seconds", seconds, "Measurement window");
  app.add_option("--warmup", warmup, "Seconds of load before measuring");
  app.add_option("--heartbeat-s", heartbeat_s,
                 "Heartbeat period per worker; 0 = the interval the coordinator asks for "
                 "(RegisterResponse, then Acks: it grows with the cluster, max_heartbeats_per_s)");
  app.add_option("--submit-per-s", submit_per_s, "Job submissions per second");
  app.add_option("--channels", channels,
                 "gRPC channels (TCP connections, TLS sessions) for the workers; 0 = one each");
  app.add_option("--core", core, "Pin the coordinator with taskset -c CORE (-1 = no pinning)");
  app.add_flag("--check", check,
               "Exit 1 unless every heartbeat was answered, no session ended early, no worker is "
               "LOST or SUSPECT at the end and, with --restart-after, every agent came back "
               "and every job running at the kill runs on the same generation, no rank of an "
               "attempt live at the kill refused (the ctest regressions)");
  app.add_option("--coordinator", bin, "ulysses-coordinator binary (default: next to this one)");
  app.add_option("--watchers", watchers,
                 "WatchJob streams opened at the end of the warm-up, round-robin over the jobs "
                 "submitted so far (with --run-assignments their jobs report progress)");
  app.add_flag("--run-assignments", g_run_assignments,
               "Workers answer assignments (started, then rank 0 reports a step per heartbeat)");
  app.add_option("--session-queues", session_queues,
                 "The coordinator's session_queues (0 = its default)");
  app.add_option("--max-heartbeats-per-s", max_heartbeats_per_s,
                 "The coordinator's max_heartbeats_per_s (-1 = its default; 0 = a fixed interval)");
  app.add_option("--client-queues", client_queues,
                 "Completion queues (one thread each) serving the simulated agents' sessions")
      ->check(CLI::Range(1, 64));
  app.add_option("--restart-after", restart_after,
                 "Seconds into the measurement to kill -9 the coordinator and start it again on "
                 "the same port and state (agents reconnect with backoff); -1 = never");
  if (std::optional<int> exit_code = ulysses::contract::ParseCommandLine(app, argc, argv)) {
    return *exit_code;
  }
  if (bin.empty()) {
    bin = (std::filesystem::canonical("/proc/self/exe").parent_path() / "ulysses-coordinator")
              .string();
  }

  std::string state_dir =
      (std::filesystem::temp_directory_path() / ("ulysses-load-" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(state_dir);
  const std::string certs = state_dir + "/certs";
  std::string ca_pem;
  if (tls) {
    const std::string cmd = "bash scripts/dev_certs.sh '" + certs + "' >/dev/null";
    if (std::system(cmd.c_str()) != 0) {
      fprintf(stderr, "--tls: \"%s\" failed (run from the repository root)\n", cmd.c_str());
      return 1;
    }
    std::ifstream in(certs + "/ca.pem");
    std::stringstream ss;
    ss << in.rdbuf();
    ca_pem = ss.str();
  }
  {
    // Every watcher uses the bench's one admin token: the per-identity stream cap (64 by
    // default) is raised to --watchers, as 1,000 users each under their cap would be.
    std::ofstream config(state_dir + "/load.yaml");
    config << "max_streams_per_identity: " << std::max(64, watchers + 16) << "\n"
           << "max_streams: " << std::max(4096, watchers + 16) << "\n";
    if (session_queues > 0) config << "session_queues: " << session_queues << "\n";
    if (max_heartbeats_per_s >= 0) {
      config << "max_heartbeats_per_s: " << max_heartbeats_per_s << "\n";
    }
  }
  CoordinatorProcess coordinator = StartCoordinator(bin, state_dir, 0, core, tls, certs);
  if (coordinator.pid < 0) {
    fprintf(stderr, "coordinator did not start\n");
    return 1;
  }
  const int port = coordinator.port;
  {
    std::ifstream token_in(state_dir + "/admin.token");
    std::getline(token_in, g_token);
  }
  const std::string target = absl::StrCat("127.0.0.1:", port);
  if (channels <= 0 || channels > workers) channels = workers;
  std::vector<std::shared_ptr<grpc::Channel>> chans;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("ulysses.load.channel", i);  // Distinct args -> distinct TCP connections.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // The agent's channel settings (worker_agent.cc): reconnect 200 ms .. 2 s.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (tls) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = ca_pem;
      creds = grpc::SslCredentials(ssl);
    }
    chans.push_back(grpc::CreateCustomChannel(target, creds, args));
  }
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> wstubs;
  for (auto& c : chans) wstubs.push_back(v1::WorkerService::NewStub(c));
  auto jobs = v1::JobService::NewStub(chans[0]);

  // The agents' completion queues, one thread each (coordinator_load_agents.h).
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs;
  std::vector<std::thread> cq_threads;
  for (int i = 0; i < client_queues; ++i) {
    cqs.push_back(std::make_unique<grpc::CompletionQueue>());
    cq_threads.emplace_back([cq = cqs.back().get()] { ulysses::RunCompletions(cq); });
  }
  auto queue_for = [&](int worker) { return cqs[worker % client_queues].get(); };

  Latencies reg_lat, hb_lat, submit_lat, get_lat, list_workers_lat;
  // Register every worker (4 threads), each opening its session at once (a worker
  // silent for heartbeat_timeout_s after its Register would be SUSPECT).
  std::vector<std::string> ids(workers);
  std::vector<std::unique_ptr<SimWorker>> sims(workers);
  // What the heartbeat thread sees of `sims` while they are being registered.
  std::unique_ptr<std::atomic<SimWorker*>[]> live(new std::atomic<SimWorker*>[workers]);
  for (int i = 0; i < workers; ++i) live[i] = nullptr;
  std::atomic<bool> stop{false};
  std::atomic<long> skipped{0};
  // Heartbeats: worker i fires at offset i/N of each period, in 5 ms batches (from the
  // first registration on).
  std::thread beat([&] {
    auto start = Clock::now();
    long tick = 0;
    // Where the sweep over the workers is: worker i fires when it passes i (mod workers). Each
    // 5 ms tick advances it by workers x 5 ms / period, so every worker fires once per period,
    // and a period that changes (--heartbeat-s 0: the coordinator asked for another) changes
    // the speed of the sweep without skipping or repeating anyone.
    double sweep = 0;
    while (!stop) {
      const int64_t told_ms = g_told_interval_ms.load();
      const double period = heartbeat_s > 0 ? heartbeat_s : (told_ms > 0 ? told_ms / 1000.0 : 1.0);
      auto slot_start =
          start + std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(5) * tick);
      std::this_thread::sleep_until(slot_start);
      const double next = sweep + workers * 0.005 / period;
      const long lo = std::lround(std::floor(sweep)), hi = std::lround(std::floor(next));
      for (long k = lo; k < hi; ++k) {
        const int i = static_cast<int>(k % workers);
        SimWorker* sim = live[i].load(std::memory_order_acquire);
        // A session that ended (the coordinator was killed) is not skipping: its agent
        // is reconnecting.
        if (sim != nullptr && !sim->done() && !sim->Heartbeat()) skipped++;
      }
      sweep = next >= workers ? next - workers : next;
      ++tick;
    }
  });
  // Startup registrations. A call the coordinator did not answer (UNAVAILABLE: a channel
  // still connecting or between reconnects) is retried as ulysses-worker does, after a jittered
  // backoff of 200 ms doubling, up to 5 tries; what failed is reported.
  std::atomic<long> startup_retries{0};
  std::mutex startup_error_mu;
  std::string startup_error;  // The first failure (guarded by startup_error_mu).
  {
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t) + 17u);
        for (int i = t; i < workers; i += 4) {
          const v1::RegisterRequest req = RegisterRequestFor(i);
          v1::RegisterResponse resp;
          grpc::Status s;
          for (int attempt = 0, backoff_ms = 200;; ++attempt, backoff_ms *= 2) {
            grpc::ClientContext ctx;
            Authorize(&ctx);
            SetDeadlineAfter(&ctx, absl::Seconds(30));
            auto t0 = Clock::now();
            s = wstubs[i % channels]->Register(&ctx, req, &resp);
            reg_lat.Add(std::chrono::duration<double>(Clock::now() - t0).count());
            if (s.ok()) break;
            {
              std::lock_guard<std::mutex> lock(startup_error_mu);
              if (startup_error.empty()) {
                startup_error =
                    absl::StrCat("agent ", i, ": code ", s.error_code(), ": ", s.error_message());
              }
            }
            if (attempt == 4 || s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
            startup_retries++;
            std::this_thread::sleep_for(std::chrono::milliseconds(
                std::uniform_int_distribution<int>(backoff_ms / 2, backoff_ms)(rng)));
          }
          if (s.ok()) ids[i] = resp.worker_id();
          if (s.ok()) g_told_interval_ms = resp.heartbeat_interval_ms();
          sims[i] = std::make_unique<SimWorker>(wstubs[i % channels].get(), queue_for(i), ids[i],
                                                &hb_lat);
          live[i].store(sims[i].get(), std::memory_order_release);
        }
      });
    }
    for (auto& t : ts) t.join();
  }

  // Reconnects (--restart-after): an agent whose session ended registers again and opens
  // a new session after a jittered exponential backoff, 200 ms doubling to 5 s, as
  // ulysses-worker's SessionLoop. 64 threads, each owning the agents i = t (mod 64), each
  // Register a blocking call: real agents register independently, so the bench keeps up to
  // 64 in flight (with 16, 25,000 agents queued behind ~1,560 sequential calls per thread
  // and the storm measured the generator: 41 s to all back, 34 s with 64); replaced sessions
  // are kept (the heartbeat thread may still hold them) until the end.
  constexpr int kReconnectThreads = 64;
  std::vector<std::vector<std::unique_ptr<SimWorker>>> retired(kReconnectThreads);
  std::atomic<long> reregistrations{0}, register_failures{0};
  std::atomic<long> ranks_kept{0}, ranks_refused{0};  // Reported ranks the coordinator kept.
  std::mutex refused_mu;
  std::vector<v1::WorkRef> refused_refs;  // Guarded by refused_mu: the ranks it refused.
  std::vector<std::thread> reconnectors;
  for (int t = 0; restart_after >= 0 && t < kReconnectThreads; ++t) {
    reconnectors.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1);
      struct Retry {
        bool waiting = false;
        std::chrono::milliseconds backoff{200};
        Clock::time_point at;
      };
      std::vector<Retry> retry(static_cast<size_t>(workers / kReconnectThreads + 1));
      auto schedule = [&](Retry& r) {
        r.waiting = true;
        r.at = Clock::now() + std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(
                                  r.backoff.count() / 2, r.backoff.count())(rng));
        r.backoff = std::min(r.backoff * 2, std::chrono::milliseconds(5000));
      };
      while (!stop) {
        for (int i = t; i < workers && !stop; i += kReconnectThreads) {
          Retry& r = retry[static_cast<size_t>(i / kReconnectThreads)];
          if (sims[i] == nullptr || !sims[i]->done()) continue;
          if (!r.waiting) {
            r.backoff = std::chrono::milliseconds(200);
            schedule(r);
            continue;
          }
          if (Clock::now() < r.at) continue;
          v1::RegisterRequest req = RegisterRequestFor(i);
          // The rank it runs (--run-assignments) is reported, as ulysses-worker does, so
          // that its job continues in place.
          const std::optional<SimRank> rank = sims[i]->rank();
          if (rank.has_value()) {
            v1::RunningWork* running = req.add_running_ranks();
            *running->mutable_ref() = rank->ref;
            running->set_pid(4242);
          }
          v1::RegisterResponse resp;
          grpc::ClientContext ctx;
          Authorize(&ctx);
          SetDeadlineAfter(&ctx, absl::Seconds(10));
          if (!wstubs[i % channels]->Register(&ctx, req, &resp).ok()) {
            register_failures++;
            schedule(r);
            continue;
          }
          reregistrations++;
          if (rank.has_value()) (resp.keep_running() ? ranks_kept : ranks_refused)++;
          if (rank.has_value() && !resp.keep_running()) {
            std::lock_guard<std::mutex> lock(refused_mu);
            refused_refs.push_back(rank->ref);
          }
          r.waiting = false;
          retired[t].push_back(std::move(sims[i]));
          sims[i] = std::make_unique<SimWorker>(wstubs[i % channels].get(), queue_for(i),
                                                resp.worker_id(), &hb_lat,
                                                resp.keep_running() ? rank : std::nullopt);
          live[i].store(sims[i].get(), std::memory_order_release);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }

  // Users: submissions plus reads.
  std::atomic<int> submitted{0};
  std::mutex ids_mu;
  std::vector<std::string> submitted_ids;  // Guarded by ids_mu.
  std::thread user([&] {
    int i = 0;
    std::string last_id;
    auto next = Clock::now();
    while (!stop) {
      next += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(1.0 / submit_per_s));
      std::this_thread::sleep_until(next);
      {
        v1::SubmitJobRequest req;
        req.set_spec_yaml(JobYaml(i++));
        v1::SubmitJobResponse resp;
        grpc::ClientContext ctx;
        Authorize(&ctx);
        SetDeadlineAfter(&ctx, absl::Seconds(10));
        auto t0 = Clock::now();
        if (jobs->SubmitJob(&ctx, req, &resp).ok()) {
          submitted++;
          last_id = resp.job_id();
          std::lock_guard<std::mutex> lock(ids_mu);
          submitted_ids.push_back(last_id);
        }
        submit_lat.Add(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      if (!last_id.empty()) {
        v1::GetJobRequest req;
        req.set_job_id(last_id);
        v1::GetJobResponse resp;
        grpc::ClientContext ctx;
        Authorize(&ctx);
        SetDeadlineAfter(&ctx, absl::Seconds(10));
        auto t0 = Clock::now();
        jobs->GetJob(&ctx, req, &resp);
        get_lat.Add(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      if (i % 10 == 0) {
        v1::ListWorkersResponse resp;
        grpc::ClientContext ctx;
        Authorize(&ctx);
        SetDeadlineAfter(&ctx, absl::Seconds(10));
        auto t0 = Clock::now();
        jobs->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
        list_workers_lat.Add(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
  });

  std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
  hb_lat.Clear();
  submit_lat.Clear();
  get_lat.Clear();
  list_workers_lat.Clear();
  skipped = 0;
  for (auto& s : sims) s->ResetUnanswered();
  const std::string load_before = LoadAverage();
  // Watchers: opened now, measured over the window (RSS before them vs at the end).
  const ProcStat before_watchers = ReadProc(coordinator.pid);
  std::vector<std::unique_ptr<Watcher>> watch_streams;
  size_t watched_jobs = 0;
  {
    std::lock_guard<std::mutex> lock(ids_mu);
    watched_jobs = std::min<size_t>(submitted_ids.size(), static_cast<size_t>(watchers));
    for (int i = 0; i < watchers && !submitted_ids.empty(); ++i) {
      watch_streams.push_back(std::make_unique<Watcher>(
          jobs.get(), submitted_ids[static_cast<size_t>(i) % submitted_ids.size()]));
    }
  }
  ProcStat p0 = ReadProc(coordinator.pid), g0 = SelfCpu();
  std::optional<PassHistogram> passes0 = ScrapePasses(coordinator.metrics_port);
  auto t0 = Clock::now();
  auto cpu_from = t0;  // The coordinator's CPU is measured from here (its restart).
  std::string restart_report;
  int restart_back = -1;  // Agents back after the restart (-1: no restart).
  std::map<std::string, int64_t> running_at_kill;  // Job id -> generation, at the kill.
  // Job id -> (generation, state) of every job at the kill: a rank the restarted coordinator
  // refuses must be of an attempt that was no longer live then (ended, its abort or exit ack
  // still in flight when the coordinator died); refusing a live attempt's rank is the bug.
  std::map<std::string, std::pair<int64_t, std::string>> at_kill;
  long live_ranks_refused = 0;  // Refused ranks of attempts live at the kill.
  int jobs_moved = 0;           // Of those, jobs not RUNNING on the same generation at the end.
  if (restart_after >= 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(restart_after));
    // The jobs running now (id -> generation): a restart must leave their ranks running.
    at_kill = JobGenerations(jobs.get());
    for (const auto& [id, at] : at_kill) {
      if (at.second == "JOB_STATE_RUNNING") running_at_kill[id] = at.first;
    }
    const auto killed = Clock::now();
    kill(coordinator.pid, SIGKILL);
    waitpid(coordinator.pid, nullptr, 0);
    coordinator = StartCoordinator(bin, state_dir, port, core, tls, certs);
    if (coordinator.pid < 0) {
      fprintf(stderr, "--restart-after: the coordinator did not start again on port %d\n", port);
      stop = true;
      _exit(1);
    }
    const auto listening = Clock::now();
    p0 = ProcStat{};  // The new process's whole life.
    passes0 = PassHistogram{};
    cpu_from = listening;
    // Every agent back: an ack on a session opened after the kill.
    Clock::time_point all_back{};
    int back = 0;
    const auto window_end =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    while (Clock::now() < window_end) {
      back = 0;
      Clock::time_point last{};
      for (int i = 0; i < workers; ++i) {
        SimWorker* sim = live[i].load(std::memory_order_acquire);
        const Clock::time_point ack = sim == nullptr ? Clock::time_point{} : sim->first_ack();
        if (ack > killed) {
          ++back;
          last = std::max(last, ack);
        }
      }
      if (back == workers) {
        all_back = last;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    restart_back = back;
    restart_report =
        absl::StrCat("restart: kill -9 at ", restart_after, " s; new coordinator listening after ",
                     absl::SixDigits(std::chrono::duration<double>(listening - killed).count()),
                     " s; ", back, " of ", workers, " agents back");
    if (back == workers) {
      absl::StrAppend(&restart_report, ", the last ",
                      absl::SixDigits(std::chrono::duration<double>(all_back - killed).count()),
                      " s after the kill (",
                      absl::SixDigits(std::chrono::duration<double>(all_back - listening).count()),
                      " s after it listened)");
    } else {
      absl::StrAppend(&restart_report, " by the end of the window");
    }
    absl::StrAppend(&restart_report, "; ", reregistrations.load(), " re-registrations, ",
                    register_failures.load(), " refused or failed (retried with backoff)");
    std::this_thread::sleep_until(window_end);
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
  ProcStat p1 = ReadProc(coordinator.pid), g1 = SelfCpu();
  std::optional<PassHistogram> passes1 = ScrapePasses(coordinator.metrics_port);
  double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double coordinator_wall = std::chrono::duration<double>(Clock::now() - cpu_from).count();
  stop = true;
  beat.join();
  user.join();
  for (auto& r : reconnectors) r.join();
  // The last heartbeats' acks (up to 5 s) before counting the unanswered ones.
  int64_t unanswered = 0;
  for (auto until = Clock::now() + std::chrono::seconds(5);;) {
    unanswered = 0;
    for (auto& s : sims) unanswered += s->unanswered();
    if (unanswered == 0 || Clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int dead = 0, assigned = 0;
  std::map<std::string, int> end_reasons;
  for (auto& s : sims) {
    if (s->done()) end_reasons[s->final_status()]++;
    dead += s->done();
    assigned += s->assignments();
  }

  printf(
      "coordinator_load: %d workers, heartbeat every %.2fs%s, %.1f submissions/s, %d channels, "
      "coordinator pinned to core %d\n",
      workers, heartbeat_s > 0 ? heartbeat_s : g_told_interval_ms.load() / 1000.0,
      heartbeat_s > 0 ? "" : " (as the coordinator asked at the end)", submit_per_s, channels,
      core);
  printf("%s\n", reg_lat.Summary("Register (startup)").c_str());
  if (!startup_error.empty()) {
    printf("Register (startup): %ld calls retried; the first failure: %s\n", startup_retries.load(),
           startup_error.c_str());
  }
  printf("%s\n", hb_lat.Summary("Session heartbeat RTT").c_str());
  printf("%s\n", submit_lat.Summary("SubmitJob").c_str());
  printf("%s\n", get_lat.Summary("GetJob").c_str());
  printf("%s\n", list_workers_lat.Summary("ListWorkers").c_str());
  if (passes0.has_value() && passes1.has_value()) {
    printf("%s\n", PassSummary(*passes0, *passes1, coordinator_wall).c_str());
  }
  printf(
      "heartbeats skipped (previous write in flight): %ld; sessions ended early: %d; "
      "jobs submitted: %d; assignments received: %d\n",
      skipped.load(), dead, submitted.load(), assigned);
  for (const auto& [why, n] : end_reasons) printf("  session ended: %d x [%s]\n", n, why.c_str());
  const std::map<std::string, int> states = WorkerStates(jobs.get());
  printf("workers at the end:");
  for (const auto& [state, n] : states) printf(" %s %d", state.c_str(), n);
  printf("\n");
  printf("jobs at the end:");
  for (const auto& [state, n] : JobStates(jobs.get())) printf(" %s %d", state.c_str(), n);
  printf("\n");
  printf("heartbeats unanswered (no ack within 5 s of the end): %lld\n",
         static_cast<long long>(unanswered));
  if (!restart_report.empty()) {
    printf("%s\n", restart_report.c_str());
    // Jobs' ranks untouched: every job running at the kill runs on the same generation
    // (its attempt continued in place: the ranks reported themselves on re-registering).
    std::map<std::string, int> after;  // "<generation> <STATE>" of the jobs running at the kill.
    for (const auto& [id, at] : JobGenerations(jobs.get())) {
      if (!running_at_kill.count(id)) continue;
      const bool same = at.first == running_at_kill[id] && at.second == "JOB_STATE_RUNNING";
      after[same ? "same generation, RUNNING" : absl::StrCat("moved to ", at.second)]++;
      jobs_moved += same ? 0 : 1;
    }
    printf("jobs running at the kill: %zu; at the end:", running_at_kill.size());
    for (const auto& [what, n] : after) printf(" %s %d", what.c_str(), n);
    printf("; ranks reported on re-registering: %ld kept, %ld refused\n", ranks_kept.load(),
           ranks_refused.load());
    std::lock_guard<std::mutex> lock(refused_mu);
    for (const v1::WorkRef& ref : refused_refs) {
      auto it = at_kill.find(ref.job_id());
      const bool live = it != at_kill.end() && it->second.first == ref.generation() &&
                        (it->second.second == "JOB_STATE_RUNNING" ||
                         it->second.second == "JOB_STATE_SCHEDULING" ||
                         it->second.second == "JOB_STATE_CHECKPOINTING");
      live_ranks_refused += live ? 1 : 0;
      printf("  refused: %s generation %lld rank %d (%s at the kill: %s)\n", ref.job_id().c_str(),
             static_cast<long long>(ref.generation()), ref.rank(), live ? "LIVE" : "not live",
             it == at_kill.end()
                 ? "unknown job"
                 : absl::StrCat("generation ", it->second.first, " ", it->second.second).c_str());
    }
  }
  if (!watch_streams.empty()) {
    int64_t events = 0;
    int ended = 0;
    for (auto& w : watch_streams) {
      events += w->events();
      ended += w->done();
    }
    printf(
        "watchers: %zu WatchJob streams on %zu jobs, %lld events delivered (%.0f/s), %d "
        "ended; coordinator RSS %.1f MiB before them, %.1f MiB at the end\n",
        watch_streams.size(), watched_jobs, static_cast<long long>(events),
        static_cast<double>(events) / wall, ended, before_watchers.rss_mib, p1.rss_mib);
  }
  printf("coordinator CPU: %s over %.1fs%s; RSS %.1f MiB\n",
         CpuLine(p0, p1, coordinator_wall).c_str(), coordinator_wall,
         restart_report.empty() ? "" : " (the restarted process, from its start)", p1.rss_mib);
  printf("generator CPU:   %s (of %u cores)\n", CpuLine(g0, g1, wall).c_str(),
         std::thread::hardware_concurrency());
  printf("load average: %s at the start, %s at the end\n", load_before.c_str(),
         LoadAverage().c_str());

  for (auto& w : watch_streams) w->Close();
  for (auto& s : sims) s->Close();
  // Every session has ended (Close waited for its last tag): the queues drain and stop.
  for (auto& cq : cqs) cq->Shutdown();
  for (std::thread& t : cq_threads) t.join();
  kill(coordinator.pid, SIGTERM);
  int status = 0;
  waitpid(coordinator.pid, &status, 0);
  ulysses::RemoveTree(state_dir).IgnoreError();
  if (check) {
    const int lost = states.count("WORKER_STATE_LOST") ? states.at("WORKER_STATE_LOST") : 0;
    const int suspect =
        states.count("WORKER_STATE_SUSPECT") ? states.at("WORKER_STATE_SUSPECT") : 0;
    const long registered =
        std::count_if(ids.begin(), ids.end(), [](auto& id) { return !id.empty(); });
    // With --restart-after, every agent must be back on a new session; heartbeats skipped
    // while a new session's first write was in flight are the storm's, not counted.
    const bool restarted = restart_after >= 0;
    if (unanswered != 0 || (!restarted && skipped != 0) || dead != 0 || lost != 0 || suspect != 0 ||
        registered != workers || hb_lat.count() == 0 ||
        (restarted && (restart_back != workers || jobs_moved != 0 || live_ranks_refused != 0))) {
      const std::string back =
          restarted ? absl::StrCat(", ", restart_back, " back after the restart") : "";
      fprintf(stderr,
              "--check failed: %lld heartbeats unanswered, %ld skipped, %d sessions ended early, "
              "%d workers LOST, %d SUSPECT, %ld of %d registered, %zu heartbeats answered%s, "
              "%d jobs not continued in place, %ld ranks of live attempts refused\n",
              static_cast<long long>(unanswered), skipped.load(), dead, lost, suspect, registered,
              workers, hb_lat.count(), back.c_str(), jobs_moved, live_ranks_refused);
      return 1;
    }
    printf("--check passed\n");
  }
  return 0;
}
