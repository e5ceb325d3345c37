"""Session load time and resident memory: workbench vs onnxruntime, same files, same run.

Usage: python benchmarks/load.py [--repeats 3] [--no-smollm2]

Each row loads the model in a fresh subprocess (so neither runtime profits from the
other's page cache warm-up more than the first load did) and reports the median wall
time of import + `InferenceSession(...)`, the session alone (workbench's import of
onnx, which loads ml_dtypes, can take most of a second on its own), and the process's
peak RSS after loading and after it then decodes 8 tokens (growing KV, greedy, a
16-token prompt). The decode is the same few lines of numpy for both runtimes, so
neither process carries the other's imports (workbench's Generator would add its
modules to onnxruntime's count).
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
from workbench.models import exports

_CHILD = r"""
import json, sys, time
import numpy as np
runtime, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if runtime == "workbench":
    import workbench
    imported = time.perf_counter()
    session = workbench.InferenceSession(path, workbench.SessionOptions(trace=False))
else:
    import onnxruntime as ort
    imported = time.perf_counter()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
done = time.perf_counter()

def peak_mib():  # peak RSS of this process so far
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
    return int(hwm.split()[1]) / 1024

loaded = peak_mib()
# greedy decode, growing KV: past_key_values.N.* in, present.N.* out, as the built-ins name them
ids = np.arange(3, 19, dtype=np.int64)[None]
total = ids.shape[1]
feeds = {}
for i in session.get_inputs():
    if i.name.startswith("past_key_values."):
        shape = [1 if isinstance(d, str) and d.startswith("batch") else 0 if isinstance(d, str) else d for d in i.shape]
        feeds[i.name] = np.zeros(shape, np.float16 if i.type == "tensor(float16)" else np.float32)
names = [o.name for o in session.get_outputs()]
decoded = "past_key_values.0.key" in feeds
for _ in range(8 if decoded else 0):
    feeds["input_ids"] = ids
    feeds["attention_mask"] = np.ones((1, total), np.int64)
    if any(i.name == "position_ids" for i in session.get_inputs()):
        feeds["position_ids"] = np.arange(total - ids.shape[1], total, dtype=np.int64)[None]
    if any(i.name == "use_cache_branch" for i in session.get_inputs()):  # optimum's merged decoder
        feeds["use_cache_branch"] = np.array([total > ids.shape[1]])
    outs = dict(zip(names, session.run(None, feeds)))
    ids = np.array([[int(np.argmax(outs["logits"][0, -1]))]], np.int64)
    total += 1
    for name in feeds:
        if name.startswith("past_key_values."):
            feeds[name] = outs["present." + name[len("past_key_values."):]]
print(json.dumps({"s": done - t, "import_s": imported - t, "session_s": done - imported,
                  "rss_mib": loaded, "decode_rss_mib": peak_mib() if decoded else float("nan")}))
"""


def measure(runtime: str, path: str, repeats: int) -> dict[str, float]:
    """Medians of: `s` (import + session), `import_s`, `session_s`, `rss_mib` (peak after
    loading), `decode_rss_mib` (peak after decoding 8 tokens)."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _CHILD, runtime, path], capture_output=True, text=True,
                             check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def _models(args, folder: Path):
    for label, build in (("llama small (genai)", lambda: models.llama("small", flavor="genai")),
                         ("llama small (onnx)", lambda: models.llama("small", flavor="onnx")),
                         ("llama small (optimum merged)", lambda: exports.optimum_merged(
                             models.llama("small", flavor="onnx")))):
        for external in (False, True):
            path = folder / f"{label.replace(' ', '_')}{'_ext' if external else ''}.onnx"
            onnx.save_model(build(), path, save_as_external_data=external, location=path.name + ".data")
            yield label + (", external data" if external else ""), str(path)
    if not args.no_smollm2:
        try:
            path, _ = models.smollm2()
            yield "SmolLM2-135M fp32", str(path)
            tied = folder / "smollm2_tied"
            tied.mkdir()
            yield "SmolLM2-135M fp32, tied embeddings", str(exports.save_tied_embeddings(path, tied))
        except WorkbenchError as e:
            print(f"(SmolLM2 skipped: {e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-smollm2", action="store_true")
    args = parser.parse_args()
    print(f"{'model':<46}{'workbench s':>12}{'ort s':>8}{'ratio':>7}{'session only':>14}{'ratio':>7}"
          f"{'wb import':>11}{'loaded MiB wb/ort':>19}{'ratio':>7}{'decoding MiB wb/ort':>21}{'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in _models(args, Path(tmp)):
            w = measure("workbench", path, args.repeats)
            o = measure("onnxruntime", path, args.repeats)
            loaded = f"{w['rss_mib']:.0f}/{o['rss_mib']:.0f}"
            decoding = f"{w['decode_rss_mib']:.0f}/{o['decode_rss_mib']:.0f}"
            print(f"{label:<46}{w['s']:>12.3f}{o['s']:>8.3f}{w['s'] / o['s']:>7.2f}"
                  f"{w['session_s']:>7.3f}/{o['session_s']:<6.3f}{w['session_s'] / o['session_s']:>7.2f}"
                  f"{w['import_s']:>11.3f}{loaded:>19}{w['rss_mib'] / o['rss_mib']:>7.2f}"
                  f"{decoding:>21}{w['decode_rss_mib'] / o['decode_rss_mib']:>7.2f}")


if __name__ == "__main__":
    main()
