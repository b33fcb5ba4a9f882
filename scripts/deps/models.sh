#!/usr/bin/env bash
# torch for the transformers integration's tests and bench, the lightest
# install that imports on this image. PyPI has no CPU-only Linux wheel: the
# wheel is the CUDA build, whose dependencies are ~3 GB of nvidia-* wheels.
# This image's CUDA toolkit (/usr/local/cuda-13.0, on the loader path)
# already has cudart, cuBLAS, cuDNN, ...; `import torch` needs only the
# libraries torch links that the toolkit lacks (libcufile, libcusparseLt,
# libnvshmem_host) and an NCCL as new as torch's (the toolkit's lacks
# symbols torch binds at load; torch preloads the wheel's copy first). So:
# the wheel with --no-deps, its pure-Python dependencies (models.pip) and
# those four wheels (~650 MB in all instead of ~4 GB). Elsewhere (no
# toolkit), the full dependency set is installed instead. Idempotent: a
# working `import torch` returns at once. PAGEDKV_NO_TORCH=1 skips it all
# (the model tests then skip).
set -euo pipefail
[ "${PAGEDKV_NO_TORCH:-0}" = 1 ] && exit 0
py=${PYTHON:-python3}
torch_spec='torch==2.15.0'
# The exact versions torch 2.15.0's metadata pins (cuda-toolkit 13.2.2's cufile).
cuda_wheels=(nvidia-cufile==1.17.1.22 nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2
  nvidia-nccl-cu13==2.30.7)
pip=("$py" -m pip install -q --disable-pip-version-check)
imports() { "$py" -c 'import torch, transformers' >/dev/null 2>&1; }
imports && exit 0
echo "models.sh: installing $torch_spec without its CUDA dependencies, then ${cuda_wheels[*]}"
"${pip[@]}" --no-deps "$torch_spec" "${cuda_wheels[@]}"
imports && exit 0
echo "models.sh: torch does not import with the light install; installing its full dependencies"
"${pip[@]}" "$torch_spec"
"$py" -c 'import torch, transformers'
