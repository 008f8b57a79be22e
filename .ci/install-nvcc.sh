#!/usr/bin/env bash
# Installs a CUDA 13.0 nvcc from PyPI wheels into <repo>/.venv-nvcc, so that kernels/build.rs can compile the
# kernels into one fatbin (sm_90a + sm_120a SASS, compute_90 PTX) on a machine without a CUDA toolkit.
# Pinned to 13.0.x: the H200's 13.0 driver cannot JIT PTX from a newer nvcc. Idempotent: does nothing when
# the venv already holds a working nvcc of that version.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${DSV4_NVCC_VENV:-$root/.venv-nvcc}"
want="13.0"

find_nvcc() {
    ls "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc 2>/dev/null | head -n 1
}

existing="$(find_nvcc || true)"
has_nvrtc() {
    ls "$venv"/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so* >/dev/null 2>&1
}

if [[ -n "$existing" ]] && "$existing" --version 2>/dev/null | grep -q "release $want" && has_nvrtc; then
    echo "nvcc already installed: $existing"
    exit 0
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet \
    nvidia-cuda-nvcc==13.0.88 \
    nvidia-cuda-crt==13.0.88 \
    nvidia-nvvm==13.0.88 \
    nvidia-cuda-runtime==13.0.96 \
    nvidia-cuda-cccl==13.0.85 \
    nvidia-cuda-cuobjdump==13.2.86 \
    nvidia-cuda-nvrtc==13.0.88

nvcc="$(find_nvcc)"
if [[ -z "$nvcc" ]]; then
    echo "install-nvcc: nvcc not found under $venv after install" >&2
    exit 1
fi
"$nvcc" --version | tail -n 2
echo "nvcc installed: $nvcc"
