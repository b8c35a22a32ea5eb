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

from deploy_common import *  # noqa: F401,F403


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
            broken = rules.replace("scalar(0.5 * max(ulysses_heartbeat_timeout_seconds))",
                                   "scalar(2 * max(ulysses_heartbeat_timeout_seconds))")
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
        # The metrics listener binds the pod IP (downward API), never every interface.
        self.assertNotIn("metrics_listen", config)
        self.assertEqual(flags.get("--metrics-listen"), "$(POD_IP):9090")
        self.assertEqual({e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                          for e in c.get("env", [])}.get("POD_IP"), "status.podIP")

        svc = self.get("Service", "ulysses-coordinator")
        self.assertEqual(svc["spec"]["selector"], dep["spec"]["selector"]["matchLabels"])
        self.assertEqual({p["name"]: p["port"] for p in svc["spec"]["ports"]},
                         {"grpc": 50051, "metrics": 9090})

    def test_backup_cronjob_example(self):
        # deploy/k8s/examples/backup-cronjob.yaml (docs/OPERATIONS.md "Backup and restore"): a
        # client pod streams `ulyssesctl admin backup` from the coordinator; it never mounts the
        # coordinator's ReadWriteOncePod state claim (unschedulable next to the coordinator).
        with open(os.path.join(K8S, "examples", "backup-cronjob.yaml"), encoding="utf-8") as f:
            docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(f) if d}
        cron = docs[("CronJob", "ulysses-coordinator-backup")]
        self.assertEqual(cron["spec"]["concurrencyPolicy"], "Forbid")
        template = cron["spec"]["jobTemplate"]["spec"]["template"]
        pod = template["spec"]
        dep_pod = self.get("Deployment", "ulysses-coordinator")["spec"]["template"]["spec"]
        state_claim = next(v for v in dep_pod["volumes"] if v["name"] == "state")[
            "persistentVolumeClaim"]["claimName"]
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v]
        self.assertNotIn(state_claim, claims)
        self.assertNotIn("affinity", pod)
        # A client the NetworkPolicy admits.
        self.assertEqual(template["metadata"]["labels"].get("ulysses.io/client"), "true")
        self.assertEqual(pod["securityContext"]["runAsUser"], dep_pod["securityContext"]["runAsUser"])
        from check_admin import pod_security_problems
        self.assertEqual(pod_security_problems(pod, "restricted"), [])
        (c,) = pod["containers"]
        self.assertRegex(c["image"], r"^[a-z0-9.-]+\.[a-z]+/.*ulysses-control-plane:[\w.]+$")
        script = c["args"][0]
        self.assertIn('ulyssesctl admin backup --to="$name"', script)
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        self.assertIn(mounts["backups"], script.split("name=", 1)[1].split("\n", 1)[0])
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.assertIn(("PersistentVolumeClaim", volumes["backups"]["persistentVolumeClaim"]["claimName"]), docs)
        # Only the CA of the coordinator's TLS Secret is mounted, never its key.
        ca = volumes["ca"]["secret"]
        self.assertEqual(ca["secretName"], next(v for v in dep_pod["volumes"] if v["name"] == "tls")["secret"]["secretName"])
        self.assertEqual(ca["items"], [{"key": "ca.crt", "path": "ca.crt"}])
        # The client config parses with the real ulyssesctl and names the Service, the mounted CA
        # and the token file.
        env = {e["name"]: e["value"] for e in c["env"]}
        config_map = docs[("ConfigMap", volumes["client-config"]["configMap"]["name"])]
        (name, text), = config_map["data"].items()
        self.assertEqual(env["ULYSSES_CONFIG"], mounts["client-config"] + "/" + name)
        (context,) = yaml.safe_load(text)["contexts"]
        workers = self.get("StatefulSet", "ulysses-worker")["spec"]["template"]["spec"]["containers"][0]
        dialled = next(a for a in workers["args"] if a.startswith("--coordinator=")).split("=", 1)[1]
        self.assertEqual(context["server"], dialled)
        self.assertEqual(context["ca"], mounts["ca"] + "/ca.crt")
        self.assertTrue(context["token_file"].startswith(mounts["token"] + "/"))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            proc = subprocess.run([CLI_TOOL, "config", "get-contexts"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=60,
                                  env=dict(os.environ, ULYSSES_CONFIG=path))
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertIn(context["name"], proc.stdout)

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
        self.assertEqual(flags["--metrics-listen"].rsplit(":", 1)[0], "$(POD_IP)",
                         "the worker metrics listener binds the pod IP, never 0.0.0.0")
        self.assertIn({"name": "metrics", "containerPort": int(annotations["prometheus.io/port"])},
                      c["ports"])
        peak = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)]["value"], flags["--peak-flops"])
        self.assertGreater(float(peak), 0)

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
        # Clients only from namespaces labelled for it (never `namespaceSelector: {}`), which
        # includes the deployment's own; workers (no namespaceSelector) only from this one.
        client = next(p for p in grpc_peers
                      if p["podSelector"]["matchLabels"] == {"ulysses.io/client": "true"})
        ns_labels = client["namespaceSelector"]["matchLabels"]
        self.assertTrue(ns_labels, "an empty namespaceSelector admits every namespace")
        own = self.get("Namespace", kustomization_namespace())["metadata"]["labels"]
        self.assertLessEqual(ns_labels.items(), own.items())
        for p in grpc_peers:
            if p is not client:
                self.assertNotIn("namespaceSelector", p)
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
# The deploy sized for the shipped jobs (check_jobs_fit.py).
from check_jobs_fit import *  # noqa: E402,F401,F403
# Each cloud's fabric, GPU placement and spot settings (check_cloud.py, issue 48).
from check_cloud import *  # noqa: E402,F401,F403

if __name__ == "__main__":
    import ctest_main  # noqa: E402  (exits 77 when a check skipped and none failed)
    ctest_main.main()
