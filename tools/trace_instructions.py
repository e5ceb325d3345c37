"""Instructions a decode step costs with the trace on and off, counted under valgrind.

Wall-clock trace overhead on these shared machines moves by several points from run
to run (benchmarks/trace_overhead.py); the instructions a step executes hardly move.
This runs one small export's greedy decode under `valgrind --tool=cachegrind` four
times (traced and untraced, a short and a long decode) and takes differences, so
what is printed is per steady decode step: load, warm-up and prefill cancel out. Use
it to tell whether a change to the traced path does less work; then measure the wall
clock with benchmarks/trace_overhead.py. `--cache` also simulates a cache of the
machine's last-level size per core (2 MiB here) and prints the misses, which a step
that streams its weights pays from memory: they vary by a few hundred a step from
one run to the next (addresses change), instructions by about ten thousand.

Usage: python tools/trace_instructions.py [--flavor onnx] [--cache]
Needs valgrind on PATH; OpenBLAS is held to one thread (valgrind runs threads one at
a time anyway).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

SHORT, LONG = 8, 24

DECODE = """
import gc, sys
import workbench
from workbench import Generator, SessionOptions, models
traced, tokens, flavor = sys.argv[1] == "on", int(sys.argv[2]), sys.argv[3]
session = workbench.InferenceSession(models.llama("small", flavor=flavor).SerializeToString(),
                                     options=SessionOptions(trace=True))
session.stop_recording()
Generator(session).generate(list(range(3, 19)), 8, progress=False, eos_token_id=-1)  # warm
if traced:
    session.new_recording()
gc.collect()
gc.disable()  # a young collection lands on some steps and not others: counted apart from them
Generator(session).generate(list(range(3, 19)), tokens, progress=False, eos_token_id=-1)
"""

COUNTERS = {"instructions": "I   refs", "L1 data misses": "D1  misses", "last-level data misses": "LLd misses"}


def count(script: str, traced: bool, tokens: int, flavor: str, cache: bool) -> dict[str, int]:
    """The counters of one run of `script` under cachegrind."""
    cmd = ["valgrind", "--tool=cachegrind", "--cachegrind-out-file=/dev/null",
           "--cache-sim=yes" if cache else "--cache-sim=no"]
    if cache:
        cmd.append("--LL=2097152,16,64")
    cmd += [sys.executable, script, "on" if traced else "off", str(tokens), flavor]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stderr
    found = {}
    for name, label in COUNTERS.items():
        m = re.search(rf"{re.escape(label)}:\s+([\d,]+)", out)
        if m:
            found[name] = int(m.group(1).replace(",", ""))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flavor", default="onnx", choices=["onnx", "genai"])
    parser.add_argument("--cache", action="store_true", help="simulate the caches too (about twice as slow)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "decode.py")
        with open(script, "w") as f:
            f.write(DECODE)
        runs = [(traced, tokens) for traced in (False, True) for tokens in (SHORT, LONG)]
        with ThreadPoolExecutor(2) as pool:
            counted = dict(zip(runs, pool.map(lambda r: count(script, *r, args.flavor, args.cache), runs)))
    print(f"llama small ({args.flavor} ops), growing KV: per steady decode step "
          f"({LONG} - {SHORT} tokens under valgrind)")
    print(f"{'':<26}{'trace off':>14}{'trace on':>14}{'on / off':>10}")
    for name in counted[(False, SHORT)]:
        off, on = ((counted[(t, LONG)][name] - counted[(t, SHORT)][name]) / (LONG - SHORT) for t in (False, True))
        print(f"{name:<26}{off:>14,.0f}{on:>14,.0f}{on / off:>10.3f}")


if __name__ == "__main__":
    main()
