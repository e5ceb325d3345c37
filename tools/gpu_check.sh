#!/usr/bin/env bash
# One prepared check for a fresh machine with an NVIDIA GPU and CuPy (fits in ~8 min):
#   1. the device and CuPy versions            -> $OUT/device.json
#   2. the cuda-marked tests on real CuPy       -> $OUT/cuda_tests.xml, $OUT/cuda_tests.log
#      (with every builder export idiom decoded under shadow=raise against the CPU backend,
#      and the real-exporter set of tools/real_exports.py when ./real_exports holds one:
#      carry it with the checkout, e.g. `python tools/real_exports.py --out real_exports`)
#   3. every built-in decoded on CUDA (growing and fixed KV, capture on and off),
#      token-exact vs the CPU backend           -> $OUT/decode.json
#   4. the capture benchmark: eager CuPy vs graph replay per token, captured coverage
#                                               -> $OUT/capture_bench.json
#   5. capture per export idiom (benchmarks/capture_holds.py) -> $OUT/capture_holds.json
#   and $OUT/summary.json with each stage's exit status and time.
# Needs only what a GPU image has (numpy, onnx, onnxruntime, pandas, pytest, tqdm,
# cupy); installs nothing and reaches no registry: the package runs from the checkout
# through PYTHONPATH (the front-end deps plotly/ipywidgets/anywidget are not needed).
# Usage: OUT=/some/dir bash tools/gpu_check.sh      (OUT defaults to ./gpu_check_out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
unset WORKBENCH_CUDA_DOUBLE  # real CuPy, never the test double
SUMMARY="$OUT/stages.txt"
: > "$SUMMARY"

stage() {  # stage NAME TIMEOUT_S COMMAND...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    echo "$name $rc $((SECONDS - t0))" >> "$SUMMARY"
    echo "=== $name: rc=$rc in $((SECONDS - t0))s"
}

stage device 60 python - "$OUT" <<'PY'
import json, sys
import cupy, numpy, onnx, onnxruntime
props = cupy.cuda.runtime.getDeviceProperties(0)
info = {"gpu": props["name"].decode(), "cupy": cupy.__version__, "numpy": numpy.__version__,
        "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(), "available": bool(cupy.cuda.is_available())}
print(info)
json.dump(info, open(f"{sys.argv[1]}/device.json", "w"), indent=1)
PY

# compiles CuPy's kernels into the on-disk cache first, which the later stages reuse
[ -f real_exports/manifest.json ] && export WORKBENCH_REAL_EXPORTS="$PWD/real_exports"
stage cuda_tests 300 python -m pytest -q -p no:cacheprovider -m cuda \
    tests/backend/test_cuda.py tests/backend/test_cuda_double.py tests/backend/test_cuda_exports.py \
    tests/decode/test_real_exports.py \
    --junitxml="$OUT/cuda_tests.xml" > "$OUT/cuda_tests.log" 2>&1
tail -25 "$OUT/cuda_tests.log"

stage decode 100 python - "$OUT" <<'PY'
import json, sys, time
sys.path.insert(0, "tests")
import workbench
from workbench import Generator, SessionOptions
from builtin_models import BUILT_IN, PROMPT

rows = []
for name, build in BUILT_IN.items():
    data = build().SerializeToString()
    cpu = Generator(workbench.InferenceSession(data, options=SessionOptions(capture=False))).generate(
        PROMPT, 24, progress=False, eos_token_id=-1, kv="fixed").tokens
    for kv in ("growing", "fixed"):
        for capture in (False, True):
            t0 = time.perf_counter()
            row = {"model": name, "kv": kv, "capture": capture}
            try:
                s = workbench.InferenceSession(data, backend="cuda", options=SessionOptions(capture=capture))
                got = Generator(s).generate(PROMPT, 24, progress=False, eos_token_id=-1, kv=kv).tokens
                ev = s.recording.capture_events()
                row.update(token_exact=got == cpu, replays=int((ev.event == "replay").sum()),
                           retires=int((ev.event == "retire").sum()),
                           quarantines=int((ev.event == "quarantine").sum()))
            except Exception as e:  # noqa: BLE001 - report, keep going
                row.update(token_exact=False, error=f"{type(e).__name__}: {e}"[:500])
            row["seconds"] = round(time.perf_counter() - t0, 2)
            rows.append(row)
            print(row, flush=True)
json.dump({"rows": rows, "all_token_exact": all(r["token_exact"] for r in rows)},
          open(f"{sys.argv[1]}/decode.json", "w"), indent=1)
PY

stage capture_bench 150 python benchmarks/capture.py --size small --tokens 32 --json "$OUT/capture_bench.json"

# does capture hold per export idiom (and on the real-exporter set when carried): replayed
# share, captures per 100 tokens, ms/token capture on vs off, Generator and a plain run loop
stage capture_holds 150 python benchmarks/capture_holds.py --backend cuda --tokens 24 \
    ${WORKBENCH_REAL_EXPORTS:+--exports "$WORKBENCH_REAL_EXPORTS"} --json "$OUT/capture_holds.json"

python - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
stages = {}
for line in open(f"{out}/stages.txt"):
    name, rc, secs = line.split()
    stages[name] = {"rc": int(rc), "seconds": int(secs)}
summary = {"stages": stages}
xml = f"{out}/cuda_tests.xml"
if os.path.exists(xml):
    import xml.etree.ElementTree as ET
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    summary["cuda_tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
for name in ("decode", "capture_bench", "capture_holds"):
    path = f"{out}/{name}.json"
    if os.path.exists(path):
        summary[name] = json.load(open(path))
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
brief = {"stages": stages, "cuda_tests": summary.get("cuda_tests"),
         "decode_all_token_exact": summary.get("decode", {}).get("all_token_exact"),
         "capture_bench": [{"backend": r["backend"], "eager_ms": round(r["eager"]["per_token_ms"], 3),
                            "replay_ms": round(r["replay"]["per_token_ms"], 3), "speedup": round(r["speedup"], 2),
                            "replayed_after_warmup": round(r["replay"]["replayed_share_after_warmup"], 3),
                            "token_exact": r["token_exact_vs_cpu_eager"]}
                           for r in summary.get("capture_bench", {}).get("rows", [])]}
print(json.dumps(brief, indent=1))
PY
