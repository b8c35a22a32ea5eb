// Fabric detection (worker/agent/fabric.h) on directory trees laid out as a pod sees /sys, /dev
// and its library path with each cloud's fabric component, and without.
#include "worker/agent/fabric.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::agent {
namespace {

namespace fs = std::filesystem;

class FabricTest : public ::testing::Test {
 protected:
  FabricTest() {
    probe_.sys_root = root() + "/sys";
    probe_.dev_root = root() + "/dev";
    probe_.library_dirs = {root() + "/opt/amazon/ofi-nccl/lib", root() + "/usr/local/nvidia/lib64",
                           root() + "/usr/lib/x86_64-linux-gnu"};
    for (const std::string& d : probe_.library_dirs) fs::create_directories(d);
  }
  std::string root() const { return dir_.path(); }
  void Touch(const std::string& rel, const std::string& text = "") {
    const fs::path p = fs::path(root()) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  // An RDMA adapter `name` of PCI `vendor` with its uverbs device in the container.
  void Adapter(const std::string& name, const std::string& vendor, int uverbs) {
    Touch("sys/class/infiniband/" + name + "/device/vendor", vendor + "\n");
    Touch("dev/infiniband/uverbs" + std::to_string(uverbs));
  }

  ::ulysses::testing::TempDir dir_{"fabric-test"};
  FabricProbe probe_;
};

TEST_F(FabricTest, NothingIsSockets) {
  const FabricReport r = DetectFabric(probe_);
  EXPECT_EQ(r.fabric, v1::FABRIC_SOCKETS);
  EXPECT_NE(r.why.find("TCP sockets"), std::string::npos) << r.why;
}

TEST_F(FabricTest, EfaNeedsTheAdaptersAndAwsOfiNccl) {
  Adapter("rdmap16s27", "0x1d0f", 0);
  Adapter("rdmap32s27", "0x1d0f", 1);
  FabricReport r = DetectFabric(probe_);
  EXPECT_EQ(r.fabric, v1::FABRIC_SOCKETS);  // The devices alone: NCCL would not use them.
  EXPECT_NE(r.why.find("no aws-ofi-nccl"), std::string::npos) << r.why;
  Touch("opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so");
  r = DetectFabric(probe_);
  EXPECT_EQ(r.fabric, v1::FABRIC_EFA) << r.why;
  EXPECT_NE(r.why.find("2 uverbs device(s)"), std::string::npos) << r.why;
}

TEST_F(FabricTest, InfinibandNeedsUverbsAndLibibverbsAndNcclIbOn) {
  Touch("sys/class/infiniband/mlx5_0/device/vendor", "0x15b3\n");  // On the node only.
  Touch("usr/lib/x86_64-linux-gnu/libibverbs.so.1");
  FabricReport r = DetectFabric(probe_);
  EXPECT_EQ(r.fabric, v1::FABRIC_SOCKETS);
  EXPECT_NE(r.why.find("no /dev/infiniband/uverbs*"), std::string::npos) << r.why;
  Touch("dev/infiniband/uverbs0");  // The rdma/* device resource gives the container one.
  r = DetectFabric(probe_);
  EXPECT_EQ(r.fabric, v1::FABRIC_IB) << r.why;
  EXPECT_NE(r.why.find("mlx5_0"), std::string::npos) << r.why;
  probe_.env["NCCL_IB_DISABLE"] = "1";
  EXPECT_EQ(DetectFabric(probe_).fabric, v1::FABRIC_SOCKETS);
  probe_.env.erase("NCCL_IB_DISABLE");
  fs::remove(fs::path(root()) / "usr/lib/x86_64-linux-gnu/libibverbs.so.1");
  r = DetectFabric(probe_);
  EXPECT_EQ(r.fabric, v1::FABRIC_SOCKETS);
  EXPECT_NE(r.why.find("no libibverbs.so.1"), std::string::npos) << r.why;
}

TEST_F(FabricTest, TcpxoNeedsTheFasTrakSettingsAndPlugin) {
  Touch("usr/local/nvidia/lib64/libnccl-net.so");
  EXPECT_EQ(DetectFabric(probe_).fabric, v1::FABRIC_SOCKETS);  // Plugin without its settings.
  probe_.env["NCCL_FASTRAK_IFNAME"] = "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8";
  const FabricReport r = DetectFabric(probe_);
  EXPECT_EQ(r.fabric, v1::FABRIC_TCPXO) << r.why;
  EXPECT_NE(r.why.find("eth1,eth2"), std::string::npos) << r.why;
}

TEST(FabricFlagTest, AutoDetectsTheNamesSetAndOthersAreRefused) {
  bool detect = false;
  ASSERT_TRUE(ParseFabricFlag("auto", &detect).ok());
  EXPECT_TRUE(detect);
  for (v1::Fabric f : {v1::FABRIC_SOCKETS, v1::FABRIC_EFA, v1::FABRIC_TCPXO, v1::FABRIC_IB}) {
    absl::StatusOr<v1::Fabric> got = ParseFabricFlag(FabricName(f), &detect);
    ASSERT_TRUE(got.ok()) << FabricName(f);
    EXPECT_EQ(*got, f);
    EXPECT_FALSE(detect);
  }
  EXPECT_FALSE(ParseFabricFlag("unspecified", &detect).ok());
  EXPECT_FALSE(ParseFabricFlag("", &detect).ok());
}

}  // namespace
}  // namespace ulysses::agent
