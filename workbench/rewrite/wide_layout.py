"""The memory order level "all" gives a wide MatMul weight on a multithreaded OpenBLAS
(rule `matvec_layout`, setting `SessionOptions.wide_weight_layout`).

Every other MatMul weight is stored column-major, which one-token products read
fastest. Wide weights (at least 1.5 times as many columns as rows, over OpenBLAS's
threading threshold: `matvec_threads.is_wide`) have gone both ways on this project's
2-core machines, in whole decodes of SmolLM2 (fused Q/K/V 576x960, gate/up 576x3072,
lm_head 576x49152) against onnxruntime in the same run, tokens the same either way:

- an AMD EPYC VM of earlier sessions (numpy streaming weights at about 20 GB/s):
  row-major was faster, fixed KV 1.275 -> 1.227 of onnxruntime's time a token,
  growing 1.41 -> 1.35 (in isolation, 576-row wide weights read row-major in
  0.85-0.96 of the column-major time);
- another AMD EPYC VM (AVX-512, 40-60 GB/s), weights in huge pages or not:
  column-major was faster. `benchmarks/wide_layout.py`, three sessions a setting
  (where a session's weights land moves its decode by several percent alone), six
  rounds: fixed KV 1.166 -> 1.043, growing 1.291 -> 1.130 (a second run: 1.114 ->
  1.007, 1.311 -> 1.077); the sessions' own medians overlapped only once, at the first
  run's fixed row (row-major's best 1.029, column-major's worst 1.076). Per product, capture off: gate/up 165 -> 154 us, Q/K/V 57 -> 50 us,
  lm_head 2.56 -> 2.40 ms.

A probe at load was tried and dropped: on the second machine, timing both orders over
the same bytes out of cache (with or without small kernels between the products, 21
paired rounds, six times) read them about even (row/column 0.96-1.02), while its
decodes ran column-major 10-14% faster; what decides is how sgemv's two threads meet
memory inside a decode step, which a probe outside one does not show. So the default
is the layout every other MatMul weight gets, column-major, and
`wide_weight_layout="row-major"` (WORKBENCH_WIDE_WEIGHT_LAYOUT=row-major) keeps wide
weights as the file has them; `benchmarks/wide_layout.py` decodes with both on a
machine. The order changes how a product sums, not what: values move within float
rounding, as with any layout (`matvec_layout`).

A setting, not a rule: `optimize` puts it in effect for the rules it runs
(`wide_weight_layout`), and `SessionOptions` checks a value with `check_setting`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

#: the settings of `SessionOptions.wide_weight_layout`, the default first
WIDE_WEIGHT_LAYOUTS = ("column-major", "row-major")
DEFAULT_WIDE_WEIGHT_LAYOUT = WIDE_WEIGHT_LAYOUTS[0]

_SETTING: ContextVar[str] = ContextVar("workbench_wide_weight_layout", default=DEFAULT_WIDE_WEIGHT_LAYOUT)


def check_setting(setting: str) -> str:
    text = str(setting).strip().lower()
    if text not in WIDE_WEIGHT_LAYOUTS:
        raise ValueError(f"wide_weight_layout must be one of {WIDE_WEIGHT_LAYOUTS}, got {setting!r}")
    return text


@contextmanager
def wide_weight_layout(setting: str) -> Iterator[None]:
    """While in effect, `wide_weights_row_major` answers for `setting`."""
    token = _SETTING.set(check_setting(setting))
    try:
        yield
    finally:
        _SETTING.reset(token)


def wide_weights_row_major() -> bool:
    """Whether the setting in effect keeps wide weights row-major."""
    return _SETTING.get() == "row-major"
