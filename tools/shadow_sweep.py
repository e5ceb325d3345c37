"""Shadow-verify every built-in model under every combination of the six switches, on
both backends.

    python tools/shadow_sweep.py [--tokens N] [--backend cpu|cuda|both]

backend="cuda" runs on CuPy where a GPU is, else on the device-discipline double
(tests/cuda_double: capture records without running, no implicit host<->device copy).

Each (model, switches, KV mode, greedy or speculative) decodes with
`shadow="raise"`: every step a mechanism served is re-run eagerly and compared
value by value. Prints one line per model and a total; exits 1 on any divergence
or any token that differs from the all-eager decode. The test suite runs a
pairwise subset of these combinations; this runs all 64.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from builtin_models import BUILT_IN, PROMPT  # noqa: E402

import workbench  # noqa: E402
from workbench import Generator, MechanismDivergenceError, SessionOptions, WorkbenchError  # noqa: E402
from workbench.backend import cuda_module  # noqa: E402

SWITCHES = ("capture", "decode_memo", "view_plan", "views", "compute_in_place", "release_dead_values")
REPEATING = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # prompt lookup finds drafts here


def decode(model, options, tokens, kv, speculative, backend="cpu"):
    session = workbench.InferenceSession(model, options=options, backend=backend)
    prompt = REPEATING if speculative else PROMPT
    result = Generator(session).generate(prompt, tokens, progress=False, eos_token_id=-1, kv=kv,
                                         speculative=speculative)
    return result.tokens, session


def _cuda_array_module() -> contextlib.AbstractContextManager:
    """CuPy where a GPU is, else the device-discipline double."""
    try:
        import cupy

        if cupy.cuda.is_available():
            return contextlib.nullcontext()
    except Exception:  # noqa: BLE001 - no CuPy, or no driver
        pass
    import cuda_double

    return cuda_module(cuda_double)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--backend", choices=("cpu", "cuda", "both"), default="both")
    args = parser.parse_args()
    backends = ("cpu", "cuda") if args.backend == "both" else (args.backend,)
    with _cuda_array_module() if "cuda" in backends else contextlib.nullcontext():
        return _sweep(backends, args.tokens)


def _sweep(backends: tuple[str, ...], n_tokens: int) -> int:
    failures = checked_steps = runs = 0
    t0 = time.perf_counter()
    for backend, (name, build) in itertools.product(backends, BUILT_IN.items()):
        model = build().SerializeToString()
        model_failures = 0
        for kv, speculative in itertools.product(("growing", "fixed"), (0, 3)):
            eager = SessionOptions(capture=False, decode_memo=False, views=False, compute_in_place=False,
                                   view_plan=False, decode_memo_verify=False)
            reference, _ = decode(model, eager, n_tokens, kv, speculative)  # the CPU backend, all eager
            for values in itertools.product((False, True), repeat=len(SWITCHES)):
                combo = dict(zip(SWITCHES, values))
                options = SessionOptions(shadow="raise", decode_memo_verify=False, **combo)
                runs += 1
                where = f"{backend} {name} kv={kv} speculative={speculative} {combo}"
                try:
                    tokens, session = decode(model, options, n_tokens, kv, speculative, backend)
                except MechanismDivergenceError as error:
                    print(f"DIVERGENCE {where}: {error}")
                    model_failures += 1
                    continue
                except WorkbenchError as error:
                    print(f"ERROR {where}: {type(error).__name__}: {error}")
                    model_failures += 1
                    continue
                checked_steps += len(session.recording.shadow_checks())
                if tokens != reference:
                    print(f"TOKENS DIFFER {where}")
                    model_failures += 1
        failures += model_failures
        print(f"{backend:4s} {name:18s} {model_failures} failing of {4 * 2 ** len(SWITCHES)} decodes", flush=True)
    print(f"{runs} decodes on {'+'.join(backends)}, {checked_steps} shadow-checked steps, {failures} failures, "
          f"{time.perf_counter() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
