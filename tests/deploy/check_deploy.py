#!/usr/bin/env python3
"""Checks deploy/k8s: manifests, Prometheus rules (real promtool), dashboard.

Run by ctest (deploy_k8s_test) with Debian's /usr/bin/python3 (python3-yaml).
ULYSSES_SOURCE_DIR points at the repository root (defaults to ../.. of this file).
"""
import json
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
PROM = os.path.join(K8S, "prometheus")
DASHBOARD = os.path.join(K8S, "grafana", "ulysses-dashboard.json")
METRICS_MD = os.path.join(ROOT, "docs", "METRICS.md")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

# What the dashboard must show (issue: job states, tokens/s, loss, step, restarts vs
# preemptions, recovery, checkpoint durations/bytes, heartbeat ages, gang wait, all-to-all).
DASHBOARD_REQUIRED = {
    "ulysses_jobs", "ulysses_train_tokens_per_second", "ulysses_train_loss",
    "ulysses_train_step", "ulysses_job_restarts_total", "ulysses_preemptions_total",
    "ulysses_recovery_duration_seconds", "ulysses_checkpoint_save_duration_seconds",
    "ulysses_checkpoint_bytes", "ulysses_worker_heartbeat_age_seconds",
    "ulysses_gang_wait_seconds",
}

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


def documented_metrics():
    text = read_text(METRICS_MD)
    return set(re.findall(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)`", text))


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


def load_manifests():
    docs = {}
    for name in sorted(os.listdir(K8S)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(K8S, name), encoding="utf-8") as f:
            for doc in yaml.safe_load_all(f):
                if doc is None:
                    continue
                key = (doc["kind"], doc["metadata"]["name"] if "metadata" in doc else name)
                docs[key] = doc
    return docs


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
            broken = rules.replace("ulysses_worker_heartbeat_age_seconds > 30",
                                   "ulysses_worker_heartbeat_age_seconds > 300")
            self.assertNotEqual(broken, rules)
            with open(os.path.join(tmp, "ulysses-rules.yml"), "w", encoding="utf-8") as f:
                f.write(broken)
            shutil.copy(os.path.join(PROM, "ulysses-rules_test.yml"), tmp)
            rc, out = run([PROMTOOL, "test", "rules", "ulysses-rules_test.yml"], cwd=tmp)
            self.assertNotEqual(rc, 0, out)
            self.assertIn("UlyssesWorkerHeartbeatStale", out)

    def test_check_scrape_config(self):
        # Debian's Prometheus is built without Kubernetes service discovery, so
        # check a copy whose kubernetes_sd_configs is swapped for a static target;
        # relabelling, rule_files and everything else are checked as written.
        config = yaml.safe_load(read_text(os.path.join(PROM, "prometheus.yml")))
        job = config["scrape_configs"][0]
        self.assertEqual(job["job_name"], "ulysses-coordinator")  # Used by UlyssesCoordinatorDown.
        self.assertEqual(job["kubernetes_sd_configs"][0]["role"], "pod")
        del job["kubernetes_sd_configs"]
        job["static_configs"] = [{"targets": ["127.0.0.1:9090"]}]
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
                yaml.safe_dump(config, f)
            shutil.copy(os.path.join(PROM, "ulysses-rules.yml"), tmp)
            rc, out = run([PROMTOOL, "check", "config", "prometheus.yml"], cwd=tmp)
            self.assertEqual(rc, 0, out)
            self.assertIn("SUCCESS: 11 rules found", out)


class ManifestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.docs = load_manifests()

    def get(self, kind, name):
        self.assertIn((kind, name), self.docs, f"missing {kind}/{name}")
        return self.docs[(kind, name)]

    def test_kinds_and_namespace(self):
        kinds = sorted(k for k, _ in self.docs)
        self.assertEqual(kinds, sorted([
            "Namespace", "ConfigMap", "PersistentVolumeClaim", "PersistentVolumeClaim",
            "Deployment", "Service", "Service", "StatefulSet", "PodDisruptionBudget",
            "Kustomization"]))
        for (kind, name), doc in self.docs.items():
            if kind in ("Namespace", "Kustomization"):
                continue
            self.assertEqual(doc["metadata"].get("namespace"), "ulysses", f"{kind}/{name}")

    def test_kustomization_lists_every_manifest(self):
        kustomization = self.get("Kustomization", "kustomization.yaml")
        files = sorted(f for f in os.listdir(K8S)
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
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(c[probe]["grpc"]["port"], 50051, probe)
        self.assertIn("--state-dir=/var/lib/ulysses", c["args"])
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        self.assertEqual(mounts["state"], "/var/lib/ulysses")
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        state_claim = volumes["state"]["persistentVolumeClaim"]["claimName"]
        self.assertEqual(self.get("PersistentVolumeClaim", state_claim)["spec"]["accessModes"],
                         ["ReadWriteOnce"])
        config_map = self.get("ConfigMap", volumes["config"]["configMap"]["name"])
        config = yaml.safe_load(config_map["data"]["coordinator.yaml"])
        self.assertEqual(config["listen"].rsplit(":", 1)[1], "50051")
        self.assertEqual(config["metrics_listen"].rsplit(":", 1)[1], "9090")

        svc = self.get("Service", "ulysses-coordinator")
        self.assertEqual(svc["spec"]["selector"], dep["spec"]["selector"]["matchLabels"])
        self.assertEqual({p["name"]: p["port"] for p in svc["spec"]["ports"]},
                         {"grpc": 50051, "metrics": 9090})

    def test_workers(self):
        sts = self.get("StatefulSet", "ulysses-worker")
        headless = self.get("Service", sts["spec"]["serviceName"])
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        labels = sts["spec"]["template"]["metadata"]["labels"]
        self.assertEqual(headless["spec"]["selector"].items() - labels.items(), set())
        pod = sts["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], 1)
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

        pdb = self.get("PodDisruptionBudget", "ulysses-worker")
        self.assertEqual(pdb["spec"]["selector"]["matchLabels"], sts["spec"]["selector"]["matchLabels"])
        config_map = self.get("ConfigMap", "ulysses-coordinator-config")
        config = yaml.safe_load(config_map["data"]["coordinator.yaml"])
        self.assertLess(config["cancel_grace_s"], grace)


KUBECTL = shutil.which("kubectl")


@unittest.skipUnless(KUBECTL, "kubectl missing (optional; renders the kustomization offline)")
class KustomizeTest(unittest.TestCase):
    def test_kustomization_renders(self):
        rc, out = run([KUBECTL, "kustomize", K8S])
        self.assertEqual(rc, 0, out)
        objects = [d for d in yaml.safe_load_all(out) if d]
        self.assertEqual(sorted(d["kind"] for d in objects), sorted([
            "Namespace", "ConfigMap", "PersistentVolumeClaim", "PersistentVolumeClaim",
            "Deployment", "Service", "Service", "StatefulSet", "PodDisruptionBudget"]))
        for d in objects:
            if d["kind"] != "Namespace":
                self.assertEqual(d["metadata"]["namespace"], "ulysses", d["metadata"]["name"])


class MetricNamesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.documented = documented_metrics()

    def test_checker_flags_unknown_names(self):
        names = metric_names(
            'histogram_quantile(0.9, sum by (le) (rate(ulysses_bogus_seconds_bucket{job_id=~"$job_id"}[5m])))'
            ' / on (job_id) ulysses_train_step offset 15m')
        self.assertEqual(names, {"ulysses_bogus_seconds_bucket", "ulysses_train_step"})
        self.assertEqual(undocumented(names, self.documented), {"ulysses_bogus_seconds_bucket"})

    def test_dashboard_uses_documented_metrics(self):
        dashboard = json.loads(read_text(DASHBOARD))
        exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        self.assertGreater(len(exprs), 15)
        used = set()
        for expr in exprs:
            names = metric_names(expr)
            self.assertTrue(names, expr)
            self.assertEqual(undocumented(names, self.documented), set(),
                             f"{expr!r} uses metrics missing from docs/METRICS.md")
            used |= {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}
        self.assertEqual(DASHBOARD_REQUIRED - used, set(), "dashboard panels missing")
        ids = [p["id"] for p in dashboard["panels"]]
        self.assertEqual(len(ids), len(set(ids)))

    def test_rules_use_documented_metrics(self):
        rules = yaml.safe_load(read_text(os.path.join(PROM, "ulysses-rules.yml")))
        count = 0
        for group in rules["groups"]:
            for rule in group["rules"]:
                count += 1
                missing = undocumented(metric_names(rule["expr"]), self.documented)
                self.assertEqual(missing, set(), f"{rule['expr']!r}")
                if "record" in rule:
                    self.assertIn(rule["record"], self.documented)
        self.assertEqual(count, 11)


if __name__ == "__main__":
    unittest.main(verbosity=2)
