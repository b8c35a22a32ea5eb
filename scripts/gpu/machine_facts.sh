#!/usr/bin/env bash
# Prints the facts about a GPU machine that docs/GPU.md relies on (OS, compilers, CUDA, NCCL,
# PyTorch, transformers, GPU). Usage: scripts/gpu/machine_facts.sh [PYTHON]
PYTHON=${1:-python3}
echo "== os";       (. /etc/os-release 2>/dev/null; echo "$PRETTY_NAME"); uname -r; ldd --version | head -n 1
echo "== cpu";      nproc; free -g | head -n 2
echo "== tools";    for t in g++ c++ nvcc cmake ninja; do printf '%s: ' "$t"; ($t --version 2>&1 | head -n 1) || echo missing; done
echo "== gpu";      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
echo "== python";   "$PYTHON" - <<'PY'
import importlib, os, sys
print(sys.version.split()[0], sys.executable)
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI)
print("cmake_prefix", torch.utils.cmake_prefix_path)
inc = os.path.join(os.path.dirname(torch.__file__), "include")
print("gloo headers in torch:", os.path.isdir(os.path.join(inc, "gloo")))
print("c10d gloo header:", os.path.exists(os.path.join(inc, "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")))
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, p.total_memory, "sm", p.major, p.minor, "mps", p.multi_processor_count)
print("nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)
for m in ("transformers", "accelerate", "safetensors", "numpy"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "missing", e)
PY
