"""Paths and helpers shared by the deploy/k8s checks (check_deploy.py, check_jobs_fit.py):
the repository layout, the metrics catalogue and its documentation, and the rendered base
manifests."""
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

KUBECTL = shutil.which("kubectl")
OPENSSL = shutil.which("openssl")
SECRETS_SCRIPT = os.path.join(ROOT, "scripts", "k8s_secrets.sh")

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
