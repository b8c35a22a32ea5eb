#!/usr/bin/env python3
"""Keeps deploy/images honest without a container engine (none runs on these machines).

For each Containerfile: every repository script it runs exists, is executable and parses
(bash -n), and so does every script those scripts run; every binary it stages is an
add_executable target of the CMake tree; base images are pinned; the final stage runs as a
non-root user, starts a binary it contains and exposes the ports the Kubernetes manifest that
runs it declares; that manifest names the image at the project's version and runs as the
image's user. Also: .containerignore == .dockerignore, and docs/DEPLOY.md gives each build
command. Run by ctest (deploy_images_test) with Debian's /usr/bin/python3 (python3-yaml).
"""
import json
import os
import re
import subprocess
import unittest

import yaml

ROOT = os.environ.get("ULYSSES_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
IMAGES = os.path.join(ROOT, "deploy", "images")
K8S = os.path.join(ROOT, "deploy", "k8s", "base")

# image -> (manifest that runs it, binaries it must contain, container name in the manifest)
EXPECTED = {
    "control-plane": ("coordinator.yaml", {"ulysses-coordinator", "ulyssesctl", "ulysses-worker"},
                      "coordinator"),
    "gpu-worker": ("workers.yaml", {"ulysses-worker", "ulysses-train"}, "worker"),
}
SCRIPT_RE = re.compile(r"\bscripts/[\w./-]+\.sh\b")
SOURCED_RE = re.compile(r"(?:^|[;&|\s])(?:source|\.)\s+(scripts/[\w./-]+\.sh)\b", re.M)
BIN_DIR = "/opt/ulysses/bin/"


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def project_version():
    m = re.search(r"project\(ulysses VERSION ([\d.]+)", read_text(os.path.join(ROOT,
                                                                                "CMakeLists.txt")))
    return m.group(1)


def cmake_executables():
    """Every add_executable target name in the tree's CMakeLists.txt files."""
    names = set()
    for top in ("common", "coordinator", "client", "worker", "bench", "tests", "proto"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            if "CMakeLists.txt" in files:
                text = read_text(os.path.join(dirpath, "CMakeLists.txt"))
                names |= set(re.findall(r"add_executable\(\s*([\w-]+)", text))
    return names


def instructions(path):
    """[(KEYWORD, arguments)] with comments dropped and continuation lines joined."""
    out, current = [], ""
    for line in read_text(path).splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        keyword, _, args = current.strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        current = ""
    return out


class Image:
    """A parsed Containerfile: ARG defaults, stages and what each stage installs."""

    def __init__(self, name):
        self.name = name
        self.path = os.path.join(IMAGES, "Containerfile." + name)
        self.args, self.stages = {}, []
        for keyword, args in instructions(self.path):
            if keyword == "ARG" and not self.stages:
                key, _, value = args.partition("=")
                self.args[key] = value
            elif keyword == "FROM":
                parts = args.split()
                base = parts[0]
                for key, value in self.args.items():
                    base = base.replace("${%s}" % key, value)
                alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
                self.stages.append({"base": base, "alias": alias, "ins": []})
            else:
                self.stages[-1]["ins"].append((keyword, args))

    def stage(self, alias):
        return next(s for s in self.stages if s["alias"] == alias)

    def final(self):
        return self.stages[-1]

    def scripts(self):
        found = set()
        for stage in self.stages:
            for keyword, args in stage["ins"]:
                if keyword in ("RUN", "COPY"):
                    found |= set(SCRIPT_RE.findall(args))
        return found

    def staged_targets(self, stage):
        """Targets that scripts/images/build_binaries.sh builds in a stage."""
        targets = set()
        for keyword, args in stage["ins"]:
            if keyword == "RUN":
                for m in re.finditer(r"scripts/images/build_binaries\.sh\s+\S+((?:\s+[\w-]+)+)",
                                     args):
                    targets |= set(m.group(1).split())
        return targets

    def binaries(self, stage=None, seen=()):
        """Names under /opt/ulysses/bin in a stage (default: the final one), following COPY
        --from into other stages."""
        stage = stage or self.final()
        names = set()
        for keyword, args in stage["ins"]:
            if keyword == "RUN":
                names |= set(re.findall(re.escape(BIN_DIR) + r"([\w-]+)", args))
            if keyword != "COPY":
                continue
            parts = args.split()
            src_stage = None
            if parts[0].startswith("--from="):
                src_stage = self.stage(parts[0][len("--from="):])
                parts = parts[1:]
            *sources, dest = parts
            for src in sources:
                if src_stage is None:
                    continue
                if re.fullmatch(r"/stage/bin/?", src) and dest.startswith(BIN_DIR):
                    names |= self.staged_targets(src_stage)
                elif src.startswith("/stage/bin/") and dest.startswith(BIN_DIR):
                    names.add(os.path.basename(dest.rstrip("/")) if not dest.endswith("/")
                              else os.path.basename(src))
                elif src.rstrip("/") == "/opt/ulysses" and src_stage["alias"] not in seen:
                    names |= self.binaries(src_stage, seen + (src_stage["alias"],))
        return names

    def last(self, keyword):
        values = [a for k, a in self.final()["ins"] if k == keyword]
        return values[-1] if values else None


def manifest_container(manifest, container):
    with open(os.path.join(K8S, manifest), encoding="utf-8") as f:
        for doc in yaml.safe_load_all(f):
            if doc and doc.get("kind") in ("Deployment", "StatefulSet"):
                pod = doc["spec"]["template"]["spec"]
                for c in pod["containers"]:
                    if c["name"] == container:
                        return pod, c
    raise AssertionError(f"{manifest}: no container {container}")


def called_scripts(script, seen=None, sourced=None):
    """A script and every repository script it runs or sources, transitively; and the set of
    those only ever sourced (they need not be executable)."""
    seen = set() if seen is None else seen
    sourced = set() if sourced is None else sourced
    if script in seen:
        return seen, sourced
    seen.add(script)
    path = os.path.join(ROOT, script)
    if os.path.isfile(path):
        text = read_text(path)
        src = set(SOURCED_RE.findall(text))
        executed = {s for s in SCRIPT_RE.findall(text) if s not in src}
        sourced |= src - executed
        for other in sorted(src | executed):
            called_scripts(other, seen, sourced)
    return seen, sourced


class ImagesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.images = {name: Image(name) for name in EXPECTED}
        cls.targets = cmake_executables()

    def test_every_script_exists_is_executable_and_parses(self):
        for image in self.images.values():
            scripts, sourced = set(), set()
            for s in image.scripts():
                called_scripts(s, scripts, sourced)
            self.assertIn("scripts/bootstrap.sh", scripts, image.name)
            self.assertIn("scripts/build_env.sh", sourced, image.name)  # the scan follows calls
            for script in sorted(scripts):
                path = os.path.join(ROOT, script)
                self.assertTrue(os.path.isfile(path), f"{image.name}: {script} does not exist")
                if script not in sourced:
                    self.assertTrue(os.access(path, os.X_OK), f"{script} is not executable")
                r = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, f"{script}: {r.stderr}")

    def test_every_binary_is_a_cmake_target(self):
        self.assertIn("ulysses-train", self.targets)  # the scan sees the tree
        for name, (_, required, _) in EXPECTED.items():
            image = self.images[name]
            binaries = image.binaries()
            self.assertEqual(binaries, required, f"{name}: binaries in the image")
            for stage in image.stages:
                for target in image.staged_targets(stage):
                    self.assertIn(target, self.targets, f"{name}: {target} is no CMake target")
            for binary in binaries:
                self.assertIn(binary, self.targets, f"{name}: {binary} is no CMake target")

    def test_engine_comes_from_build_engine(self):
        engine = self.images["gpu-worker"].stage("engine")
        runs = " ".join(a for k, a in engine["ins"] if k == "RUN")
        m = re.search(r"scripts/gpu/build_engine\.sh\s+(\S+)", runs)
        self.assertIsNotNone(m, "the engine is built by scripts/gpu/build_engine.sh")
        self.assertIn(f"{m.group(1)}/bin/ulysses-train {BIN_DIR}ulysses-train", runs)
        # DEPS_PREFIX is where the engine's DT_RPATH points: it must be inside what is copied.
        self.assertRegex(runs, r"DEPS_PREFIX=/opt/ulysses/")

    def test_bases_are_pinned(self):
        control = self.images["control-plane"]
        self.assertEqual(control.stages[0]["base"], "debian:bookworm")
        self.assertEqual(control.final()["base"], "debian:bookworm")
        gpu = self.images["gpu-worker"]
        self.assertRegex(gpu.args["PYTORCH_IMAGE"],
                         r"^pytorch/pytorch:\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-devel$")
        for image in self.images.values():
            self.assertGreaterEqual(len(image.stages), 2, f"{image.name} is multi-stage")
            for stage in image.stages:
                self.assertRegex(stage["base"], r"^[\w./-]+:[\w.-]+$", image.name)
                self.assertFalse(stage["base"].endswith(":latest"), image.name)
        # The GPU image's PyTorch is the one docs/GPU.md records from the GPU machine.
        torch, cuda = re.match(r"pytorch/pytorch:([\d.]+)-cuda([\d.]+)",
                               gpu.args["PYTORCH_IMAGE"]).groups()
        gpu_md = read_text(os.path.join(ROOT, "docs", "GPU.md"))
        self.assertIn(f"{torch}+cu{cuda.replace('.', '')}", gpu_md)

    def test_final_stage_runs_as_non_root_and_starts_a_binary_it_has(self):
        for name, image in self.images.items():
            user = image.last("USER")
            self.assertIsNotNone(user, f"{name}: no USER")
            uid = user.split(":")[0]
            self.assertNotIn(uid, ("0", "root"), name)
            self.assertTrue(uid.isdigit(), f"{name}: numeric USER (runAsNonRoot can check it)")
            entry = image.last("ENTRYPOINT")
            self.assertIsNotNone(entry, name)
            self.assertIn(json.loads(entry)[0], image.binaries(), name)  # JSON array form

    def test_manifests_run_the_images(self):
        version = project_version()
        for name, (manifest, _, container) in EXPECTED.items():
            image = self.images[name]
            pod, c = manifest_container(manifest, container)
            # The manifest names the image; base/kustomization.yaml's images: gives the tag
            # (and the overlays the registry).
            self.assertEqual(c["image"], f"ulysses-{name}", manifest)
            with open(os.path.join(K8S, "kustomization.yaml"), encoding="utf-8") as f:
                tags = {i["name"]: i.get("newTag") for i in yaml.safe_load(f)["images"]}
            self.assertEqual(tags.get(f"ulysses-{name}"), version, "kustomization images:")
            self.assertIn(c["command"][0], image.binaries(), manifest)
            ports = {p["containerPort"] for p in c.get("ports", [])}
            exposed = {int(p) for p in image.last("EXPOSE").split()}
            self.assertEqual(exposed, ports, f"{name}: EXPOSE vs {manifest}")
            uid, gid = image.last("USER").split(":")
            sc = pod.get("securityContext", {})
            self.assertEqual(sc.get("runAsUser"), int(uid), manifest)
            self.assertEqual(sc.get("runAsGroup"), int(gid), manifest)
            self.assertEqual(sc.get("fsGroup"), int(gid), manifest)
            self.assertTrue(sc.get("runAsNonRoot"), manifest)

    def test_ignore_files_keep_the_context_to_sources(self):
        container = read_text(os.path.join(ROOT, ".containerignore"))
        self.assertEqual(container, read_text(os.path.join(ROOT, ".dockerignore")))
        lines = set(container.splitlines())
        for pattern in (".git", "build*", ".debs", ".deps"):
            self.assertIn(pattern, lines)

    def test_deploy_md_gives_each_build_command(self):
        text = read_text(os.path.join(ROOT, "docs", "DEPLOY.md"))
        version = project_version()
        for name in EXPECTED:
            command = f"podman build -f deploy/images/Containerfile.{name} -t ulysses-{name}:{version} ."
            self.assertTrue(command in text, f"docs/DEPLOY.md lacks `{command}`")

    def test_checker_sees_a_missing_binary(self):
        # The binary scan is what the checks above rely on: a stage without the COPY loses it.
        image = Image("control-plane")
        image.final()["ins"] = [i for i in image.final()["ins"]
                                if not (i[0] == "COPY" and "/stage/bin/" in i[1])]
        self.assertEqual(image.binaries(), set())


if __name__ == "__main__":
    import ctest_main  # noqa: E402  (exits 77 when a check skipped and none failed)
    ctest_main.main()
