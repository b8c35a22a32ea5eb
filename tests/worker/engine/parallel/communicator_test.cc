// Real multi-process tests of the Gloo communicator and SeqAllToAll: every test spawns N copies of
// this binary (ranks) that rendezvous over a TCPStore on 127.0.0.1 and assert exact values.
#include "worker/engine/parallel/communicator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

#include "tests/testing/rank_processes.h"
#ifdef ULYSSES_HAVE_CUDA
#include "worker/engine/parallel/nccl_communicator.h"
#endif
#include "worker/engine/parallel/sequence_all_to_all.h"

namespace ulysses::engine {
namespace {

using testing::ChildEnv;
using testing::RunChildren;

ProcessGroups Connect(const ChildEnv& env, int sp_size, std::chrono::milliseconds timeout) {
  CommConfig config;
  config.rank = env.rank;
  config.world_size = env.world;
  config.master_port = env.port;
  config.sp_size = sp_size;
  config.timeout = timeout;
  auto groups = CreateProcessGroups(config);
  CHILD_CHECK(env, groups.ok(), groups.status().ToString());
  return std::move(groups).value();
}

// in[j*c + i][k] = rank*1000 + j*100 + i*10 + k: after the exchange, chunk j of out came from rank
// j and holds what rank j addressed to us: j*1000 + rank*100 + i*10 + k.
void ChildAllToAll(const ChildEnv& env, torch::ScalarType dtype) {
  ProcessGroups g = Connect(env, 1, std::chrono::seconds(30));
  const int w = env.world, c = 2, k = 3;
  auto in = torch::empty({w * c, k}, torch::TensorOptions().dtype(dtype));
  auto expected = torch::empty_like(in);
  for (int j = 0; j < w; ++j)
    for (int i = 0; i < c; ++i)
      for (int kk = 0; kk < k; ++kk) {
        in[j * c + i][kk] = env.rank * 1000 + j * 100 + i * 10 + kk;
        expected[j * c + i][kk] = j * 1000 + env.rank * 100 + i * 10 + kk;
      }
  auto out = torch::full_like(in, -1);
  absl::Status st = g.world->AllToAll(out, in);
  CHILD_CHECK(env, st.ok(), st.ToString());
  CHILD_CHECK(env, torch::equal(out, expected), "out=" << out << " expected=" << expected);
  const int64_t want_bytes = static_cast<int64_t>(in.nbytes()) * (w - 1) / w;
  CHILD_CHECK(env, g.world->bytes_sent() == want_bytes,
              g.world->bytes_sent() << " != " << want_bytes);
  // A bad shape is rejected with INVALID_ARGUMENT, not sent.
  auto odd = torch::zeros({w * c + 1, k}, in.options());
  auto odd_out = torch::zeros_like(odd);
  st = g.world->AllToAll(odd_out, odd);
  CHILD_CHECK(env, st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
  CHILD_CHECK(env, g.world->Barrier().ok(), "barrier");
}

void ChildCollectives(const ChildEnv& env) {
  ProcessGroups g = Connect(env, 1, std::chrono::seconds(30));
  const int w = env.world, r = env.rank;
  std::vector<torch::Tensor> ts = {torch::full({2, 3}, r + 1.0f),
                                   torch::full({4}, 0.5 * r, torch::kDouble),
                                   torch::full({1}, r, torch::kLong)};
  absl::Status st = g.world->AllReduceSum(ts);
  CHILD_CHECK(env, st.ok(), st.ToString());
  const double sum_r = w * (w - 1) / 2.0;
  CHILD_CHECK(env, torch::equal(ts[0], torch::full({2, 3}, static_cast<float>(sum_r + w))), ts[0]);
  CHILD_CHECK(env, torch::equal(ts[1], torch::full({4}, 0.5 * sum_r, torch::kDouble)), ts[1]);
  CHILD_CHECK(env, ts[2].item<int64_t>() == static_cast<int64_t>(sum_r), ts[2]);

  auto flag = torch::full({1}, r == w - 1 ? 7 : r, torch::kInt);
  st = g.world->AllReduceMax(flag);
  CHILD_CHECK(env, st.ok() && flag.item<int>() == (w - 1 > 7 ? w - 1 : 7), flag);

  const int root = w - 1;
  auto b = r == root ? torch::arange(5, torch::kFloat) : torch::zeros({5});
  st = g.world->Broadcast(b, root);
  CHILD_CHECK(env, st.ok() && torch::equal(b, torch::arange(5, torch::kFloat)), b);
  CHILD_CHECK(env, g.world->Broadcast(b, w).code() == absl::StatusCode::kInvalidArgument,
              "bad root accepted");
  CHILD_CHECK(env, g.world->Barrier().ok(), "barrier");
  CHILD_CHECK(env, g.world->rank() == r && g.world->size() == w, "rank/size");
}

// world 4 = sp2 x dp2: sp groups {0,1},{2,3}; dp groups {0,2},{1,3}.
void ChildSubgroups(const ChildEnv& env) {
  ProcessGroups g = Connect(env, 2, std::chrono::seconds(30));
  const int r = env.rank;
  CHILD_CHECK(env, g.sp_rank == r % 2 && g.dp_rank == r / 2, g.sp_rank << "," << g.dp_rank);
  CHILD_CHECK(env, g.sp->size() == 2 && g.dp->size() == 2 && g.world->size() == 4, "sizes");
  CHILD_CHECK(env, g.sp->rank() == r % 2 && g.dp->rank() == r / 2, "group ranks");
  std::vector<torch::Tensor> t = {torch::full({1}, static_cast<double>(r), torch::kDouble)};
  CHILD_CHECK(env, g.sp->AllReduceSum(t).ok(), "sp allreduce");
  const double sp_sum = (r / 2) * 4 + 1;  // {0,1} -> 1, {2,3} -> 5
  CHILD_CHECK(env, t[0].item<double>() == sp_sum, t[0]);
  t = {torch::full({1}, static_cast<double>(r), torch::kDouble)};
  CHILD_CHECK(env, g.dp->AllReduceSum(t).ok(), "dp allreduce");
  const double dp_sum = 2 * (r % 2) + 2;  // {0,2} -> 2, {1,3} -> 4
  CHILD_CHECK(env, t[0].item<double>() == dp_sum, t[0]);
  // SP all-to-all moves data only inside the pair.
  auto in = torch::tensor({r * 10.0f, r * 10.0f + 1});
  auto out = torch::empty_like(in);
  CHILD_CHECK(env, g.sp->AllToAll(out, in).ok(), "sp alltoall");
  const int base = (r / 2) * 2;
  auto want = torch::tensor({base * 10.0f + g.sp_rank, (base + 1) * 10.0f + g.sp_rank});
  CHILD_CHECK(env, torch::equal(out, want), out << " vs " << want);
  CHILD_CHECK(env, g.world->Barrier().ok(), "barrier");
}

// Rank 1 exits after setup; rank 0's collectives must fail with a Status within the timeout.
void ChildDeadPeer(const ChildEnv& env) {
  ProcessGroups g = Connect(env, 1, std::chrono::seconds(5));
  CHILD_CHECK(env, g.world->Barrier().ok(), "barrier");
  if (env.rank == 1) std::_Exit(0);
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> t = {torch::ones({1000})};
  absl::Status st = g.world->AllReduceSum(t);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHILD_CHECK(env, !st.ok(), "allreduce with a dead peer returned OK");
  CHILD_CHECK(env, secs < 15.0, "took " << secs << " s");
  std::cerr << "dead peer: " << st.ToString() << " after " << secs << " s\n";
  // The group is now unusable, and says so.
  st = g.world->Barrier();
  CHILD_CHECK(env, st.code() == absl::StatusCode::kFailedPrecondition, st.ToString());
  // Abort makes later calls fail fast with ABORTED.
  g.sp->Abort();
  auto x = torch::ones({1});
  st = g.sp->AllReduceMax(x);
  CHILD_CHECK(env, st.code() == absl::StatusCode::kAborted, st.ToString());
}

// Rank 1 stays alive but never joins rank 0's collective on `world` (it waits in a barrier on the
// dp group instead): rank 0 must get DEADLINE_EXCEEDED after its 3 s timeout, then both meet on dp
// (rank 1 runs with a 30 s timeout so that its barrier outlives rank 0's failed collective).
void ChildHungPeer(const ChildEnv& env) {
  // sp 1: dp = all ranks
  ProcessGroups g = Connect(env, 1, std::chrono::seconds(env.rank == 0 ? 3 : 30));
  CHILD_CHECK(env, g.world->Barrier().ok(), "barrier");
  if (env.rank == 0) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<torch::Tensor> t = {torch::ones({4})};
    absl::Status st = g.world->AllReduceSum(t);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cerr << "hung peer: " << st.ToString() << " after " << secs << " s\n";
    CHILD_CHECK(env, st.code() == absl::StatusCode::kDeadlineExceeded, st.ToString());
    CHILD_CHECK(env, secs >= 2.5 && secs < 15.0, "took " << secs << " s");
  }
  absl::Status st = g.dp->Barrier();
  CHILD_CHECK(env, st.ok(), st.ToString());
}

// x[b, i, h, d] = F(b, global position, h, d), distinct for every element.
double F(int64_t b, int64_t t, int64_t h, int64_t d) { return b * 1e6 + t * 1e3 + h * 10 + d; }
double G(int64_t b, int64_t t, int64_t h, int64_t d) { return 0.5 + b - 0.25 * t + 3 * h - d; }

void ChildSeqAllToAll(const ChildEnv& env) {
  ProcessGroups g = Connect(env, env.world, std::chrono::seconds(30));
  const int64_t p = env.world, r = env.rank, B = 2, SL = 3, H = 2 * p, D = 5, S = SL * p;
  auto x = torch::empty({B, SL, H, D}, torch::kDouble);
  auto w = torch::empty({B, S, H / p, D}, torch::kDouble);
  auto want_y = torch::empty({B, S, H / p, D}, torch::kDouble);
  auto want_gx = torch::empty_like(x);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t i = 0; i < SL; ++i)
        for (int64_t h = 0; h < H; ++h) {
          x[b][i][h][d] = F(b, r * SL + i, h, d);
          want_gx[b][i][h][d] = G(b, r * SL + i, h, d);  // d(sum(y*w))/dx = w at the same element
        }
      for (int64_t t = 0; t < S; ++t)
        for (int64_t hl = 0; hl < H / p; ++hl) {
          want_y[b][t][hl][d] = F(b, t, r * (H / p) + hl, d);
          w[b][t][hl][d] = G(b, t, r * (H / p) + hl, d);
        }
    }
  x.requires_grad_(true);
  torch::Tensor y = SeqAllToAll(x, g.sp.get(), 2, 1);  // [b, s/p, h, d] -> [b, s, h/p, d]
  CHILD_CHECK(env, torch::equal(y, want_y), "forward values differ");
  torch::Tensor back = SeqAllToAll(y, g.sp.get(), 1, 2);  // [b, s, h/p, d] -> [b, s/p, h, d]
  CHILD_CHECK(env, torch::equal(back, x), "round trip is not the identity");
  (y * w).sum().backward();
  CHILD_CHECK(env, torch::equal(x.grad(), want_gx), "backward gradient differs");
  // Round-trip backward: d(sum(back * x_const))/dx = x_const.
  auto x2 = x.detach().clone().requires_grad_(true);
  auto coeff = torch::arange(x.numel(), torch::kDouble).view(x.sizes());
  (SeqAllToAll(SeqAllToAll(x2, g.sp.get(), 2, 1), g.sp.get(), 1, 2) * coeff).sum().backward();
  CHILD_CHECK(env, torch::equal(x2.grad(), coeff), "round-trip gradient differs");
  CHILD_CHECK(env, g.world->Barrier().ok(), "barrier");
}

int Dispatch(const ChildEnv& env) {
  if (env.scenario == "alltoall_f32")
    ChildAllToAll(env, torch::kFloat);
  else if (env.scenario == "alltoall_i64")
    ChildAllToAll(env, torch::kLong);
  else if (env.scenario == "collectives")
    ChildCollectives(env);
  else if (env.scenario == "subgroups")
    ChildSubgroups(env);
  else if (env.scenario == "dead_peer")
    ChildDeadPeer(env);
  else if (env.scenario == "hung_peer")
    ChildHungPeer(env);
  else if (env.scenario == "seq_alltoall")
    ChildSeqAllToAll(env);
  else
    return 3;
  return 0;
}

void ExpectAllOk(const std::string& scenario, int world) {
  auto results = RunChildren(scenario, world, std::chrono::seconds(90));
  ASSERT_EQ(results.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << scenario << " rank " << r << " of " << world;
  }
}

TEST(CommunicatorTest, AllToAllExactValuesWorld2) { ExpectAllOk("alltoall_f32", 2); }
TEST(CommunicatorTest, AllToAllExactValuesWorld4) {
  ExpectAllOk("alltoall_f32", 4);
  ExpectAllOk("alltoall_i64", 4);
}
TEST(CommunicatorTest, AllReduceMaxBroadcastBarrierWorld3) { ExpectAllOk("collectives", 3); }
TEST(CommunicatorTest, SubgroupsSp2Dp2) { ExpectAllOk("subgroups", 4); }
TEST(CommunicatorTest, SeqAllToAllRoundTripAndGradientWorld2) { ExpectAllOk("seq_alltoall", 2); }
TEST(CommunicatorTest, SeqAllToAllRoundTripAndGradientWorld4) { ExpectAllOk("seq_alltoall", 4); }

TEST(CommunicatorTest, DeadPeerFailsWithStatusInsteadOfHanging) {
  auto results = RunChildren("dead_peer", 2, std::chrono::seconds(60));
  EXPECT_EQ(results[1].exit_code, 0);
  EXPECT_EQ(results[0].exit_code, 0) << "rank 0 must observe a failed collective and exit";
  EXPECT_LT(results[0].seconds, 40.0);
}

TEST(CommunicatorTest, SilentPeerTimesOutWithDeadlineExceeded) { ExpectAllOk("hung_peer", 2); }

// Before (b145c41) rendezvous keys were prefixed only by group name: when rank 0 of one job
// could not bind its port because another job's rank 0 held it (two coordinators on a host with
// overlapping rendezvous ranges), its other ranks joined that job's store and failed later with an
// unrelated gloo error, or mixed the two jobs' groups. Now rank 0 names its attempt in the store
// and every key carries job, generation and the attempt's secret: the stray rank leaves at once
// naming both attempts, rank 0's bind failure names the port and the fix, and the other job's
// group forms untouched.
TEST(CommunicatorTest, ARankThatMeetsAnotherAttemptsStoreLeavesItAtOnceNamingBoth) {
  const int port = testing::FreePort();
  auto config = [port](int rank, const std::string& attempt, const std::string& secret) {
    CommConfig c;
    c.rank = rank;
    c.world_size = 2;
    c.master_port = port;
    c.timeout = std::chrono::seconds(30);
    c.attempt = attempt;
    c.secret = secret;
    return c;
  };
  const std::string theirs = "job-000002 generation 1", mine = "job-000001 generation 3";
  absl::StatusOr<ProcessGroups> their0 = absl::UnknownError("not run");
  absl::StatusOr<ProcessGroups> their1 = absl::UnknownError("not run");
  std::thread t0([&] { their0 = CreateProcessGroups(config(0, theirs, "s2")); });
  // Our rank 1 reaches their store (it retries the connection until their rank 0 listens).
  absl::StatusOr<ProcessGroups> my1 = CreateProcessGroups(config(1, mine, "s1"));
  EXPECT_EQ(my1.status().code(), absl::StatusCode::kUnavailable) << my1.status();
  const std::string left(my1.status().message());
  EXPECT_NE(left.find("rank 1 of " + mine + " met the rendezvous store of " + theirs),
            std::string::npos)
      << left;
  EXPECT_NE(left.find(absl::StrCat("127.0.0.1:", port)), std::string::npos) << left;
  EXPECT_NE(left.find("rendezvous_port_min"), std::string::npos) << left;
  // Our rank 0 cannot bind the port their rank 0 holds.
  absl::StatusOr<ProcessGroups> my0 = CreateProcessGroups(config(0, mine, "s1"));
  EXPECT_EQ(my0.status().code(), absl::StatusCode::kUnavailable) << my0.status();
  EXPECT_NE(
      my0.status().message().find(absl::StrCat("could not host the rendezvous on port ", port)),
      std::string::npos)
      << my0.status();
  // A rank of their job and generation without the secret is refused too.
  absl::StatusOr<ProcessGroups> forged = CreateProcessGroups(config(1, theirs, "guess"));
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kUnavailable) << forged.status();
  EXPECT_NE(forged.status().message().find("without its secret"), std::string::npos)
      << forged.status();
  // Their own rank 1 joins: their group is whole and works.
  std::thread t1([&] { their1 = CreateProcessGroups(config(1, theirs, "s2")); });
  t0.join();
  t1.join();
  ASSERT_TRUE(their0.ok()) << their0.status();
  ASSERT_TRUE(their1.ok()) << their1.status();
  std::vector<torch::Tensor> a = {torch::ones({3})}, b = {torch::full({3}, 2.0)};
  std::thread r0([&] { EXPECT_TRUE(their0->world->AllReduceSum(a).ok()); });
  EXPECT_TRUE(their1->world->AllReduceSum(b).ok());
  r0.join();
  EXPECT_TRUE(torch::equal(a[0], torch::full({3}, 3.0)));
  EXPECT_TRUE(torch::equal(b[0], torch::full({3}, 3.0)));
}

TEST(CommunicatorTest, WorldOfOneNeedsNoStore) {
  CommConfig config;  // world 1, port 0
  auto groups = CreateProcessGroups(config);
  ASSERT_TRUE(groups.ok()) << groups.status();
  auto in = torch::arange(6, torch::kFloat).view({3, 2});
  auto out = torch::zeros_like(in);
  ASSERT_TRUE(groups->sp->AllToAll(out, in).ok());
  EXPECT_TRUE(torch::equal(out, in));
  EXPECT_EQ(groups->sp->bytes_sent(), 0);
  auto x = torch::randn({2, 4, 6, 3}).requires_grad_(true);
  EXPECT_TRUE(torch::equal(SeqAllToAll(x, groups->sp.get(), 2, 1), x));
}

TEST(CommunicatorTest, ConfigValidationNamesFieldValueAndFix) {
  CommConfig c;
  c.world_size = 6;
  c.sp_size = 4;
  c.master_port = 1234;
  absl::Status st = ValidateCommConfig(c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("comm.sp_size: 4"), std::string::npos) << st;
  c.sp_size = 2;
  c.rank = 6;
  EXPECT_NE(ValidateCommConfig(c).message().find("comm.rank: 6"), std::string::npos);
  c.rank = 0;
  c.master_port = 0;
  EXPECT_NE(ValidateCommConfig(c).message().find("comm.master_port"), std::string::npos);
  c.master_port = 1234;
  c.backend = "mpi";
  EXPECT_NE(ValidateCommConfig(c).message().find("comm.backend: 'mpi'"), std::string::npos);
  c.backend = "gloo";
  c.device = "cuda:x";
  EXPECT_NE(ValidateCommConfig(c).message().find("comm.device: 'cuda:x'"), std::string::npos);
  c.device = "cuda:0";  // gloo stages CUDA tensors through host memory
  EXPECT_TRUE(ValidateCommConfig(c).ok());
  c.device = "cpu";
  EXPECT_TRUE(ValidateCommConfig(c).ok());
}

// NCCL needs a CUDA build, a CUDA libtorch and a GPU. CI machines have none, so
// there this test skips, and ctest shows its own entry (communicator_test_nccl, see
// tests/worker/engine/parallel/CMakeLists.txt) as "Skipped"; it runs on the GPU machine.
TEST(CommunicatorTest, NcclWorldOfOneOnGpu) {
#ifndef ULYSSES_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA/NCCL (nccl.h and a CUDA toolkit were not found at "
                  "configure time): the NCCL communicator is tested only on a GPU machine";
#else
  if (internal::CudaDeviceCount() == 0 || !torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device visible, or libtorch was built without CUDA: the NCCL "
                    "communicator is tested only on a GPU machine";
  }
  CommConfig config;
  config.backend = "nccl";
  config.device = "cuda:0";
  auto groups = CreateProcessGroups(config);
  ASSERT_TRUE(groups.ok()) << groups.status();
  auto in = torch::arange(8, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA));
  auto out = torch::zeros_like(in);
  ASSERT_TRUE(groups->sp->AllToAll(out, in).ok());
  EXPECT_TRUE(torch::equal(out.cpu(), in.cpu()));
  std::vector<torch::Tensor> t = {in.clone()};
  ASSERT_TRUE(groups->world->AllReduceSum(t).ok());
  EXPECT_TRUE(torch::equal(t[0].cpu(), in.cpu()));
  ASSERT_TRUE(groups->world->Barrier().ok());
#endif
}

}  // namespace
}  // namespace ulysses::engine

ULYSSES_RANK_CHILD_MAIN(ulysses::engine::Dispatch);
