"""What a cluster admin needs from deploy/k8s (issue 27), checked on what kustomize renders:
storage classes per overlay, the shared-volume init Job (run for real), Pod Security levels by
the documented rules, own ServiceAccounts and PriorityClasses, images with a registry, the
generated ConfigMap, monitoring objects as kube-prometheus-stack and Grafana expect them,
alerts with runbooks, `for:` and thresholds from settings, the cert-manager and rdma
components, and every object of every overlay against the Kubernetes OpenAPI schemas and the
prometheus-operator / cert-manager CRD schemas (npm kubernetes-models, installed by
scripts/k8s_schema_tools.sh).

Imported by check_deploy.py (deploy_k8s_test); self-contained (no import from it).
"""
import copy
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

# What check_deploy.py imports (its own helpers keep their names).
__all__ = ["PodSecurityTest", "StorageTest", "PrepareSharedTest", "IdentityTest", "MonitoringTest",
           "AlertsTest", "SchemaTest", "pod_security_problems"]

ROOT = os.environ.get("ULYSSES_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "k8s")
RULES = os.path.join(K8S, "prometheus", "ulysses-rules.yml")
RULES_TEST = os.path.join(K8S, "prometheus", "ulysses-rules_test.yml")
RUNBOOK = os.path.join(ROOT, "docs", "RUNBOOK.md")
KUBECTL = shutil.which("kubectl")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
OVERLAYS = ("eks", "gke", "onprem")
COMPONENTS = ("monitoring", "cert-manager", "rdma", "fabric-efa", "fabric-tcpxo", "fabric-ib", "spot", "keda")
IMAGE_UID = 10001

# RWX provisioner each overlay must use for the shared volume; none of them may hold SQLite.
RWX_PROVISIONERS = {"eks": "efs.csi.aws.com", "gke": "filestore.csi.storage.gke.io",
                    "onprem": "nfs.csi.k8s.io"}
FILE_PROVISIONERS = set(RWX_PROVISIONERS.values()) | {"kubernetes.io/nfs", "cephfs.csi.ceph.com"}

# Alerts on an event over a range window: they cannot flap, so they carry no `for:`.
EVENT_ALERTS = {"UlyssesJobFailed", "UlyssesHighRestartRate"}


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def run(cmd, **kw):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=kw.pop("timeout", 120), **kw)
    return proc.returncode, proc.stdout


def render(path):
    if not KUBECTL:
        raise AssertionError("kubectl not found (Debian package kubernetes-client)")
    rc, out = run([KUBECTL, "kustomize", path])
    if rc != 0:
        raise AssertionError(f"kubectl kustomize {path}:\n{out}")
    return [d for d in yaml.safe_load_all(out) if d]


def render_with(components, edit=None):
    """Renders base + the given components from a copy of deploy/k8s (kustomize refuses
    absolute paths); `edit(copy_root)` may change the copy first."""
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "k8s")
        shutil.copytree(K8S, root)
        if edit:
            edit(root)
        overlay = os.path.join(root, "overlays", "check")
        os.makedirs(overlay)
        with open(os.path.join(overlay, "kustomization.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump({"resources": ["../../base"],
                            "components": [f"../../components/{c}" for c in components]}, f)
        return render(overlay)


def find(objects, kind, name=None):
    found = [d for d in objects if d["kind"] == kind and
             (name is None or d["metadata"]["name"] == name)]
    if len(found) != 1:
        raise AssertionError(f"{kind}/{name}: {len(found)} objects")
    return found[0]


def pod_specs(objects):
    """(kind/name, pod spec) of every workload."""
    return [(f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
            for d in objects if d["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet")]


# --- Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards) --
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                 "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def pod_security_problems(pod, level):
    """What keeps `pod` (a pod spec) from the Pod Security level `baseline` or `restricted`
    (the policies of v1.30; AppArmor annotations, SELinux options and sysctls: any setting
    counts as a problem, none is used here)."""
    problems = []
    containers = pod.get("initContainers", []) + pod.get("containers", [])
    psc = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"{field}: true")
    if psc.get("seLinuxOptions") or psc.get("sysctls"):
        problems.append("pod seLinuxOptions/sysctls set")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        problems.append("pod seccompProfile Unconfined")
    for v in pod.get("volumes", []):
        if "hostPath" in v:
            problems.append(f"volume {v['name']}: hostPath")
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPS:
            problems.append(f"{name}: adds {sorted(added - BASELINE_CAPS)} (not in baseline)")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            problems.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount {sc['procMount']}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            problems.append(f"{name}: seccompProfile Unconfined")
        if sc.get("seLinuxOptions"):
            problems.append(f"{name}: seLinuxOptions set")
    if level == "baseline":
        return problems
    assert level == "restricted", level
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {v['name']}: {sorted(kinds)} not allowed in restricted")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        if sc.get("seccompProfile", {}).get("type", pod_seccomp) not in ("RuntimeDefault",
                                                                         "Localhost"):
            problems.append(f"{name}: seccompProfile is not RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{name}: capabilities.drop lacks ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds {caps['add']} (restricted: NET_BIND_SERVICE only)")
    return problems


def namespace_level(objects, mode="enforce"):
    ns = find(objects, "Namespace")
    return ns["metadata"]["labels"].get(f"pod-security.kubernetes.io/{mode}")


class PodSecurityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.objects = render(os.path.join(K8S, "overlays", "eks"))

    def test_levels_by_the_documented_rules(self):
        self.assertEqual(namespace_level(self.objects), "baseline")
        self.assertEqual(namespace_level(self.objects, "warn"), "restricted")
        self.assertEqual(namespace_level(self.objects, "audit"), "restricted")
        pods = dict(pod_specs(self.objects))
        self.assertEqual(pod_security_problems(pods["Deployment/ulysses-coordinator"],
                                               "restricted"), [])
        self.assertEqual(pod_security_problems(pods["StatefulSet/ulysses-worker"],
                                               "restricted"), [])
        job = pods["Job/ulysses-prepare-shared"]
        self.assertEqual(pod_security_problems(job, "baseline"), [])
        self.assertIn("prepare-shared: runAsUser 0", pod_security_problems(job, "restricted"))
        for name, pod in pods.items():
            self.assertEqual(pod_security_problems(pod, "baseline"), [], name)

    def test_every_container_drops_all_capabilities(self):
        for name, pod in pod_specs(self.objects):
            for c in pod.get("initContainers", []) + pod["containers"]:
                sc = c.get("securityContext") or {}
                self.assertEqual(sc.get("capabilities", {}).get("drop"), ["ALL"], name)
                self.assertIs(sc.get("allowPrivilegeEscalation"), False, name)
            self.assertEqual(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault")

    def test_rdma_component_adds_ipc_lock_and_says_privileged(self):
        objects = render_with(["rdma"])
        worker = dict(pod_specs(objects))["StatefulSet/ulysses-worker"]
        self.assertIn("IPC_LOCK", worker["containers"][0]["securityContext"]["capabilities"]["add"])
        self.assertNotEqual(pod_security_problems(worker, "baseline"), [])
        self.assertEqual(namespace_level(objects), "privileged")

    def test_checker_notices_each_rule(self):
        pod = dict(pod_specs(self.objects))["Deployment/ulysses-coordinator"]

        def container(p):
            return p["containers"][0]

        breaks = [
            ("baseline", lambda p: p.update(hostNetwork=True)),
            ("baseline", lambda p: container(p)["securityContext"].update(privileged=True)),
            ("baseline", lambda p: container(p)["securityContext"]["capabilities"].update(
                add=["SYS_ADMIN"])),
            ("baseline", lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}})),
            ("baseline", lambda p: p["securityContext"].update(
                seccompProfile={"type": "Unconfined"})),
            ("baseline", lambda p: container(p)["ports"][0].update(hostPort=50051)),
            ("restricted", lambda p: container(p)["securityContext"].update(
                allowPrivilegeEscalation=True)),
            ("restricted", lambda p: container(p)["securityContext"].update(runAsUser=0)),
            ("restricted", lambda p: container(p)["securityContext"]["capabilities"].pop("drop")),
            ("restricted", lambda p: p["securityContext"].pop("seccompProfile")),
            ("restricted", lambda p: p["securityContext"].pop("runAsNonRoot")),
        ]
        for i, (level, mutate) in enumerate(breaks):
            broken = copy.deepcopy(pod)
            mutate(broken)
            self.assertNotEqual(pod_security_problems(broken, level), [], f"break #{i}")


class StorageTest(unittest.TestCase):
    def test_each_overlay_names_rwx_and_block_storage(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                objects = render(os.path.join(K8S, "overlays", overlay))
                classes = {d["metadata"]["name"]: d for d in objects if d["kind"] == "StorageClass"}
                shared = find(objects, "PersistentVolumeClaim", "ulysses-shared")["spec"]
                state = find(objects, "PersistentVolumeClaim", "ulysses-coordinator-state")["spec"]
                self.assertEqual(shared["accessModes"], ["ReadWriteMany"])
                self.assertEqual(classes[shared["storageClassName"]]["provisioner"],
                                 RWX_PROVISIONERS[overlay])
                self.assertEqual(state["accessModes"], ["ReadWriteOncePod"])
                self.assertNotEqual(state["storageClassName"], shared["storageClassName"])
                state_class = classes.get(state["storageClassName"])
                if state_class is not None:  # onprem names the admin's own block class
                    self.assertNotIn(state_class["provisioner"], FILE_PROVISIONERS,
                                     "SQLite needs block storage, never NFS")
                    self.assertEqual(state_class["volumeBindingMode"], "WaitForFirstConsumer")
                self.assertNotIn("nfs", state["storageClassName"])

    def test_base_leaves_the_classes_to_the_overlays(self):
        for d in render(os.path.join(K8S, "base")):
            if d["kind"] == "PersistentVolumeClaim":
                self.assertNotIn("storageClassName", d["spec"], d["metadata"]["name"])

    def test_efs_access_point_owns_files_as_the_images_user(self):
        objects = render(os.path.join(K8S, "overlays", "eks"))
        efs = find(objects, "StorageClass", "ulysses-efs")["parameters"]
        self.assertEqual((efs["uid"], efs["gid"]), (str(IMAGE_UID), str(IMAGE_UID)))
        self.assertEqual(efs["provisioningMode"], "efs-ap")


class PrepareSharedTest(unittest.TestCase):
    """The Job that creates /shared/* with the images' owner, and the script it runs, run
    here for real (as root, then as an unprivileged user whose chown fails)."""

    @classmethod
    def setUpClass(cls):
        cls.objects = render(os.path.join(K8S, "base"))
        cls.job = find(cls.objects, "Job", "ulysses-prepare-shared")
        cls.pod = cls.job["spec"]["template"]["spec"]
        (cls.container,) = cls.pod["containers"]
        cls.script = cls.container["command"][-1]
        cm = next(d for d in cls.objects if d["kind"] == "ConfigMap")
        cls.config = yaml.safe_load(cm["data"]["coordinator.yaml"])

    def needed_dirs(self):
        sts = find(self.objects, "StatefulSet", "ulysses-worker")
        work = [a.split("=", 1)[1] for a in sts["spec"]["template"]["spec"]["containers"][0]["args"]
                if a.startswith("--work-dir=")][0]
        paths = [self.config["checkpoint_root"], self.config["out_root"], work,
                 *self.config["data_roots"]]
        return sorted({"/".join(p.split("/")[:3]) for p in paths})  # /shared/<top>

    def run_script(self, tmp, user=None):
        script = self.script.replace("/shared/", f"{tmp}/")
        cmd = ["/bin/sh", "-c", script]
        if user is not None:
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
        return run(cmd)

    def test_mounts_the_shared_claim_and_creates_every_needed_dir(self):
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        (mount,) = self.container["volumeMounts"]
        self.assertEqual(mount["mountPath"], "/shared")
        self.assertEqual(volumes[mount["name"]]["persistentVolumeClaim"]["claimName"],
                         "ulysses-shared")
        created = set(re.search(r"for d in ([\w ]+); do", self.script).group(1).split())
        for d in self.needed_dirs():
            self.assertIn(d.split("/")[-1], created, d)
        self.assertIn(f"chown {IMAGE_UID}:{IMAGE_UID}", self.script)
        dep = find(self.objects, "Deployment", "ulysses-coordinator")
        self.assertEqual(dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"], IMAGE_UID)
        (wait,) = dep["spec"]["template"]["spec"]["initContainers"]
        self.assertIn("/shared/checkpoints", wait["command"][-1])

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"),
                         "needs root (chown) and setpriv to run the Job's script")
    def test_script_chowns_as_root_and_explains_when_it_cannot(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o777)
            rc, out = self.run_script(tmp)
            self.assertEqual(rc, 0, out)
            for d in ("data", "checkpoints", "models", "runs", "work"):
                st = os.stat(os.path.join(tmp, d))
                self.assertEqual((st.st_uid, st.st_gid), (IMAGE_UID, IMAGE_UID), d)
                self.assertEqual(st.st_mode & 0o777, 0o770, d)
            rc, out = self.run_script(tmp)  # Idempotent.
            self.assertEqual(rc, 0, out)
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o777)
            # Like root on a root-squashed export: mkdir works, chown does not.
            rc, out = self.run_script(tmp, user=65534)
            self.assertNotEqual(rc, 0, out)
            self.assertIn("not 10001:10001", out)
            self.assertIn("docs/DEPLOY.md", out)


class IdentityTest(unittest.TestCase):
    def test_own_service_accounts_without_tokens_and_priority_classes(self):
        objects = render(os.path.join(K8S, "base"))
        accounts = {d["metadata"]["name"]: d for d in objects if d["kind"] == "ServiceAccount"}
        classes = {d["metadata"]["name"]: d for d in objects if d["kind"] == "PriorityClass"}
        for sa in accounts.values():
            self.assertIs(sa["automountServiceAccountToken"], False)
        for name, pod in pod_specs(objects):
            self.assertIn(pod.get("serviceAccountName"), accounts, name)
            self.assertIs(pod.get("automountServiceAccountToken"), False, name)
        for kind, name in (("Deployment", "ulysses-coordinator"), ("StatefulSet", "ulysses-worker")):
            pod = find(objects, kind, name)["spec"]["template"]["spec"]
            self.assertIn(pod.get("priorityClassName"), classes, name)
        self.assertEqual(classes["ulysses-worker"]["preemptionPolicy"], "Never")
        self.assertGreater(classes["ulysses-control-plane"]["value"], classes["ulysses-worker"]["value"])

    def test_overlay_images_carry_a_registry_and_the_base_tag(self):
        base = yaml.safe_load(read_text(os.path.join(K8S, "base", "kustomization.yaml")))
        tags = {i["name"]: i["newTag"] for i in base["images"]}
        for overlay in OVERLAYS:
            for name, pod in pod_specs(render(os.path.join(K8S, "overlays", overlay))):
                for c in pod.get("initContainers", []) + pod["containers"]:
                    m = re.fullmatch(r"([a-z0-9.-]+\.[a-z]+(?::\d+)?)/(?:[\w.-]+/)*([\w.-]+):([\w.-]+)",
                                     c["image"])
                    self.assertIsNotNone(m, f"{overlay} {name}: {c['image']} has no registry")
                    if m.group(2) in tags:
                        self.assertEqual(tags[m.group(2)], m.group(3), c["image"])
                    else:  # A vendor's image (GKE's tcpxo-daemon): pinned to a version.
                        self.assertFalse(m.group(2).startswith("ulysses-"), c["image"])
                        self.assertNotEqual(m.group(3), "latest", c["image"])

    def test_config_edit_renames_the_config_map_and_rolls_the_coordinator(self):
        def volume(objects):
            pod = find(objects, "Deployment", "ulysses-coordinator")["spec"]["template"]["spec"]
            return next(v for v in pod["volumes"] if v["name"] == "config")["configMap"]["name"]

        def edit(root):
            path = os.path.join(root, "base", "config", "coordinator.yaml")
            text = read_text(path)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.replace("restart_backoff_max_s: 60", "restart_backoff_max_s: 120"))

        before = volume(render_with([]))
        after = volume(render_with([], edit))
        self.assertRegex(before, r"^ulysses-coordinator-config-[a-z0-9]+$")
        self.assertNotEqual(before, after)

    def test_worker_secret_entries_match_the_replicas(self):
        sts = find(render(os.path.join(K8S, "base")), "StatefulSet", "ulysses-worker")
        tls = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
        names = [s["secret"]["name"] for s in tls["projected"]["sources"]]
        self.assertEqual(names, [f"ulysses-worker-{i}-tls" for i in range(sts["spec"]["replicas"])])

    def test_cert_manager_component_gives_each_worker_its_own_key(self):
        objects = render_with(["monitoring", "cert-manager"])
        sts = find(objects, "StatefulSet", "ulysses-worker")
        pod = sts["spec"]["template"]["spec"]
        tls = next(v for v in pod["volumes"] if v["name"] == "tls")
        self.assertNotIn("projected", tls)
        attrs = tls["csi"]["volumeAttributes"]
        self.assertEqual(tls["csi"]["driver"], "csi.cert-manager.io")
        self.assertEqual(attrs["csi.cert-manager.io/common-name"], "${POD_NAME}")
        self.assertIn("client auth", attrs["csi.cert-manager.io/key-usages"])
        args = pod["containers"][0]["args"]
        for flag, file in (("--ca", "ca.crt"), ("--cert", "tls.crt"), ("--key", "tls.key")):
            self.assertIn(f"{flag}=/run/secrets/ulysses/tls/{file}", args)
        cert = find(objects, "Certificate", "ulysses-coordinator")["spec"]
        ns = find(objects, "Namespace")["metadata"]["name"]
        self.assertIn(f"ulysses-coordinator.{ns}.svc", cert["dnsNames"])
        for d in objects:
            if d["kind"] in ("Certificate", "Issuer"):
                self.assertEqual(d["metadata"].get("namespace"), ns, d["metadata"]["name"])
        self.assertIn("ulysses-coordinator", cert["dnsNames"])
        dep = find(objects, "Deployment", "ulysses-coordinator")["spec"]["template"]["spec"]
        secret = next(v for v in dep["volumes"] if v["name"] == "tls")["secret"]["secretName"]
        self.assertEqual(cert["secretName"], secret)


class MonitoringTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.objects = render(os.path.join(K8S, "overlays", "gke"))

    def test_monitors_select_the_pods_and_name_the_jobs_the_rules_use(self):
        prometheus = yaml.safe_load(read_text(os.path.join(K8S, "prometheus", "prometheus.yml")))
        jobs = [j["job_name"] for j in prometheus["scrape_configs"]]
        svc = find(self.objects, "Service", "ulysses-coordinator")
        sm = find(self.objects, "ServiceMonitor", "ulysses-coordinator")["spec"]
        self.assertLessEqual(sm["selector"]["matchLabels"].items(), svc["metadata"]["labels"].items())
        self.assertIn(sm["endpoints"][0]["port"], [p["name"] for p in svc["spec"]["ports"]])
        sts = find(self.objects, "StatefulSet", "ulysses-worker")
        pm = find(self.objects, "PodMonitor", "ulysses-worker")["spec"]
        self.assertLessEqual(pm["selector"]["matchLabels"].items(),
                             sts["spec"]["template"]["metadata"]["labels"].items())
        ports = [p["name"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]]
        self.assertIn(pm["podMetricsEndpoints"][0]["port"], ports)

        def job(endpoint):
            (r,) = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
            return r["replacement"]

        self.assertEqual([job(sm["endpoints"][0]), job(pm["podMetricsEndpoints"][0])], jobs)
        rules = read_text(RULES)
        for j in jobs:
            self.assertIn(f'up{{job="{j}"}}', rules)
        releases = {find(self.objects, k)["metadata"]["labels"]["release"]
                    for k in ("ServiceMonitor", "PodMonitor", "PrometheusRule")}
        self.assertEqual(len(releases), 1)

    def test_prometheus_rule_is_the_rules_file(self):
        rc, out = run([os.path.join(ROOT, "scripts", "k8s_prometheus_rule.py"), "--check"])
        self.assertEqual(rc, 0, out)
        rule = find(self.objects, "PrometheusRule", "ulysses")
        self.assertEqual(rule["spec"], yaml.safe_load(read_text(RULES)))

    def test_dashboard_config_map_for_the_sidecar_with_a_datasource_variable(self):
        cm = next(d for d in self.objects if d["kind"] == "ConfigMap" and
                  d["metadata"].get("labels", {}).get("grafana_dashboard") == "1")
        (text,) = cm["data"].values()
        self.assertNotIn("${DS_", text)
        dashboard = json.loads(text)
        self.assertEqual(dashboard, json.loads(read_text(
            os.path.join(K8S, "components", "monitoring", "ulysses-dashboard.json"))))
        self.assertNotIn("__inputs", dashboard)
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        self.assertEqual(variables["datasource"]["type"], "datasource")
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        refs = []

        def walk(o):
            if isinstance(o, dict):
                if isinstance(o.get("datasource"), dict) and o["datasource"].get("type") == "prometheus":
                    refs.append(o["datasource"])
                for v in o.values():
                    walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)

        walk(dashboard)
        self.assertGreater(len(refs), 20)
        for ref in refs:
            self.assertEqual(ref, {"type": "prometheus", "uid": "${datasource}"})


def alerts():
    rules = yaml.safe_load(read_text(RULES))
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


class AlertsTest(unittest.TestCase):
    def test_runbook_for_every_alert(self):
        headings = set(re.findall(r"^## (\w+)$", read_text(RUNBOOK), re.M))
        for a in alerts():
            name = a["alert"]
            self.assertEqual(a["annotations"].get("runbook_url"),
                             f"docs/RUNBOOK.md#{name.lower()}", name)
            self.assertIn(name, headings, f"docs/RUNBOOK.md has no `## {name}`")
        self.assertEqual(headings, {a["alert"] for a in alerts()})

    def test_for_on_every_alert_that_can_flap(self):
        for a in alerts():
            if a["alert"] in EVENT_ALERTS:
                self.assertNotIn("for", a, a["alert"])
                self.assertRegex(a["expr"], r"\[\d+[mh]\]", a["alert"])
            else:
                self.assertRegex(a.get("for", ""), r"^\d+m$", a["alert"])

    def test_thresholds_come_from_the_settings(self):
        by_name = {a["alert"]: a["expr"] for a in alerts()}
        self.assertIn("ulysses_heartbeat_timeout_seconds", by_name["UlyssesWorkerHeartbeatStale"])
        self.assertIn("ulysses_cancel_grace_seconds", by_name["UlyssesCheckpointSlow"])
        self.assertIn("ulysses_checkpoint_every_steps", by_name["UlyssesCheckpointTooOld"])
        self.assertEqual(by_name["UlyssesStoreReadOnly"], "ulysses_store_writable == 0")
        for name, expr in by_name.items():
            if "up{" in expr:
                self.assertIn("absent(up{", expr, f"{name}: silent when the target is gone")
        # On-time heartbeats never reach the alert's threshold (half the timeout).
        config = yaml.safe_load(read_text(os.path.join(K8S, "base", "config", "coordinator.yaml")))
        self.assertLess(config["heartbeat_interval_s"], 0.5 * config["heartbeat_timeout_s"])

    def test_every_alert_has_a_firing_and_a_quiet_promtool_case(self):
        tests = yaml.safe_load(read_text(RULES_TEST))["tests"]
        firing, quiet = set(), set()
        for t in tests:
            for case in t.get("alert_rule_test", []):
                (firing if case["exp_alerts"] else quiet).add(case["alertname"])
        names = {a["alert"] for a in alerts()}
        self.assertEqual(names - firing, set(), "alerts without a firing test")
        self.assertEqual(names - quiet, set(), "alerts without a non-firing test")

    @unittest.skipUnless(os.path.exists(PROMTOOL), "promtool missing (Debian package prometheus)")
    def test_store_read_only_test_can_fail(self):
        with tempfile.TemporaryDirectory() as tmp:
            text = read_text(RULES)
            broken = text.replace("ulysses_store_writable == 0", "ulysses_store_writable == 2")
            self.assertNotEqual(broken, text)
            with open(os.path.join(tmp, "ulysses-rules.yml"), "w", encoding="utf-8") as f:
                f.write(broken)
            shutil.copy(RULES_TEST, tmp)
            rc, out = run([PROMTOOL, "test", "rules", "ulysses-rules_test.yml"], cwd=tmp)
            self.assertNotEqual(rc, 0, out)
            self.assertIn("UlyssesStoreReadOnly", out)


# --- Schemas -------------------------------------------------------------------------------
NODE = shutil.which("node")
VALIDATOR = os.path.join(ROOT, "tests", "deploy", "schema", "validate.mjs")


def schema_modules():
    """node_modules with the schema packages (scripts/k8s_schema_tools.sh installs them once)."""
    rc, out = run([os.path.join(ROOT, "scripts", "k8s_schema_tools.sh")], timeout=600)
    if rc != 0:
        raise AssertionError(f"scripts/k8s_schema_tools.sh failed (npm reachable?):\n{out}")
    return out.strip().splitlines()[-1]


def validate(modules, objects):
    proc = subprocess.run([NODE, VALIDATOR, modules], input=json.dumps(objects),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return proc.returncode, proc.stdout


class SchemaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not NODE:
            raise AssertionError("node not found: the schema check needs nodejs and npm "
                                 "(scripts/bootstrap.sh installs them)")
        cls.modules = schema_modules()

    def test_every_overlay_and_component_is_valid(self):
        renders = {f"overlays/{o}": render(os.path.join(K8S, "overlays", o)) for o in OVERLAYS}
        renders["base + every component"] = render_with(list(COMPONENTS))
        kinds = set()
        for where, objects in renders.items():
            with self.subTest(where=where):
                rc, out = validate(self.modules, objects)
                self.assertEqual(rc, 0, out)
                self.assertIn(f"{len(objects)} of {len(objects)} objects valid", out)
                kinds |= {d["kind"] for d in objects}
        self.assertLessEqual({"PodMonitor", "ServiceMonitor", "PrometheusRule", "Certificate",
                              "Issuer", "StorageClass", "PriorityClass", "Job", "ScaledObject"},
                             kinds)

    def test_a_broken_object_fails(self):
        objects = render_with(list(COMPONENTS))

        def edit(kind, fn):
            broken = copy.deepcopy(next(d for d in objects if d["kind"] == kind))
            fn(broken)
            return broken

        breaks = [
            edit("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0]
                 .update(containerPort="grpc")),
            edit("PersistentVolumeClaim", lambda d: d["spec"].update(accessModes=["ReadWriteOncePods"])),
            edit("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(interval="30 s")),
            edit("PrometheusRule", lambda d: d["spec"]["groups"][0].update(rules="none")),
            edit("Certificate", lambda d: d["spec"].update(dnsNames="ulysses-coordinator")),
            edit("ScaledObject", lambda d: d["spec"].update(minReplicaCount="one")),
            {"apiVersion": "example.com/v1", "kind": "Unknown", "metadata": {"name": "x"}},
        ]
        for obj in breaks:
            with self.subTest(kind=obj["kind"]):
                rc, out = validate(self.modules, [obj])
                self.assertEqual(rc, 1, out)
                self.assertIn(f"INVALID {obj['kind']}/", out)
