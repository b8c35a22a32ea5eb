#!/usr/bin/env python3
"""Checks deploy/k8s: manifests, Prometheus rules (real promtool), dashboard, and that
docs/METRICS.md, the dashboard and the rules agree with the metrics catalogue the
binaries register from (common/metrics/catalog.cc).

Run by ctest (deploy_k8s_test) with Debian's /usr/bin/python3 (python3-yaml).
ULYSSES_SOURCE_DIR points at the repository root (defaults to ../.. of this file);
ULYSSES_METRICS_CATALOG_TOOL at the metrics_catalog_dump binary (default: build/bin).
"""
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

ROOT = os.environ.get("ULYSSES_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "k8s")
BASE = os.path.join(K8S, "base")
PROM = os.path.join(K8S, "prometheus")
DASHBOARD = os.path.join(K8S, "components", "monitoring", "ulysses-dashboard.json")
METRICS_MD = os.path.join(ROOT, "docs", "METRICS.md")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
CATALOG_TOOL = os.environ.get("ULYSSES_METRICS_CATALOG_TOOL") or os.path.join(
    ROOT, "build", "bin", "metrics_catalog_dump")

# What the dashboard must show (issue: job states, tokens/s, loss, step, restarts vs
# preemptions, recovery, checkpoint durations/bytes, heartbeat ages, gang wait, all-to-all).
DASHBOARD_REQUIRED = {
    "ulysses_jobs", "ulysses_train_tokens_per_second", "ulysses_train_loss",
    "ulysses_train_step", "ulysses_job_restarts_total", "ulysses_preemptions_total",
    "ulysses_recovery_duration_seconds", "ulysses_checkpoint_save_duration_seconds",
    "ulysses_checkpoint_bytes", "ulysses_worker_heartbeat_age_seconds",
    "ulysses_gang_wait_seconds",
    # Per-rank and per-stage figures (issue #12): stragglers, memory, MFU, all-to-all,
    # evaluation by stage, work at risk.
    "ulysses_rank_step_seconds", "ulysses_rank_step_phase_seconds",
    "ulysses_rank_memory_peak_bytes", "ulysses_rank_memory_limit_bytes", "ulysses_rank_mfu_ratio",
    "ulysses_alltoall_seconds", "ulysses_alltoall_bytes_total", "ulysses_eval_accuracy",
    "ulysses_checkpoint_age_seconds", "ulysses_stage_eta_seconds", "ulysses_train_seq_len",
    "ulysses_train_group_size",
    # Goodput (issue #26): per-job ratio, lost GPU-seconds by reason, productive.
    "ulysses_job_goodput_ratio", "ulysses_lost_gpu_seconds_total",
    "ulysses_productive_gpu_seconds_total",
}

# Recording + alerting rules in ulysses-rules.yml.
RULE_COUNT = 21

# PromQL words that are not metric names.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "rate", "irate", "increase", "delta", "idelta", "deriv",
    "changes", "resets", "histogram_quantile", "abs", "absent", "absent_over_time", "ceil",
    "floor", "round", "clamp", "clamp_min", "clamp_max", "label_replace", "label_join",
    "time", "timestamp", "vector", "scalar", "sort", "sort_desc", "avg_over_time",
    "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "last_over_time",
    "predict_linear", "and", "or", "unless", "offset", "bool", "by", "without", "on",
    "ignoring", "group_left", "group_right", "inf", "nan",
}
# Series Prometheus itself provides.
BUILTIN_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def catalog():
    """name -> {"type", "labels", "binaries"}: what the binaries register."""
    out = subprocess.run([CATALOG_TOOL], stdout=subprocess.PIPE, check=True, timeout=60).stdout
    return {m["name"]: m for m in json.loads(out)}


def documented_catalogue():
    """name -> (type, labels, binaries) from the rows of docs/METRICS.md's ## Catalogue."""
    rows = {}
    section = None
    for line in read_text(METRICS_MD).splitlines():
        if line.startswith("## "):
            section = line
        if section != "## Catalogue" or not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("`")
        labels = tuple(re.findall(r"`([^`]+)`", cells[2]))
        binaries = tuple(re.findall(r"`([^`]+)`", cells[3]))
        rows[name] = (cells[1], labels, binaries)
    return rows


def recorded_series():
    rules = yaml.safe_load(read_text(os.path.join(PROM, "ulysses-rules.yml")))
    return {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def documented_metrics():
    """Names the dashboard and rules may use: the catalogue plus the recording rules."""
    return set(catalog()) | recorded_series()


def metric_names(expr):
    """Metric names used by a PromQL expression (label matchers, strings, ranges,
    grouping clauses and Grafana $variables removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    e = re.sub(r"\boffset\s+\w+", " ", e)
    names = set()
    for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        if token.lower() in PROMQL_WORDS:
            continue
        names.add(token)
    return names


def undocumented(names, documented):
    missing = set()
    for name in names:
        if name in documented or name in BUILTIN_SERIES:
            continue
        base = name
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in documented:
                base = None
                break
        if base is not None:
            missing.add(name)
    return missing


def run(cmd, cwd=None):
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60)
    return proc.returncode, proc.stdout


def kustomization_namespace():
    with open(os.path.join(BASE, "kustomization.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)["namespace"]


def base_files():
    """(kind, name) -> object of every manifest file in deploy/k8s/base, as written."""
    docs = {}
    for name in sorted(os.listdir(BASE)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(BASE, name), encoding="utf-8") as f:
            for doc in yaml.safe_load_all(f):
                if doc is None:
                    continue
                key = (doc["kind"], doc["metadata"]["name"] if "metadata" in doc else name)
                docs[key] = doc
    return docs


def load_manifests():
    """(kind, name) -> object of `kubectl kustomize deploy/k8s/base`; the generated coordinator
    ConfigMap (name-hash suffix) also under its generator name."""
    docs = {}
    for doc in render(BASE):
        docs[(doc["kind"], doc["metadata"]["name"])] = doc
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith(CONFIG_MAP + "-"):
            docs[("ConfigMap", CONFIG_MAP)] = doc
    return docs


CONFIG_MAP = "ulysses-coordinator-config"
# Cluster-scoped kinds kustomize does not put in a namespace.
CLUSTER_SCOPED = {"Namespace", "PriorityClass", "StorageClass"}


@unittest.skipUnless(os.path.exists(PROMTOOL), "promtool missing (Debian package prometheus)")
class PromtoolTest(unittest.TestCase):
    def test_check_rules(self):
        rc, out = run([PROMTOOL, "check", "rules", "ulysses-rules.yml"], cwd=PROM)
        self.assertEqual(rc, 0, out)
        self.assertIn("SUCCESS", out)

    def test_rule_unit_tests(self):
        rc, out = run([PROMTOOL, "test", "rules", "ulysses-rules_test.yml"], cwd=PROM)
        self.assertEqual(rc, 0, out)
        self.assertIn("SUCCESS", out)

    def test_rule_unit_tests_can_fail(self):
        # A copy with a broken threshold must make `promtool test rules` fail.
        with tempfile.TemporaryDirectory() as tmp:
            rules = read_text(os.path.join(PROM, "ulysses-rules.yml"))
            broken = rules.replace("(0.5 * max(ulysses_heartbeat_timeout_seconds))",
                                   "(2 * max(ulysses_heartbeat_timeout_seconds))")
            self.assertNotEqual(broken, rules)
            with open(os.path.join(tmp, "ulysses-rules.yml"), "w", encoding="utf-8") as f:
                f.write(broken)
            shutil.copy(os.path.join(PROM, "ulysses-rules_test.yml"), tmp)
            rc, out = run([PROMTOOL, "test", "rules", "ulysses-rules_test.yml"], cwd=tmp)
            self.assertNotEqual(rc, 0, out)
            self.assertIn("UlyssesWorkerHeartbeatStale", out)

    def test_straggler_rule_test_can_fail(self):
        with tempfile.TemporaryDirectory() as tmp:
            rules = read_text(os.path.join(PROM, "ulysses-rules.yml"))
            broken = rules.replace("(1.5 * job_id:ulysses_rank_step_seconds:median)",
                                   "(3 * job_id:ulysses_rank_step_seconds:median)")
            self.assertNotEqual(broken, rules)
            with open(os.path.join(tmp, "ulysses-rules.yml"), "w", encoding="utf-8") as f:
                f.write(broken)
            shutil.copy(os.path.join(PROM, "ulysses-rules_test.yml"), tmp)
            rc, out = run([PROMTOOL, "test", "rules", "ulysses-rules_test.yml"], cwd=tmp)
            self.assertNotEqual(rc, 0, out)
            self.assertIn("UlyssesStragglerRank", out)

    def test_check_scrape_config(self):
        # Debian's Prometheus is built without Kubernetes service discovery, so
        # check a copy whose kubernetes_sd_configs is swapped for a static target;
        # relabelling, rule_files and everything else are checked as written.
        config = yaml.safe_load(read_text(os.path.join(PROM, "prometheus.yml")))
        job = config["scrape_configs"][0]
        self.assertEqual(job["job_name"], "ulysses-coordinator")  # Used by UlyssesCoordinatorDown.
        self.assertEqual([j["job_name"] for j in config["scrape_configs"]],
                         ["ulysses-coordinator", "ulysses-worker"])  # ulysses-worker: UlyssesWorkerLost.
        for port, job in zip((9090, 9091), config["scrape_configs"]):
            self.assertEqual(job["kubernetes_sd_configs"][0]["role"], "pod")
            del job["kubernetes_sd_configs"]
            job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
                yaml.safe_dump(config, f)
            shutil.copy(os.path.join(PROM, "ulysses-rules.yml"), tmp)
            rc, out = run([PROMTOOL, "check", "config", "prometheus.yml"], cwd=tmp)
            self.assertEqual(rc, 0, out)
            self.assertIn(f"SUCCESS: {RULE_COUNT} rules found", out)


class ManifestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.docs = load_manifests()

    def get(self, kind, name):
        self.assertIn((kind, name), self.docs, f"missing {kind}/{name}")
        return self.docs[(kind, name)]

    def test_kinds_and_namespace(self):
        kinds = sorted(k for k, name in self.docs if name != CONFIG_MAP)
        self.assertEqual(kinds, sorted(BASE_KINDS))
        # The kustomization's `namespace:` is the one place it is written: no file names one.
        self.assertRegex(kustomization_namespace(), r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        for (kind, name), doc in base_files().items():
            if kind == "Kustomization":
                continue
            self.assertNotIn("namespace", doc["metadata"], f"{kind}/{name}")
        self.assertEqual(self.get("Namespace", kustomization_namespace())["kind"], "Namespace")

    def test_kustomization_lists_every_manifest(self):
        kustomization = base_files()[("Kustomization", "kustomization.yaml")]
        files = sorted(f for f in os.listdir(BASE)
                       if f.endswith(".yaml") and f != "kustomization.yaml")
        self.assertEqual(sorted(kustomization["resources"]), files)

    def test_coordinator(self):
        dep = self.get("Deployment", "ulysses-coordinator")
        self.assertEqual(dep["spec"]["replicas"], 1)
        self.assertEqual(dep["spec"]["strategy"]["type"], "Recreate")
        pod = dep["spec"]["template"]
        self.assertEqual(dep["spec"]["selector"]["matchLabels"].items() - pod["metadata"]["labels"].items(), set())
        self.assertEqual(pod["metadata"]["annotations"]["prometheus.io/scrape"], "true")
        self.assertEqual(pod["metadata"]["annotations"]["prometheus.io/port"], "9090")
        (c,) = pod["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports, {"grpc": 50051, "metrics": 9090})
        # kubelet's gRPC probes speak no TLS: probe the metrics port. Liveness (and startup)
        # ask /livez, readiness /readyz: a read-only store is not ready but stays live.
        for probe, path in (("startupProbe", "/livez"), ("readinessProbe", "/readyz"),
                            ("livenessProbe", "/livez")):
            self.assertEqual(c[probe]["httpGet"], {"path": path, "port": "metrics"}, probe)
        self.assertIn("--state-dir=/var/lib/ulysses", c["args"])
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        self.assertEqual(mounts["state"], "/var/lib/ulysses")
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        # TLS, client CA and token file come from Secrets mounted read-only, each flag naming
        # a key of the Secret behind its mount.
        flags = dict(a.split("=", 1) for a in c["args"] if a.startswith("--"))
        files = secret_files(c, pod["spec"])
        for flag, key in (("--tls-cert", ("ulysses-coordinator-tls", "tls.crt")),
                          ("--tls-key", ("ulysses-coordinator-tls", "tls.key")),
                          ("--tls-client-ca", ("ulysses-coordinator-tls", "ca.crt")),
                          ("--token-file", ("ulysses-coordinator-tokens", "tokens.yaml"))):
            self.assertEqual(files.get(flags.get(flag)), key, flag)
        for m in c["volumeMounts"]:
            if "secret" in volumes[m["name"]]:
                self.assertTrue(m.get("readOnly"), m["name"])
                self.assertNotIn("subPath", m, "a subPath mount never sees Secret updates")
                self.assertEqual(volumes[m["name"]]["secret"]["defaultMode"] & 0o007, 0,
                                 "secrets must not be world-readable")
        state_claim = volumes["state"]["persistentVolumeClaim"]["claimName"]
        self.assertEqual(self.get("PersistentVolumeClaim", state_claim)["spec"]["accessModes"],
                         ["ReadWriteOncePod"])
        config_map = self.get("ConfigMap", volumes["config"]["configMap"]["name"])
        config = yaml.safe_load(config_map["data"]["coordinator.yaml"])
        self.assertEqual(config["listen"].rsplit(":", 1)[1], "50051")
        self.assertEqual(config["metrics_listen"].rsplit(":", 1)[1], "9090")

        svc = self.get("Service", "ulysses-coordinator")
        self.assertEqual(svc["spec"]["selector"], dep["spec"]["selector"]["matchLabels"])
        self.assertEqual({p["name"]: p["port"] for p in svc["spec"]["ports"]},
                         {"grpc": 50051, "metrics": 9090})

    def test_backup_cronjob_example(self):
        # deploy/k8s/examples/backup-cronjob.yaml (docs/OPERATIONS.md "Backup and restore"):
        # backs up the coordinator's own state claim and state dir, on the coordinator's node
        # (the claim is ReadWriteOnce), never two at once, into a claim of its own.
        with open(os.path.join(K8S, "examples", "backup-cronjob.yaml"), encoding="utf-8") as f:
            docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(f) if d}
        cron = docs[("CronJob", "ulysses-coordinator-backup")]
        self.assertEqual(cron["spec"]["concurrencyPolicy"], "Forbid")
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        dep = self.get("Deployment", "ulysses-coordinator")
        dep_pod = dep["spec"]["template"]["spec"]
        (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        self.assertEqual(term["labelSelector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"])
        self.assertEqual(term["topologyKey"], "kubernetes.io/hostname")
        self.assertEqual(pod["securityContext"]["runAsUser"], dep_pod["securityContext"]["runAsUser"])
        (c,) = pod["containers"]
        self.assertEqual(c["image"], dep_pod["containers"][0]["image"])
        script = c["args"][0]
        state_dir = next(a.split("=", 1)[1] for a in dep_pod["containers"][0]["args"]
                         if a.startswith("--state-dir="))
        self.assertIn(f"ulysses-coordinator backup --state-dir={state_dir} --to=", script)
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        self.assertEqual(mounts["state"], state_dir)
        dep_volumes = {v["name"]: v for v in dep_pod["volumes"]}
        self.assertEqual(volumes["state"]["persistentVolumeClaim"]["claimName"],
                         dep_volumes["state"]["persistentVolumeClaim"]["claimName"])
        backups = volumes["backups"]["persistentVolumeClaim"]["claimName"]
        self.assertIn(("PersistentVolumeClaim", backups), docs)
        self.assertNotEqual(backups, dep_volumes["state"]["persistentVolumeClaim"]["claimName"])
        self.assertIn(f'--to="$name"', script)
        self.assertIn(mounts["backups"], script.split("name=", 1)[1].split("\n", 1)[0])

    def test_workers(self):
        sts = self.get("StatefulSet", "ulysses-worker")
        headless = self.get("Service", sts["spec"]["serviceName"])
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        labels = sts["spec"]["template"]["metadata"]["labels"]
        self.assertEqual(headless["spec"]["selector"].items() - labels.items(), set())
        pod = sts["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], 8)  # all of the node
        self.assertEqual(c["resources"]["requests"], c["resources"]["limits"])
        grace = pod["terminationGracePeriodSeconds"]
        self.assertGreaterEqual(grace, 120)
        agent_grace = [float(a.split("=", 1)[1]) for a in c["args"]
                       if a.startswith("--grace-period-s=")]
        self.assertEqual(len(agent_grace), 1)
        self.assertLess(agent_grace[0], grace, "the agent must finish before SIGKILL")
        self.assertIn("exec", c["lifecycle"]["preStop"])
        self.assertIn("--node=$(NODE_NAME)", c["args"])
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")
        self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
        volumes = {v["name"]: v for v in pod["volumes"]}
        shared = self.get("PersistentVolumeClaim",
                          volumes["shared"]["persistentVolumeClaim"]["claimName"])
        self.assertEqual(shared["spec"]["accessModes"], ["ReadWriteMany"])
        coordinator_arg = [a for a in c["args"] if a.startswith("--coordinator=")][0]
        self.assertTrue(coordinator_arg.endswith(":50051"), coordinator_arg)
        # Mutual TLS: the pod's own certificate from the worker Secret, and the CA.
        flags = dict(a.split("=", 1) for a in c["args"] if a.startswith("--"))
        for i in range(sts["spec"]["replicas"]):
            # Each pod finds its own kubernetes.io/tls Secret under its own name.
            files = secret_files(c, pod, f"ulysses-worker-{i}")
            flags_i = {k: v.replace("$(POD_NAME)", f"ulysses-worker-{i}") for k, v in flags.items()}
            self.assertEqual(files.get(flags_i.get("--ca")), ("ulysses-worker-0-tls", "ca.crt"))
            self.assertEqual(files.get(flags_i.get("--cert")),
                             (f"ulysses-worker-{i}-tls", "tls.crt"))
            self.assertEqual(files.get(flags_i.get("--key")),
                             (f"ulysses-worker-{i}-tls", "tls.key"))
        self.assertFalse(any(a.startswith("--insecure") for a in c["args"]))
        # Per-rank metrics: served on the annotated port, named in the container.
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/scrape"], "true")
        self.assertEqual(flags["--metrics-listen"].rsplit(":", 1)[1], annotations["prometheus.io/port"])
        self.assertIn({"name": "metrics", "containerPort": int(annotations["prometheus.io/port"])},
                      c["ports"])
        self.assertGreater(float(flags["--peak-flops"]), 0)

        pdb = self.get("PodDisruptionBudget", "ulysses-worker")
        self.assertEqual(pdb["spec"]["selector"]["matchLabels"], sts["spec"]["selector"]["matchLabels"])
        config_map = self.get("ConfigMap", CONFIG_MAP)
        config = yaml.safe_load(config_map["data"]["coordinator.yaml"])
        self.assertLess(config["cancel_grace_s"], grace)


    def test_network_policy(self):
        dep = self.get("Deployment", "ulysses-coordinator")
        sts = self.get("StatefulSet", "ulysses-worker")
        coordinator_labels = dep["spec"]["template"]["metadata"]["labels"]
        worker_labels = sts["spec"]["template"]["metadata"]["labels"]
        policy = self.get("NetworkPolicy", "ulysses-coordinator")["spec"]
        self.assertEqual(policy["policyTypes"], ["Ingress"])
        self.assertEqual(policy["podSelector"]["matchLabels"].items() - coordinator_labels.items(),
                         set())
        allowed = {}  # port -> list of peers
        for rule in policy["ingress"]:
            self.assertIn("from", rule, "a rule without `from` admits every source")
            self.assertIn("ports", rule, "a rule without `ports` opens every port")
            for port in rule["ports"]:
                allowed.setdefault(port["port"], []).extend(rule["from"])
        self.assertEqual(set(allowed), {50051, 9090})
        grpc_peers = allowed[50051]
        selectors = [p["podSelector"]["matchLabels"] for p in grpc_peers]
        self.assertTrue(all("podSelector" in p for p in grpc_peers), grpc_peers)
        self.assertIn({"ulysses.io/client": "true"}, selectors)
        self.assertTrue(any(s.items() <= worker_labels.items() for s in selectors))
        self.assertEqual(len(selectors), 2, "only workers and labelled clients reach gRPC")
        metrics_peers = allowed[9090]
        self.assertEqual([p["podSelector"]["matchLabels"] for p in metrics_peers],
                         [{"app.kubernetes.io/name": "prometheus"}])
        # Prometheus runs in the monitoring namespace (kube-prometheus-stack), admitted by the
        # label the API server sets on every namespace.
        self.assertEqual([p["namespaceSelector"]["matchLabels"] for p in metrics_peers],
                         [{"kubernetes.io/metadata.name": "monitoring"}])
        workers = self.get("NetworkPolicy", "ulysses-worker")["spec"]
        self.assertEqual(workers["podSelector"]["matchLabels"].items() - worker_labels.items(),
                         set())
        prometheus = {"app.kubernetes.io/name": "prometheus"}
        for rule in workers["ingress"]:
            for peer in rule["from"]:
                labels = peer["podSelector"]["matchLabels"]
                if labels == prometheus:  # Only to the metrics port, from monitoring.
                    self.assertEqual([p["port"] for p in rule["ports"]], [9091])
                    self.assertEqual(peer["namespaceSelector"]["matchLabels"],
                                     {"kubernetes.io/metadata.name": "monitoring"})
                else:
                    self.assertEqual(labels.items() - worker_labels.items(), set())
        self.assertTrue(any(p["podSelector"]["matchLabels"] == prometheus
                            for r in workers["ingress"] for p in r["from"]),
                        "Prometheus must reach the workers' metrics port")


def secret_files(container, pod_spec, pod_name=None):
    """Path -> (secret name, key) for the files an argument names under the container's
    Secret mounts, whole Secrets or projected items (keys of the Secrets written by
    scripts/k8s_secrets.sh, see SecretsScriptTest). `pod_name` replaces $(POD_NAME)."""
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    files_in = {}  # mount dir -> {file: (secret, key)} or the secret name (every key a file)
    for m in container["volumeMounts"]:
        v = volumes[m["name"]]
        if v.get("secret"):
            files_in[m["mountPath"].rstrip("/")] = v["secret"]["secretName"]
        elif v.get("projected"):
            items = {}
            for source in v["projected"]["sources"]:
                if "secret" in source:
                    for item in source["secret"].get("items", []):
                        items[item["path"]] = (source["secret"]["name"], item["key"])
            files_in[m["mountPath"].rstrip("/")] = items
    files = {}
    for arg in container["args"]:
        if "=" not in arg:
            continue
        path = arg.split("=", 1)[1]
        if pod_name:
            path = path.replace("$(POD_NAME)", pod_name)
        directory, _, key = path.rpartition("/")
        where = files_in.get(directory)
        if isinstance(where, str):
            files[path] = (where, key)
        elif isinstance(where, dict) and key in where:
            files[path] = where[key]
    return files


KUBECTL = shutil.which("kubectl")
OPENSSL = shutil.which("openssl")
SECRETS_SCRIPT = os.path.join(ROOT, "scripts", "k8s_secrets.sh")


@unittest.skipUnless(KUBECTL and OPENSSL and os.path.exists(os.path.join(ROOT, "scripts", "dev_certs.sh")),
                     "needs kubectl, openssl and scripts/dev_certs.sh")
class SecretsScriptTest(unittest.TestCase):
    """scripts/k8s_secrets.sh makes exactly the Secrets the manifests mount."""

    @classmethod
    def setUpClass(cls):
        cls.docs = load_manifests()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.replicas = cls.docs[("StatefulSet", "ulysses-worker")]["spec"]["replicas"]
        rc, cls.out = run([SECRETS_SCRIPT, cls.tmp.name, str(cls.replicas)])
        cls.rc = rc
        with open(os.path.join(cls.tmp.name, "secrets.yaml"), encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        cls.secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
        cls.namespaces = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def data(self, secret, key):
        return base64.b64decode(self.secrets[secret]["data"][key])

    def openssl(self, *args, stdin=None):
        proc = subprocess.run([OPENSSL, *args], input=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=60)
        return proc.returncode, proc.stdout.decode()

    def test_every_mounted_file_exists(self):
        self.assertEqual(self.rc, 0, self.out)
        for kind, name in (("Deployment", "ulysses-coordinator"), ("StatefulSet", "ulysses-worker")):
            pod = self.docs[(kind, name)]["spec"]["template"]["spec"]
            (c,) = pod["containers"]
            for i in range(self.replicas):
                files = secret_files(c, pod, f"{name}-{i}")
                # cert, key, CA (and the coordinator's token file)
                self.assertEqual(len(files), 4 if kind == "Deployment" else 3, f"{name}-{i}: {files}")
                for secret, key in files.values():
                    self.assertIn(secret, self.secrets)
                    self.assertEqual(self.secrets[secret]["metadata"]["namespace"],
                                     kustomization_namespace())
                    self.assertIn(key, self.secrets[secret]["data"], f"{secret}/{key}")

    def test_one_tls_secret_per_worker(self):
        # kubernetes.io/tls, made by `kubectl create --dry-run=client -o yaml`; no Secret
        # holds two workers' keys.
        self.assertEqual(self.rc, 0, self.out)
        for i in range(self.replicas):
            s = self.secrets[f"ulysses-worker-{i}-tls"]
            self.assertEqual(s["type"], "kubernetes.io/tls")
            self.assertEqual(sorted(s["data"]), ["ca.crt", "tls.crt", "tls.key"])
        self.assertEqual(self.secrets["ulysses-coordinator-tls"]["type"], "kubernetes.io/tls")
        self.assertNotIn("ulysses-worker-tls", self.secrets)
        script = read_text(SECRETS_SCRIPT)
        self.assertIn("kubectl apply --server-side", script)

    def test_certificates_chain_and_name_the_right_hosts(self):
        with tempfile.TemporaryDirectory() as tmp:
            ca = os.path.join(tmp, "ca.pem")
            with open(ca, "wb") as f:
                f.write(self.data("ulysses-coordinator-tls", "ca.crt"))
            rc, out = self.openssl("verify", "-CAfile", ca,
                                   stdin=self.data("ulysses-coordinator-tls", "tls.crt"))
            self.assertEqual(rc, 0, out)
            rc, sans = self.openssl("x509", "-noout", "-ext", "subjectAltName",
                                    stdin=self.data("ulysses-coordinator-tls", "tls.crt"))
            (c,) = self.docs[("StatefulSet", "ulysses-worker")]["spec"]["template"]["spec"]["containers"]
            host = [a for a in c["args"] if a.startswith("--coordinator=")][0].split("=", 1)[1]
            self.assertIn("DNS:" + host.rsplit(":", 1)[0], sans)  # What the workers dial.
            self.assertIn("DNS:localhost", sans)  # kubectl port-forward.
            for i in range(self.replicas):
                name = f"ulysses-worker-{i}"
                cert = self.data(f"{name}-tls", "tls.crt")
                rc, out = self.openssl("verify", "-CAfile", ca, "-purpose", "sslclient", stdin=cert)
                self.assertEqual(rc, 0, out)
                rc, subject = self.openssl("x509", "-noout", "-subject", stdin=cert)
                self.assertIn(f"CN = {name}", subject)

    def test_namespace_comes_from_the_kustomization(self):
        self.assertEqual(self.rc, 0, self.out)
        self.assertEqual(self.namespaces, [kustomization_namespace()])
        # ULYSSES_NAMESPACE (an overlay's namespace) moves the Secrets, the Namespace and the
        # certificate's qualified names; the short name the workers dial stays.
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([SECRETS_SCRIPT, tmp, "1"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=60,
                                  env=dict(os.environ, ULYSSES_NAMESPACE="team-a"))
            self.assertEqual(proc.returncode, 0, proc.stdout)
            with open(os.path.join(tmp, "secrets.yaml"), encoding="utf-8") as f:
                docs = [d for d in yaml.safe_load_all(f) if d]
            self.assertEqual([d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"],
                             ["team-a"])
            for d in docs:
                if d["kind"] == "Secret":
                    self.assertEqual(d["metadata"]["namespace"], "team-a")
            tls = next(d for d in docs if d["metadata"]["name"] == "ulysses-coordinator-tls")
            rc, sans = self.openssl("x509", "-noout", "-ext", "subjectAltName",
                                    stdin=base64.b64decode(tls["data"]["tls.crt"]))
            self.assertEqual(rc, 0, sans)
            self.assertRegex(sans, r"DNS:ulysses-coordinator(,|\s*$)")
            self.assertIn("DNS:ulysses-coordinator.team-a.svc", sans)
            self.assertNotIn(".ulysses.svc", sans)

    def test_token_file_holds_the_admin_token_hash_only(self):
        with open(os.path.join(self.tmp.name, "admin.token"), encoding="utf-8") as f:
            token = f.read().strip()
        self.assertRegex(token, r"^ul_[A-Za-z0-9_-]{43}$")
        tokens_yaml = self.data("ulysses-coordinator-tokens", "tokens.yaml").decode()
        self.assertNotIn(token, tokens_yaml)
        (entry,) = yaml.safe_load(tokens_yaml)["tokens"]
        self.assertEqual(entry["sha256"], hashlib.sha256(token.encode()).hexdigest())
        self.assertEqual(entry["role"], "admin")
        self.assertEqual(os.stat(os.path.join(self.tmp.name, "admin.token")).st_mode & 0o077, 0)
        config = yaml.safe_load(read_text(os.path.join(self.tmp.name, "ulyssesctl-config.yaml")))
        (context,) = config["contexts"]
        self.assertEqual(context["server"], "localhost:50051")
        self.assertTrue(context["ca"].endswith("/certs/ca.pem"))




BASE_KINDS = [
    "Namespace", "PriorityClass", "PriorityClass", "ServiceAccount", "ServiceAccount",
    "ConfigMap", "PersistentVolumeClaim", "PersistentVolumeClaim", "Job",
    "Deployment", "Service", "Service", "StatefulSet", "PodDisruptionBudget",
    "NetworkPolicy", "NetworkPolicy"]
MONITORING_KINDS = ["ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"]
OVERLAYS = ("eks", "gke", "onprem")


class KustomizeTest(unittest.TestCase):
    def test_base_and_every_overlay_render(self):
        for where, extra in [("base", [])] + [(f"overlays/{o}", ["StorageClass"] * (1 if o == "onprem" else 2)
                                              + MONITORING_KINDS) for o in OVERLAYS]:
            with self.subTest(where=where):
                objects = render(os.path.join(K8S, where))
                self.assertEqual(sorted(d["kind"] for d in objects), sorted(BASE_KINDS + extra))
                for d in objects:
                    expected = None if d["kind"] in CLUSTER_SCOPED else kustomization_namespace()
                    self.assertEqual(d["metadata"].get("namespace"), expected,
                                     f"{where}: {d['kind']}/{d['metadata']['name']}")


# --- The deploy matches its jobs (issue #13 item 4) ---------------------------------------
# Checked on what `kubectl kustomize deploy/k8s` renders, against every shipped job config
# (configs/jobs) and the coordinator config. Each check is a function returning its problems,
# so DeployMatchesJobsTest can also show that each one notices a broken manifest.

JOBS = os.path.join(ROOT, "configs", "jobs")
CLI_TOOL = os.environ.get("ULYSSES_CLI_TOOL") or os.path.join(ROOT, "build", "bin", "ulyssesctl")
GPU = "nvidia.com/gpu"
QUANTITY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
                  "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "": 1}


def quantity_bytes(q):
    """A Kubernetes memory quantity ("512Gi", "16G", "1024") in bytes."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTP]i|[kMGTP])?", str(q))
    if not m:
        raise ValueError(f"unsupported quantity {q!r}")
    return float(m.group(1)) * QUANTITY_UNITS[m.group(2) or ""]


def render(path=None):
    """The objects `kubectl kustomize PATH` renders (a real render; default deploy/k8s/base)."""
    path = path or BASE
    if not KUBECTL:
        raise AssertionError("kubectl not found: the deploy contracts are checked on the "
                             "rendered kustomization (Debian package kubernetes-client, "
                             "scripts/bootstrap.sh)")
    rc, out = run([KUBECTL, "kustomize", path])
    if rc != 0:
        raise AssertionError(f"kubectl kustomize {path} failed (components and labels: need "
                             f"kustomize >= v4, kubectl >= 1.21):\n{out}")
    return [d for d in yaml.safe_load_all(out) if d]


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


class MetricNamesTest(unittest.TestCase):
    """A metric nothing registers fails here: the dashboard and the rules are checked
    against the catalogue the binaries register from, and docs/METRICS.md must list
    exactly that catalogue."""

    @classmethod
    def setUpClass(cls):
        cls.catalog = catalog()
        cls.documented = set(cls.catalog) | recorded_series()

    def test_docs_list_exactly_the_catalogue(self):
        docs = documented_catalogue()
        self.assertGreater(len(docs), 20)
        self.assertEqual(sorted(set(docs) - set(self.catalog)), [],
                         "in docs/METRICS.md but registered by no binary")
        self.assertEqual(sorted(set(self.catalog) - set(docs)), [],
                         "in the catalogue but missing from docs/METRICS.md")
        for name, (type_, labels, binaries) in docs.items():
            m = self.catalog[name]
            self.assertEqual(type_, m["type"], name)
            self.assertEqual(labels, tuple(m["labels"]), f"{name}: labels")
            self.assertEqual(binaries, tuple(m["binaries"]), f"{name}: binaries")

    def test_checker_flags_unknown_names(self):
        names = metric_names(
            'histogram_quantile(0.9, sum by (le) (rate(ulysses_bogus_seconds_bucket{job_id=~"$job_id"}[5m])))'
            ' / on (job_id) ulysses_train_step offset 15m')
        self.assertEqual(names, {"ulysses_bogus_seconds_bucket", "ulysses_train_step"})
        self.assertEqual(undocumented(names, self.documented), {"ulysses_bogus_seconds_bucket"})
        # A name only the docs mention is not enough: it must be registered.
        self.assertEqual(undocumented({"ulysses_made_up_seconds"}, self.documented),
                         {"ulysses_made_up_seconds"})

    def test_dashboard_uses_registered_metrics(self):
        dashboard = json.loads(read_text(DASHBOARD))
        exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
                  if v.get("type") == "query"]
        self.assertGreater(len(exprs), 15)
        used = set()
        for expr in exprs:
            names = metric_names(re.sub(r"label_values\(([^,)]+).*", r"\1", expr))
            self.assertTrue(names, expr)
            self.assertEqual(undocumented(names, self.documented), set(),
                             f"{expr!r} uses metrics no binary registers")
            used |= {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}
        self.assertEqual(DASHBOARD_REQUIRED - used, set(), "dashboard panels missing")
        ids = [p["id"] for p in dashboard["panels"]]
        self.assertEqual(len(ids), len(set(ids)))

    def test_rules_use_registered_metrics(self):
        rules = yaml.safe_load(read_text(os.path.join(PROM, "ulysses-rules.yml")))
        count = 0
        for group in rules["groups"]:
            for rule in group["rules"]:
                count += 1
                missing = undocumented(metric_names(rule["expr"]), self.documented)
                self.assertEqual(missing, set(), f"{rule['expr']!r}")
        self.assertEqual(count, RULE_COUNT)
        recorded = recorded_series()
        docs = read_text(METRICS_MD)
        for name in recorded:
            self.assertIn(f"`{name}`", docs, "recording rules are documented")


# The checks issue 27 added (storage, Pod Security, probes, monitoring, alerts, schemas) live
# in check_admin.py; importing them here runs them under deploy_k8s_test.
from check_admin import *  # noqa: E402,F401,F403  (the test classes of its __all__)

if __name__ == "__main__":
    unittest.main(verbosity=2)
