"""The deploy matches its jobs (issue #13 item 4, issue #24 item 6): what `kubectl kustomize
deploy/k8s` renders against every shipped job config (configs/jobs), sized by `ulyssesctl plan`.
Imported by check_deploy.py (deploy_k8s_test)."""
import base64
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

from check_admin import pod_security_problems
from deploy_common import *  # noqa: F401,F403


# --- The deploy matches its jobs (issue #13 item 4) ---------------------------------------
# Checked on what `kubectl kustomize deploy/k8s` renders, against every shipped job config
# (configs/jobs) and the coordinator config. Each check is a function returning its problems,
# so DeployMatchesJobsTest can also show that each one notices a broken manifest.

def shipped_jobs():
    """name -> {"spec": the parsed spec, "text": the file} for every configs/jobs/*.yaml."""
    jobs = {}
    for name in sorted(os.listdir(JOBS)):
        if name.endswith(".yaml"):
            text = read_text(os.path.join(JOBS, name))
            jobs[name] = {"spec": yaml.safe_load(text)["spec"], "text": text}
    return jobs


def stage_worlds(spec):
    """sp x dp of every stage, by the spec's rule (JobSpec::StageSp/StageDp in
    common/spec/job_spec.h): a stage's own degree, else spec.parallelism's, else 1."""
    par = spec.get("parallelism") or {}
    sp, dp = par.get("sp_degree", 1), par.get("dp_degree", 1)
    return [st.get("sp_degree", sp) * st.get("dp_degree", dp) for st in spec["stages"]]


def job_paths(job):
    """(field, path) for every file path a job config uses, including a commented-out
    `# init_from: /path` (the configs say to uncomment it to start from pretrained weights)."""
    spec = job["spec"]
    out = []
    data = spec.get("data") or {}
    for key in ("train", "validation"):
        if isinstance(data.get(key), str):
            out.append((f"data.{key}", data[key]))
    if (spec.get("model") or {}).get("init_from"):
        out.append(("model.init_from", spec["model"]["init_from"]))
    for m in re.finditer(r"^\s*#\s*init_from:\s*(\S+)", job["text"], re.M):
        out.append(("model.init_from (commented)", m.group(1)))
    if (spec.get("checkpoint") or {}).get("dir"):
        out.append(("checkpoint.dir", spec["checkpoint"]["dir"]))
    return out


def plan(config):
    """`ulyssesctl plan -o json` rows (one per stage) of a job config."""
    if not os.path.exists(CLI_TOOL):
        raise AssertionError(f"{CLI_TOOL} not found: set ULYSSES_CLI_TOOL to ulyssesctl "
                             "(the planner's host-memory figures size the worker pods)")
    proc = subprocess.run([CLI_TOOL, "plan", "-f", config, "--device-type", "h100", "-o", "json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"ulyssesctl plan -f {config}: {proc.stderr}")
    return json.loads(proc.stdout)


def host_bytes_per_rank(row):
    """Host memory one rank may hold (an upper bound), as `ulyssesctl plan` prints it: the
    largest of the steady state (host_bytes: offloaded optimizer state, parameter chunk copy
    and activations; plus a checkpoint save's asynchronous snapshot, or a synchronous save's
    copies of the device state), the stage-0 init/import and the resume (the loaded share of
    the checkpoint next to the state being restored: common/spec/memory_model.h
    StartupPerRank)."""
    return row["host_peak_bytes_per_rank"]


def single_node(rows):
    """True when every stage of a planned job runs on one node (the planner's `nodes`)."""
    return all(row["nodes"] == 1 for row in rows)


def pod_memory_need(rows, gpus, shm):
    """A worker pod's memory for a job: its ranks' largest host peak x GPUs + /dev/shm."""
    return gpus * max(host_bytes_per_rank(row) for row in rows) + shm


class Rendered:
    """The rendered worker StatefulSet, coordinator Deployment, PDB and coordinator config."""

    def __init__(self, objects):
        self.objects = objects
        by_kind = {}
        for d in objects:
            by_kind.setdefault(d["kind"], []).append(d)
        self.sts = next(d for d in by_kind.get("StatefulSet", []) if d["metadata"]["name"] == "ulysses-worker")
        self.dep = next(d for d in by_kind.get("Deployment", []) if d["metadata"]["name"] == "ulysses-coordinator")
        self.pdbs = by_kind.get("PodDisruptionBudget", [])
        cm = next(d for d in by_kind["ConfigMap"]
                  if d["metadata"]["name"].startswith("ulysses-coordinator-config"))
        self.coordinator_config = yaml.safe_load(cm["data"]["coordinator.yaml"])
        self.namespace = self.sts["metadata"].get("namespace")

    @property
    def worker_pod(self):
        return self.sts["spec"]["template"]["spec"]

    @property
    def worker(self):
        return self.worker_pod["containers"][0]

    @property
    def coordinator_pod(self):
        return self.dep["spec"]["template"]["spec"]

    @property
    def coordinator(self):
        return self.coordinator_pod["containers"][0]

    def gpus(self):
        return int(self.worker.get("resources", {}).get("limits", {}).get(GPU, 0))

    def flag(self, name):
        values = [a.split("=", 1)[1] for a in self.worker.get("args", []) if a.startswith(name + "=")]
        return values[0] if len(values) == 1 else None


def mount_for(path, container, pod):
    """The (mountPath, volume) of `container` whose mount holds `path`, or None."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    best = None
    for m in container.get("volumeMounts", []):
        root = m["mountPath"].rstrip("/") or "/"
        if path == root or path.startswith(root + "/"):
            if best is None or len(root) > len(best[0]):
                best = (root, volumes.get(m["name"], {}))
    return best


def check_one_worker_per_node(r):
    problems = []
    labels = r.sts["spec"]["template"]["metadata"]["labels"]
    terms = (((r.worker_pod.get("affinity") or {}).get("podAntiAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    if not any(t.get("topologyKey") == "kubernetes.io/hostname" and
               t.get("labelSelector", {}).get("matchLabels") and
               t["labelSelector"]["matchLabels"].items() <= labels.items() for t in terms):
        problems.append("no required podAntiAffinity on kubernetes.io/hostname selecting the "
                        "worker pods: two workers could share a node")
    return problems


def check_all_gpus_of_the_node(r):
    problems = []
    res = r.worker.get("resources", {})
    limits, requests = res.get("limits", {}), res.get("requests", {})
    if r.gpus() < 8:
        problems.append(f"{GPU} limit {limits.get(GPU)}: a worker takes all 8 GPUs of its node")
    if requests.get(GPU) != limits.get(GPU):
        problems.append(f"{GPU} requests {requests.get(GPU)} != limits {limits.get(GPU)}")
    if r.flag("--devices") != "auto" or r.flag("--device") is not None:
        problems.append("the worker must run --devices=auto (one rank per GPU it was given)")
    return problems


def check_dev_shm(r):
    problems = []
    found = mount_for("/dev/shm", r.worker, r.worker_pod)
    if found is None or found[0] != "/dev/shm":
        return ["/dev/shm is not a volume mount: NCCL gets the runtime's 64 MiB default"]
    empty_dir = found[1].get("emptyDir")
    if not empty_dir or empty_dir.get("medium") != "Memory":
        problems.append("/dev/shm is not a Memory emptyDir")
    elif quantity_bytes(empty_dir.get("sizeLimit", "0")) < 8 * 2**30:
        problems.append(f"/dev/shm sizeLimit {empty_dir.get('sizeLimit')} < 8Gi for 8 ranks")
    return problems


def check_worker_restricted(r):
    """The worker pod passes Pod Security `restricted` (check_admin.pod_security_problems):
    no IPC_LOCK (memlock comes from the runtime's limit, docs/DEPLOY.md "Pod Security")."""
    return pod_security_problems(r.worker_pod, "restricted")


def check_capacity(r, jobs):
    largest = max((max(stage_worlds(j["spec"])), name) for name, j in jobs.items())
    gpus = r.gpus()
    have = r.sts["spec"].get("replicas", 1) * gpus
    if have < largest[0] + gpus:
        return [f"replicas x GPUs = {have} < {largest[0]} (largest stage world size, "
                f"{largest[1]}) + {gpus} (one node to spare for node loss)"]
    return []


def check_mounts(r, jobs):
    problems = []
    cfg = r.coordinator_config
    paths = [(f"{name}: {field}", path) for name, job in jobs.items()
             for field, path in job_paths(job)]
    paths += [("coordinator config checkpoint_root", cfg["checkpoint_root"]),
              ("coordinator config out_root", cfg["out_root"])]
    paths += [("coordinator config data_roots", root) for root in cfg.get("data_roots", [])]
    for what, path in paths:
        found = {}
        for who, container, pod in (("worker", r.worker, r.worker_pod),
                                    ("coordinator", r.coordinator, r.coordinator_pod)):
            found[who] = mount_for(path, container, pod)
            if found[who] is None:
                problems.append(f"{what} {path}: no mount holds it in the {who} pod")
        if all(found.values()):
            claims = {who: (f[0], f[1].get("persistentVolumeClaim", {}).get("claimName"))
                      for who, f in found.items()}
            if claims["worker"] != claims["coordinator"] or claims["worker"][1] is None:
                problems.append(f"{what} {path}: not the same claim at the same path in both "
                                f"pods ({claims})")
    # The coordinator accepts these paths only under its roots (coordinator/path_policy.h).
    def under(path, root):
        return path == root or path.startswith(root.rstrip("/") + "/")
    for name, job in jobs.items():
        for field, path in job_paths(job):
            roots = ([cfg["checkpoint_root"]] if field == "checkpoint.dir"
                     else cfg.get("data_roots", []))
            if not any(under(path, root) for root in roots):
                problems.append(f"{name}: {field} {path} is outside the coordinator's {roots}")
    work_dir = r.flag("--work-dir")
    if work_dir is None or mount_for(work_dir, r.worker, r.worker_pod) is None:
        problems.append(f"--work-dir {work_dir} is not on a mounted volume")
    return problems


def check_no_namespace_in_containers(r):
    """Names in container args/env may use the Service's short name or $(POD_NAMESPACE); a
    literal namespace or the cluster domain would break a deploy into another namespace."""
    problems = []
    for who, c in (("worker", r.worker), ("coordinator", r.coordinator)):
        values = list(c.get("command", [])) + list(c.get("args", []))
        values += [e["value"] for e in c.get("env", []) if "value" in e]
        for v in values:
            for m in re.finditer(r"([\w$().-]+)\.svc\b", v):
                if not m.group(1).endswith(".$(POD_NAMESPACE)"):
                    problems.append(f"{who}: {v!r} names a namespace ({m.group(0)})")
            if "cluster.local" in v:
                problems.append(f"{who}: {v!r} names the cluster domain")
            if r.namespace and re.search(r"\." + re.escape(r.namespace) + r"(\.|:|$)", v):
                problems.append(f"{who}: {v!r} names the namespace {r.namespace}")
    env = {e["name"]: e for e in r.worker.get("env", [])}
    if any("$(POD_NAMESPACE)" in a for a in r.worker.get("args", [])):
        ref = env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {})
        if ref.get("fieldPath") != "metadata.namespace":
            problems.append("$(POD_NAMESPACE) is not the downward API's metadata.namespace")
    coordinator = r.flag("--coordinator") or ""
    if coordinator.rsplit(":", 1)[0] != r.dep["metadata"]["name"]:
        problems.append(f"--coordinator {coordinator}: not the Service's short name")
    return problems


def check_memory(r, plans):
    problems = []
    res = r.worker.get("resources", {})
    limit, request = res.get("limits", {}).get("memory"), res.get("requests", {}).get("memory")
    if limit is None or request != limit:
        return [f"memory requests {request} != limits {limit}"]
    per_rank, which = max((host_bytes_per_rank(row), f"{name} stage {row['stage']} "
                           f"({row['host_peak_phase']})")
                          for name, rows in plans.items() for row in rows)
    found = mount_for("/dev/shm", r.worker, r.worker_pod)
    shm = quantity_bytes(((found or (None, {}))[1].get("emptyDir") or {}).get("sizeLimit", "0"))
    need = r.gpus() * per_rank + shm
    if quantity_bytes(limit) < need:
        problems.append(f"memory limit {limit} < {need / 2**30:.1f} GiB: {r.gpus()} ranks x "
                        f"{per_rank / 2**30:.1f} GiB ({which}: the planner's host peak per rank) "
                        f"+ /dev/shm {shm / 2**30:.0f} GiB (tmpfs counts against it)")
    return problems


def check_grace(r, plans):
    problems = []
    grace = r.worker_pod.get("terminationGracePeriodSeconds", 30)
    agent = r.flag("--grace-period-s")
    if agent is None or float(agent) >= grace:
        problems.append(f"terminationGracePeriodSeconds {grace} must exceed --grace-period-s "
                        f"{agent} (the agent's own SIGKILL tier comes first)")
    # SIGTERM is acted on at the end of the running step (worker/engine/train/engine.cc), so
    # the agent's grace must cover the longest step the shipped jobs take (the planner's
    # estimate on an H100) before the checkpoint even starts.
    step, which = max((row["step_seconds"], f"{name} stage {row['stage']}")
                      for name, rows in plans.items() for row in rows)
    if agent is not None and float(agent) < step:
        problems.append(f"--grace-period-s {agent} < the longest step ({which}, ~{step:.0f} s): "
                        f"a drain would kill ranks before they reach the checkpoint")
    cancel = r.coordinator_config.get("cancel_grace_s", 30)
    if cancel >= grace:
        problems.append(f"cancel_grace_s {cancel} >= terminationGracePeriodSeconds {grace}")
    return problems


def check_pdb(r):
    labels = r.sts["spec"]["template"]["metadata"]["labels"]
    for pdb in r.pdbs:
        sel = pdb["spec"].get("selector", {}).get("matchLabels", {})
        if sel and sel.items() <= labels.items():
            if pdb["spec"].get("maxUnavailable") != 1:
                return [f"PDB {pdb['metadata']['name']}: maxUnavailable "
                        f"{pdb['spec'].get('maxUnavailable')} (a drain must take one worker "
                        "at a time)"]
            return []
    return ["no PodDisruptionBudget selects the worker pods"]


class DeployMatchesJobsTest(unittest.TestCase):
    """The rendered kustomization against the shipped job configs: one worker pod per GPU
    node with all its GPUs, /dev/shm and IPC_LOCK for NCCL, enough nodes for the largest
    stage plus one spare, every config path mounted in both pods, no namespace baked into
    a container, memory for a checkpoint save, a grace period for a step and a save, a PDB."""

    @classmethod
    def setUpClass(cls):
        cls.objects = render()
        cls.jobs = shipped_jobs()
        all_plans = {name: plan(os.path.join(JOBS, name)) for name in cls.jobs}
        # The base deployment runs the one-node jobs (plus a spare node); a multi-node job
        # (configs/jobs/llama3-70b-256k.yaml) needs more replicas and pod memory, which
        # docs/DEPLOY.md "Multi-node jobs" states from the same plan (checked below).
        cls.multi_node = {n: rows for n, rows in all_plans.items() if not single_node(rows)}
        cls.plans = {n: rows for n, rows in all_plans.items() if single_node(rows)}
        cls.all_jobs = cls.jobs
        cls.jobs = {n: j for n, j in cls.jobs.items() if n in cls.plans}

    def rendered(self, mutate=None):
        objects = json.loads(json.dumps(self.objects))
        r = Rendered(objects)
        if mutate:
            mutate(r)
        return r

    def checks(self):
        return {
            "one_worker_per_node": lambda r: check_one_worker_per_node(r),
            "all_gpus": lambda r: check_all_gpus_of_the_node(r),
            "dev_shm": lambda r: check_dev_shm(r),
            "pod_security": lambda r: check_worker_restricted(r),
            "capacity": lambda r: check_capacity(r, self.jobs),
            "mounts": lambda r: check_mounts(r, self.all_jobs),
            "namespace": lambda r: check_no_namespace_in_containers(r),
            "memory": lambda r: check_memory(r, self.plans),
            "grace": lambda r: check_grace(r, self.plans),
            "pdb": lambda r: check_pdb(r),
        }

    def test_shipped_configs_and_plans_agree(self):
        self.assertEqual(len(self.all_jobs), len(os.listdir(JOBS)))
        for name, job in self.jobs.items():
            worlds = stage_worlds(job["spec"])
            self.assertEqual([row["world_size"] for row in self.plans[name]], worlds, name)
        self.assertEqual(max(max(stage_worlds(j["spec"])) for j in self.jobs.values()), 8)
        self.assertIn("llama3-70b-256k.yaml", self.multi_node)

    def test_multi_node_jobs_state_their_pods_in_deploy_md(self):
        """Each multi-node job's replicas (nodes + a spare) and pod memory, derived from its
        plan (GPUs x the largest host peak per rank + /dev/shm), are in docs/DEPLOY.md."""
        r = self.rendered()
        found = mount_for("/dev/shm", r.worker, r.worker_pod)
        shm = quantity_bytes(((found or (None, {}))[1].get("emptyDir") or {}).get("sizeLimit", "0"))
        doc = read_text(os.path.join(ROOT, "docs", "DEPLOY.md"))
        for name, rows in self.multi_node.items():
            need_gib = math.ceil(pod_memory_need(rows, r.gpus(), shm) / 2**30)
            nodes = max(row["nodes"] for row in rows)
            line = f"`configs/jobs/{name}`: replicas {nodes + 1}, memory {need_gib}Gi"
            self.assertIn(line, doc, f"docs/DEPLOY.md must state {line!r} (from ulyssesctl plan)")

    def test_one_worker_pod_per_node(self):
        self.assertEqual(check_one_worker_per_node(self.rendered()), [])

    def test_all_gpus_of_the_node_and_devices_auto(self):
        self.assertEqual(check_all_gpus_of_the_node(self.rendered()), [])

    def test_dev_shm_is_memory(self):
        self.assertEqual(check_dev_shm(self.rendered()), [])

    def test_worker_pod_passes_restricted(self):
        self.assertEqual(check_worker_restricted(self.rendered()), [])

    def test_nodes_cover_the_largest_stage_plus_a_spare(self):
        self.assertEqual(check_capacity(self.rendered(), self.jobs), [])

    def test_every_config_path_is_mounted_in_both_pods(self):
        self.assertEqual(check_mounts(self.rendered(), self.all_jobs), [])

    def test_no_namespace_in_containers(self):
        self.assertEqual(check_no_namespace_in_containers(self.rendered()), [])

    def test_memory_covers_a_checkpoint_save(self):
        self.assertEqual(check_memory(self.rendered(), self.plans), [])

    def test_grace_covers_a_step_and_the_agent(self):
        self.assertEqual(check_grace(self.rendered(), self.plans), [])

    def test_pdb_takes_one_worker_at_a_time(self):
        self.assertEqual(check_pdb(self.rendered()), [])

    def test_another_namespace_moves_everything(self):
        # The kustomization's namespace: is the one place: a copy with another one renders
        # every object there and still passes the checks above.
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "k8s")
            shutil.copytree(K8S, copy)
            path = os.path.join(copy, "base", "kustomization.yaml")
            text = read_text(path)
            changed = re.sub(r"^namespace: .*$", "namespace: team-a", text, flags=re.M)
            self.assertNotEqual(changed, text)
            with open(path, "w", encoding="utf-8") as f:
                f.write(changed)
            objects = render(os.path.join(copy, "overlays", "eks"))
        for d in objects:
            if d["kind"] == "Namespace":
                self.assertEqual(d["metadata"]["name"], "team-a")
            elif d["kind"] not in CLUSTER_SCOPED:
                self.assertEqual(d["metadata"].get("namespace"), "team-a", d["metadata"]["name"])
        r = Rendered(objects)
        for name, check in self.checks().items():
            self.assertEqual(check(r), [], name)

    def test_each_check_notices_a_broken_manifest(self):
        def set_(path, value):
            def mutate(r):
                obj = r
                *head, last = path
                for key in head:
                    obj = getattr(obj, key) if isinstance(key, str) and hasattr(obj, key) else obj[key]
                obj[last] = value
            return mutate

        def args(fn):
            def mutate(r):
                r.worker["args"] = fn(r.worker["args"])
            return mutate

        def limits(key, value):
            def mutate(r):
                r.worker["resources"]["limits"][key] = value
                r.worker["resources"]["requests"][key] = value
            return mutate

        def shm(r):
            r.worker["volumeMounts"] = [m for m in r.worker["volumeMounts"]
                                        if m["mountPath"] != "/dev/shm"]

        def shared_path(who):
            def mutate(r):
                c = r.worker if who == "worker" else r.coordinator
                for m in c["volumeMounts"]:
                    if m["mountPath"] == "/shared":
                        m["mountPath"] = "/mnt/shared"
            return mutate

        def drop_pdb(r):
            r.pdbs.clear()

        def grace(r):
            r.worker["args"] = [a if not a.startswith("--grace-period-s=")
                                else "--grace-period-s=60" for a in r.worker["args"]]

        breaks = [
            ("one_worker_per_node", set_(["worker_pod", "affinity"], {})),
            ("one_worker_per_node", lambda r: r.worker_pod["affinity"]["podAntiAffinity"]
             ["requiredDuringSchedulingIgnoredDuringExecution"][0].update(topologyKey="topology.kubernetes.io/zone")),
            ("all_gpus", limits(GPU, 1)),
            ("all_gpus", lambda r: r.worker["resources"]["requests"].update({GPU: 4})),
            ("all_gpus", args(lambda a: [x.replace("--devices=auto", "--device=cuda:0") for x in a])),
            ("dev_shm", shm),
            ("dev_shm", lambda r: next(v for v in r.worker_pod["volumes"] if v["name"] == "dshm")
             ["emptyDir"].pop("medium", None)),
            ("pod_security", lambda r: r.worker.pop("securityContext")),
            ("pod_security", lambda r: r.worker["securityContext"]["capabilities"].update(add=["IPC_LOCK"])),
            ("capacity", set_(["sts", "spec", "replicas"], 1)),
            ("mounts", shared_path("worker")),
            ("mounts", shared_path("coordinator")),
            ("mounts", lambda r: r.coordinator_config.update(data_roots=["/shared/data"])),
            ("namespace", args(lambda a: [x.replace("ulysses-coordinator:50051",
                                                    f"ulysses-coordinator.{r_ns}.svc:50051") for x in a])),
            ("namespace", args(lambda a: [x.replace("$(POD_NAMESPACE).svc", f"{r_ns}.svc") for x in a])),
            ("memory", limits("memory", "64Gi")),
            ("memory", lambda r: r.worker["resources"]["requests"].update(memory="1Gi")),
            ("grace", set_(["worker_pod", "terminationGracePeriodSeconds"], 30)),
            ("grace", grace),
            ("pdb", drop_pdb),
            ("pdb", lambda r: r.pdbs[0]["spec"].update(maxUnavailable=3)),
        ]
        r_ns = Rendered(self.objects).namespace
        checks = self.checks()
        self.assertEqual({name for name, _ in breaks}, set(checks))
        for i, (name, mutate) in enumerate(breaks):
            with self.subTest(check=name, case=i):
                r = self.rendered(mutate)
                self.assertNotEqual(checks[name](r), [], f"{name} missed break #{i}")
