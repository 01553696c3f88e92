#!/usr/bin/env bash
# GPU machine check (< 8 minutes): the CUDA tests, then the inference batching benchmark.
# Usage: bench/gpu_check.sh  [from the repo root or anywhere]
# Works in the project's venv, or with a system torch plus wheels in .whl/ (the device tool).
# On a lent machine whose image has torch, numpy and Pillow but not the rest, prepare the
# wheels here first (its Python is 3.12) and carry `.whl`:
#   echo /.whl/ >> .git/info/exclude; for p in redis==7.4.1 structlog orjson hiredis plyfile \
#     pytest-asyncio; do python3 -m pip download -q --no-deps --only-binary=:all: \
#     --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $p; done
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-/tmp/splatq-gpu-check}"
mkdir -p "$OUTDIR"
PY="${PYTHON:-python3}"
if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  PY=.venv/bin/python
elif [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/splatq-site .whl/*.whl
  export PYTHONPATH="/tmp/splatq-site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
"$PY" - <<'PYEOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA DEVICE")
PYEOF
echo "== CUDA and model tests"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
  tests/gpu_worker/test_cuda.py tests/gpu_worker/test_model_and_renderer.py \
  tests/gpu_worker/test_batching_and_oom.py tests/gpu_worker/test_formats.py \
  2>&1 | tee "$OUTDIR/gpu_tests.txt"
echo "== inference batching (forward pass)"
timeout 150 "$PY" -m bench.inference_batching --device cuda --min-seconds 1 \
  2>&1 | tee "$OUTDIR/inference_batching.txt"
echo "== inference batching (with artifacts: PLY, .splat, preview render), preview"
timeout 90 "$PY" -m bench.inference_batching --device cuda --min-seconds 1 \
  --qualities preview --sizes 1,8,32 --with-artifacts \
  2>&1 | tee "$OUTDIR/inference_batching_artifacts.txt"
