"""What each cloud's overlay gives the workers (issue 48), checked on what kustomize renders:
the fabric between nodes (device resources, NCCL / libfabric settings, the image's fabric
libraries), GPU node selection and the peak FLOP/s that goes with it, the coordinator off the
GPU nodes, and the spot / consolidation annotations.

Imported by check_deploy.py (deploy_k8s_test); self-contained (no import from it).
"""
import copy
import os
import re
import unittest

from check_admin import K8S, ROOT, find, pod_security_problems, read_text, render

__all__ = ["FabricTest", "PlacementTest", "SpotTest", "KedaTest"]

OVERLAYS = ("eks", "gke", "onprem")
CONTAINERFILE = os.path.join(ROOT, "deploy", "images", "Containerfile.gpu-worker")

# Per overlay: the device resources the worker must request (name -> count), the environment
# NCCL / libfabric must see, the library the image must carry for it, the GPU node label.
CLOUD = {
    "eks": {
        "resources": {"vpc.amazonaws.com/efa": 32, "hugepages-2Mi": "5120Mi"},
        "env": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_NET_PLUGIN": "ofi"},
        "image": ["efa_installer.sh", "/opt/amazon/ofi-nccl/lib", "rdma-core"],
        "node": ("node.kubernetes.io/instance-type", "p5.48xlarge"),
        "marker": "FI_PROVIDER",
    },
    "gke": {
        "resources": {},
        "env": {"NCCL_FASTRAK_CTRL_DEV": "eth0",
                "NCCL_FASTRAK_IFNAME": "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8",
                "NCCL_SOCKET_IFNAME": "eth0", "NCCL_TUNER_PLUGIN": "libnccl-tuner.so"},
        "image": ["/usr/local/nvidia/lib64"],
        "node": ("cloud.google.com/gke-accelerator", "nvidia-h100-mega-80gb"),
        "marker": "NCCL_FASTRAK_IFNAME",
    },
    "onprem": {
        "resources": {"rdma/rdma_shared_device_a": 1},
        "env": {"NCCL_IB_HCA": "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7",
                "NCCL_SOCKET_IFNAME": "eth0"},
        "image": ["rdma-core", "ibverbs-providers"],
        "node": ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        "marker": "NCCL_IB_HCA",
    },
}
# Dense bf16 FLOP/s per GPU model a node label names (vendor data sheets).
PEAK_FLOPS = {"p5.48xlarge": 989e12, "nvidia-h100-mega-80gb": 989e12,
              "NVIDIA-H100-80GB-HBM3": 989e12}


_RENDERED = {}


def overlay_objects(overlay):
    """The rendered overlay (rendered once per run; callers must not change it)."""
    if overlay not in _RENDERED:
        _RENDERED[overlay] = render(os.path.join(K8S, "overlays", overlay))
    return _RENDERED[overlay]


def worker(objects):
    return find(objects, "StatefulSet", "ulysses-worker")["spec"]["template"]


def container(template, name="worker"):
    (c,) = [c for c in template["spec"]["containers"] if c["name"] == name]
    return c


def env_of(c):
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def fabric_problems(objects, overlay):
    """What the rendered `objects` lack of `overlay`'s fabric (empty: all there)."""
    want = CLOUD[overlay]
    template = worker(objects)
    c = container(template)
    problems = []
    for name, count in want["resources"].items():
        for side in ("requests", "limits"):
            got = c["resources"].get(side, {}).get(name)
            if got != count:
                problems.append(f"{side}[{name}] = {got!r}, want {count!r}")
    env = env_of(c)
    for name, value in want["env"].items():
        if env.get(name) != value:
            problems.append(f"env {name} = {env.get(name)!r}, want {value!r}")
    if "hugepages-2Mi" in want["resources"]:
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        if volumes.get(mounts.get("/dev/hugepages"), {}).get("emptyDir", {}).get("medium") != "HugePages":
            problems.append("no HugePages emptyDir on /dev/hugepages")
    return problems


class FabricTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rendered = {o: overlay_objects(o) for o in OVERLAYS}

    def test_each_overlay_gives_its_clouds_fabric(self):
        for overlay, objects in self.rendered.items():
            with self.subTest(overlay=overlay):
                self.assertEqual(fabric_problems(objects, overlay), [])
                # No other cloud's fabric leaks in.
                env = env_of(container(worker(objects)))
                for other in OVERLAYS:
                    if other != overlay:
                        self.assertNotIn(CLOUD[other]["marker"], env, f"{overlay} has {other}'s fabric")

    def test_the_check_notices_a_missing_fabric(self):
        base = render(os.path.join(K8S, "base"))
        for overlay in OVERLAYS:
            self.assertNotEqual(fabric_problems(base, overlay), [], overlay)
        broken = copy.deepcopy(self.rendered["eks"])
        c = container(worker(broken))
        del c["resources"]["limits"]["vpc.amazonaws.com/efa"]
        self.assertEqual(fabric_problems(broken, "eks"),
                         ["limits[vpc.amazonaws.com/efa] = None, want 32"])

    def test_fabric_adds_no_capability_to_the_worker(self):
        # IB / EFA register memory with an unlimited RLIMIT_MEMLOCK from the runtime, no IPC_LOCK:
        # the worker container passes `restricted` on every cloud.
        for overlay, objects in self.rendered.items():
            with self.subTest(overlay=overlay):
                template = copy.deepcopy(worker(objects))
                template["spec"]["containers"] = [container(template)]
                template["spec"]["volumes"] = [
                    v for v in template["spec"]["volumes"] if "hostPath" not in v]
                self.assertEqual(pod_security_problems(template["spec"], "restricted"), [])

    def test_tcpxo_sidecar_is_what_needs_privileged_on_gke(self):
        objects = self.rendered["gke"]
        template = worker(objects)
        annotations = template["metadata"]["annotations"]
        self.assertEqual(annotations["networking.gke.io/default-interface"], "eth0")
        interfaces = re.findall(r'"interfaceName":"(eth\d)"', annotations["networking.gke.io/interfaces"])
        self.assertEqual(interfaces, [f"eth{i}" for i in range(9)])
        self.assertIn("tcpxo-daemon", [c["name"] for c in template["spec"]["containers"]])
        self.assertIn("/dev/nvidia7", annotations["devices.gke.io/container.tcpxo-daemon"])
        self.assertEqual(container(template)["name"], template["spec"]["containers"][0]["name"])
        problems = pod_security_problems(template["spec"], "baseline")
        self.assertTrue(problems)
        self.assertTrue(all("tcpxo-daemon" in p or "hostPath" in p for p in problems), problems)
        ns = find(objects, "Namespace")["metadata"]["labels"]
        self.assertEqual(ns["pod-security.kubernetes.io/enforce"], "privileged")
        self.assertEqual(ns["pod-security.kubernetes.io/warn"], "restricted")
        for overlay in ("eks", "onprem"):
            ns = find(self.rendered[overlay], "Namespace")["metadata"]["labels"]
            self.assertNotEqual(ns["pod-security.kubernetes.io/enforce"], "privileged", overlay)

    def test_image_carries_each_clouds_libraries(self):
        text = read_text(CONTAINERFILE)
        final = text[text.rindex("\nFROM "):]  # the runtime stage
        for overlay in OVERLAYS:
            for needle in CLOUD[overlay]["image"]:
                self.assertIn(needle, final, f"{overlay}: the runtime image lacks {needle}")
        m = re.search(r"^ENV LD_LIBRARY_PATH=(\S+)", final, re.M)
        self.assertIsNotNone(m)
        for d in ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib", "/usr/local/nvidia/lib64"):
            self.assertIn(d, m.group(1).split(":"))


class PlacementTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rendered = {o: overlay_objects(o) for o in OVERLAYS}

    def test_workers_on_the_clouds_gpu_nodes_with_its_peak(self):
        for overlay, objects in self.rendered.items():
            with self.subTest(overlay=overlay):
                template = worker(objects)
                key, value = CLOUD[overlay]["node"]
                self.assertEqual(template["spec"]["nodeSelector"], {key: value})
                c = container(template)
                self.assertIn("--peak-flops=$(ULYSSES_PEAK_FLOPS)", c["args"])
                self.assertEqual(float(env_of(c)["ULYSSES_PEAK_FLOPS"]), PEAK_FLOPS[value])
                self.assertTrue(any(a == f"--node=$(NODE_NAME)" for a in c["args"]))

    def test_coordinator_off_the_gpu_nodes(self):
        for overlay, objects in self.rendered.items():
            with self.subTest(overlay=overlay):
                pod = find(objects, "Deployment", "ulysses-coordinator")["spec"]["template"]["spec"]
                key, value = CLOUD[overlay]["node"]
                terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                for term in terms:  # every term (ORed) must exclude the GPU nodes
                    excluded = any(
                        e["key"] == key and (e["operator"] == "DoesNotExist" or
                                             (e["operator"] == "NotIn" and value in e["values"]))
                        for e in term["matchExpressions"])
                    self.assertTrue(excluded, f"{overlay}: {term}")
                self.assertNotIn("nodeSelector", pod)
                tolerations = [t.get("key") for t in pod.get("tolerations", [])]
                self.assertNotIn("nvidia.com/gpu", tolerations)


class SpotTest(unittest.TestCase):
    def test_spot_component_refuses_no_eviction(self):
        from check_admin import render_with
        pdb = find(render_with(["spot"]), "PodDisruptionBudget", "ulysses-worker")["spec"]
        self.assertEqual(pdb["maxUnavailable"], "100%")
        self.assertNotIn("minAvailable", pdb)
        base = find(overlay_objects("eks"), "PodDisruptionBudget", "ulysses-worker")["spec"]
        self.assertEqual(base["maxUnavailable"], 1)  # on-demand pools: drains one at a time

    def test_workers_are_not_disrupted_voluntarily(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                annotations = worker(overlay_objects(overlay))["metadata"]["annotations"]
                self.assertEqual(annotations.get("karpenter.sh/do-not-disrupt"), "true")
                self.assertEqual(annotations.get("cluster-autoscaler.kubernetes.io/safe-to-evict"), "false")


class KedaTest(unittest.TestCase):
    def test_scaled_object_scales_the_worker_statefulset_on_wanted_workers(self):
        from check_admin import render_with
        from deploy_common import catalog, metric_names
        objects = render_with(["monitoring", "cert-manager", "keda"])
        so = find(objects, "ScaledObject", "ulysses-worker")
        sts = find(objects, "StatefulSet", "ulysses-worker")
        ns = find(objects, "Namespace")["metadata"]["name"]
        self.assertEqual(so["metadata"]["namespace"], ns)
        self.assertEqual(so["spec"]["scaleTargetRef"],
                         {"apiVersion": sts["apiVersion"], "kind": "StatefulSet",
                          "name": sts["metadata"]["name"]})
        self.assertGreaterEqual(so["spec"]["minReplicaCount"], 1)
        (trigger,) = so["spec"]["triggers"]
        self.assertEqual(trigger["type"], "prometheus")
        query = trigger["metadata"]["query"]
        self.assertIn("ulysses_wanted_workers", metric_names(query))
        self.assertEqual(metric_names(query) - set(catalog()), set(), query)
        # replicas = ceil(query / threshold): the query is a worker count.
        self.assertEqual(trigger.get("metricType"), "AverageValue")
        self.assertEqual(trigger["metadata"]["threshold"], "1")
        # Scale-in one worker at a time (idle ones: the metric never drops below the highest busy
        # ordinal + 1, PoolDemandTest.ScaleInRemovesOnlyIdleWorkers).
        down = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        self.assertEqual(down["policies"], [{"type": "Pods", "value": 1, "periodSeconds": 300}])
        # New workers need certificates no projected Secret lists: the CSI driver's.
        tls = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
        self.assertEqual(tls["csi"]["driver"], "csi.cert-manager.io")
