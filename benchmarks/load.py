"""Session load time and resident memory: workbench vs onnxruntime, same files, same run.

Usage: python benchmarks/load.py [--repeats 3] [--no-smollm2]

Each row loads the model in a fresh subprocess (so neither runtime profits from the
other's page cache warm-up more than the first load did) and reports the median wall
time of import + `InferenceSession(...)`, the session alone (workbench's import of
onnx, which loads ml_dtypes, can take most of a second on its own), and the process's
peak RSS after loading.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from workbench import WorkbenchError, models

_CHILD = r"""
import json, sys, time
runtime, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if runtime == "workbench":
    import workbench
    imported = time.perf_counter()
    workbench.InferenceSession(path, workbench.SessionOptions(trace=False))
else:
    import onnxruntime as ort
    imported = time.perf_counter()
    ort.InferenceSession(path, providers=["CPUExecutionProvider"])
done = time.perf_counter()
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))  # peak RSS of this image
print(json.dumps({"s": done - t, "import_s": imported - t, "session_s": done - imported,
                  "rss_mib": int(hwm.split()[1]) / 1024}))
"""


def measure(runtime: str, path: str, repeats: int) -> dict[str, float]:
    """Medians of: `s` (import + session), `import_s`, `session_s`, `rss_mib`."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _CHILD, runtime, path], capture_output=True, text=True,
                             check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def _models(args, folder: Path):
    for label, build in (("llama small (genai)", lambda: models.llama("small", flavor="genai")),
                         ("llama small (onnx)", lambda: models.llama("small", flavor="onnx"))):
        for external in (False, True):
            path = folder / f"{label.replace(' ', '_')}{'_ext' if external else ''}.onnx"
            onnx.save_model(build(), path, save_as_external_data=external, location=path.name + ".data")
            yield label + (", external data" if external else ""), str(path)
    if not args.no_smollm2:
        try:
            path, _ = models.smollm2()
            yield "SmolLM2-135M fp32", str(path)
        except WorkbenchError as e:
            print(f"(SmolLM2 skipped: {e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-smollm2", action="store_true")
    args = parser.parse_args()
    print(f"{'model':<34}{'workbench s':>12}{'ort s':>8}{'ratio':>7}{'session only':>14}{'ratio':>7}"
          f"{'wb import':>11}{'wb MiB':>9}{'ort MiB':>9}{'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in _models(args, Path(tmp)):
            w = measure("workbench", path, args.repeats)
            o = measure("onnxruntime", path, args.repeats)
            print(f"{label:<34}{w['s']:>12.3f}{o['s']:>8.3f}{w['s'] / o['s']:>7.2f}"
                  f"{w['session_s']:>7.3f}/{o['session_s']:<6.3f}{w['session_s'] / o['session_s']:>7.2f}"
                  f"{w['import_s']:>11.3f}{w['rss_mib']:>9.0f}{o['rss_mib']:>9.0f}{w['rss_mib'] / o['rss_mib']:>7.2f}")


if __name__ == "__main__":
    main()
