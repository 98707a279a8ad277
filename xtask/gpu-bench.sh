#!/usr/bin/env bash
# The benchmark on a machine with a GPU: wgpu on the real adapter (Vulkan), and the PyTorch
# (and TensorFlow) reference if that machine has them. Run from the repository root:
#
#   bash xtask/gpu-bench.sh            # writes reports/bench/bench-gpu.json and prints the table
#
# It builds nothing it cannot build offline: cargo needs the crates already vendored or cached.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
export REQUIRE_WGPU=1
python_flag=()
if python3 -c "import torch" 2>/dev/null; then python_flag=(--python python3); fi
cargo xtask bench --backend wgpu "${python_flag[@]}" --json reports/bench/bench-gpu.json
