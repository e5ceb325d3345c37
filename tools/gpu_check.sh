#!/usr/bin/env bash
# One short command for a machine with an NVIDIA GPU and CuPy: the cuda-marked tests,
# then the capture benchmark (eager CuPy vs captured-graph replay), as a small table.
# Needs only what a GPU image has (numpy, onnx, onnxruntime, pandas, pytest, tqdm,
# cupy); installs nothing. Usage: bash tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python - <<'PY'
import cupy
print("GPU:", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "| CuPy", cupy.__version__)
PY
python -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py 2>&1 | tail -15
echo "--- capture benchmark (small llama, genai, fixed KV) ---"
timeout 300 python benchmarks/capture.py --tokens 32
