"""Long differential fuzzing campaigns: random multi-step programs on the workbench vs
onnxruntime, without hypothesis's example limit.

    python benchmarks/fuzz.py --cases 5000 --seed 0 --out fuzz-failures [--backend draw|cpu|cuda]

Each case runs on the CPU backend or on backend="cuda" (the device double), drawn per
case unless --backend fixes it. Case k uses seed S+k, so `--cases 1 --seed S+k` reruns one case. Every failure is
shrunk (greedy delta debugging over the program description) and written to
OUT/seed<k>/ as model.onnx + inputs.npz + case.json (switches, slot schedule, steps,
failing step / output, max abs error); `tests/fuzz/test_fuzz_regressions.py` replays
such a folder once it is copied under tests/fuzz/regressions/.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz.harness import OracleError, case_from_program, run_case, save_case, shrink  # noqa: E402
from fuzz.programs import RandomDraw, generate  # noqa: E402


def _signature(failure) -> str:
    """A coarse bucket for the summary: the exception's last line, or 'mismatch'."""
    if failure.kind == "exception":
        return "exception: " + (failure.detail.strip().splitlines() or ["?"])[-1][:120]
    return "mismatch"


def run_one(seed: int, out: Path | None, shrink_s: float,
            backend: str | None = None) -> tuple[str, str | None, str]:
    """('ok' | 'fail' | 'invalid', a line to print or None, the backend the case ran on)."""
    prog = generate(RandomDraw(seed), backend=backend)
    ran_on = prog.options["backend"]
    try:
        failure = run_case(case_from_program(prog))
    except OracleError as e:
        return "invalid", f"seed {seed}: generator emitted an invalid program: {e}", ran_on
    if failure is None:
        return "ok", None, ran_on
    line = f"seed {seed}: {failure.describe()}\n    {prog.summary()}"
    if out is not None:
        small, small_failure = shrink(prog, failure, budget_s=shrink_s)
        folder = save_case(case_from_program(small), out / f"seed{seed}", small_failure,
                           {"seed": seed, "program": small.summary()})
        line += f"\n    shrunk to {len(small.ops)} ops / {small.steps} steps -> {folder}\n    " \
                f"{small.summary()}\n    {small_failure.describe()}"
    return "fail", line, ran_on


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write shrunk failing cases here")
    ap.add_argument("--shrink-seconds", type=float, default=60.0, help="time budget to shrink one failure")
    ap.add_argument("--progress", type=int, default=200, help="print a progress line every N cases")
    ap.add_argument("--backend", choices=("draw", "cpu", "cuda"), default="draw",
                    help="where cases run: drawn per case (default), the CPU backend, or backend='cuda' "
                         "(the device double; WORKBENCH_CUDA_DOUBLE=0 for CuPy on a GPU)")
    args = ap.parse_args(argv)
    backend = None if args.backend == "draw" else args.backend
    backends: Counter = Counter()
    counts: Counter = Counter()
    buckets: Counter = Counter()
    t0 = time.perf_counter()
    for k in range(args.cases):
        seed = args.seed + k
        status, line, ran_on = run_one(seed, args.out, args.shrink_seconds, backend)
        counts[status] += 1
        backends[ran_on] += 1
        if line:
            print(line, flush=True)
            buckets[line.splitlines()[0].split(": ", 1)[1].split(" at ")[0]] += 1
        if (k + 1) % args.progress == 0:
            rate = (k + 1) / (time.perf_counter() - t0)
            print(f"[{k + 1}/{args.cases}] {dict(counts)} {rate:.1f} cases/s", flush=True)
    elapsed = time.perf_counter() - t0
    print(f"done: {args.cases} cases in {elapsed:.1f}s ({args.cases / elapsed:.1f} cases/s, shrinking "
          f"included): {dict(counts)}; by backend: {dict(backends)}; failures by kind: {dict(buckets)}")
    return 1 if counts["fail"] or counts["invalid"] else 0


if __name__ == "__main__":
    sys.exit(main())
