"""Greedy token-by-token decoding with a KV cache, on workbench or onnxruntime sessions."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .interface import DecodeInterface, DecodeInterfaceError, KvTensor, check, discover, graph_evidence
from .runners import is_workbench_session, model_metadata, model_op_types, run_step

#: staged input buffers kept (by input and shape); a feed whose shape changes (a verify
#: step's tokens and positions) would otherwise leave one behind per shape
MAX_STAGED_BUFFERS = 16

#: attention ops that read past and write present in one fixed-capacity buffer
SHARED_BUFFER_OPS = frozenset({"GroupQueryAttention"})


@dataclass
class GenerationResult:
    prompt: list[int]
    tokens: list[int]  # the new tokens only
    step_times: list[float]  # seconds per step; step 0 is the prefill
    kv_mode: str  # "growing" | "fixed"
    shared_buffer: bool
    stopped_by_eos: bool
    logits: list[np.ndarray] = field(default_factory=list)  # per step, last position, if asked

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.tokens

    @property
    def decode_latency(self) -> float:
        """Median seconds per decode run (prefill excluded)."""
        steps = self.step_times[1:]
        return float(np.median(steps)) if steps else float("nan")

    @property
    def per_token_latency(self) -> float:
        """Decode seconds per generated token (prefill excluded); speculative runs
        yield several tokens each."""
        decoded = len(self.tokens) - 1
        return float(sum(self.step_times[1:]) / decoded) if decoded > 0 else float("nan")


class Generator:
    """Drive a decoder session: prefill, then one token per step until EOS or the budget.

    Works with `workbench.InferenceSession` and with `onnxruntime.InferenceSession`
    alike (same loop), so the two can be compared token for token.
    """

    def __init__(self, session: Any, *, prefill: Any = None, kv_map: dict[str, str] | None = None,
                 head_size: int | None = None, roles: dict[str, str] | None = None,
                 config_head_size: tuple[int, str] | None = None):
        """`session` decodes; `prefill` (optional) is a second session that runs the
        prompt once and starts the KV cache (transformers' prefill.onnx + decode.onnx).
        `kv_map`, `head_size` and `roles` state what discovery cannot read (see
        `workbench.decode.discover`); a model still not understood raises
        DecodeInterfaceError naming each input and what was expected."""
        self.session = session
        self.prefill_session = prefill
        overrides = dict(kv_map=kv_map, head_size=head_size, roles=roles, config_head_size=config_head_size)
        self.interface: DecodeInterface = check(
            discover(session, graph="the decode graph" if prefill is not None else "", **overrides))
        self.prefill_interface: DecodeInterface | None = None
        if prefill is not None:
            self.prefill_interface = check(discover(prefill, graph="the prefill graph", head_size=head_size,
                                                    roles=roles, config_head_size=config_head_size))
            self._check_pair()
        ops = model_op_types(session) or set()
        self.supports_shared_buffer = bool(ops & SHARED_BUFFER_OPS) and _shares_kv_buffers(self.interface, session)
        meta = {**(model_metadata(prefill) if prefill is not None else {}), **model_metadata(session)}
        try:
            config = json.loads(meta.get("workbench.model_config", "{}"))
        except ValueError:
            config = {}
        self.default_eos: int | None = config.get("eos_token_id")
        #: positions the model has rotary/learned embeddings for, when it says
        self.max_positions: int | None = config.get("max_positions")
        self._feed_buffers: dict[tuple, np.ndarray] = {}
        #: (input, dtype) -> a row of ones the attention mask is fed as a prefix of
        self._ones: dict[tuple, Any] = {}
        #: arrays the loop keeps (KV cache, staged inputs) live where the session computes
        self.xp = session.backend.xp if is_workbench_session(session) else np
        #: host -> device staging: a device array is written with the backend's H2D copy
        #: (CuPy's `buf[...] = host` is a fill, which rejects non-scalar host arrays)
        self._backend = session.backend if is_workbench_session(session) else None
        self._work_scope = self._backend.work_scope() if self._backend is not None else contextlib.nullcontext()
        self._ran: Any = session  # the session of the latest step (its recording gets the token)

    @classmethod
    def from_pair(cls, prefill: Any, decode: Any, **overrides: Any) -> Generator:
        """A Generator over two graphs: `prefill` runs the prompt, `decode` every later step."""
        return cls(decode, prefill=prefill, **overrides)

    def describe(self) -> str:
        """How discovery read the model (both graphs for a prefill + decode pair)."""
        parts = [self.interface.describe()]
        if self.prefill_interface is not None:
            parts.insert(0, self.prefill_interface.describe())
        return "\n\n".join(parts)

    def _check_pair(self) -> None:
        """The prefill graph must make every K/V tensor the decode graph reads, alike."""
        pre, dec = self.prefill_interface, self.interface
        made = {(s.layer, s.kind): s for s in pre.kv}
        problems = []
        if any(s.past for s in pre.kv):
            problems.append("the prefill graph has past K/V inputs: give a graph that starts the cache")
        for s in dec.kv:
            p = made.get((s.layer, s.kind))
            if p is None:
                problems.append(f"decode input {s.past!r} (layer {s.layer} {s.kind}): the prefill graph has no "
                                f"matching output (it makes {sorted(x.present for x in pre.kv)})")
            elif p.dtype != s.dtype or _without_seq(p) != _without_seq(s) or p.seq_axis != s.seq_axis:
                problems.append(f"prefill output {p.present!r} {p.dtype}{p.shape} does not match decode input "
                                f"{s.past!r} {s.dtype}{s.shape}")
        if pre.logits != dec.logits:
            problems.append(f"the graphs' logits differ in name: {pre.logits!r} vs {dec.logits!r}")
        if problems:
            raise DecodeInterfaceError("prefill and decode graphs do not fit together:\n"
                                       + "\n".join(f"  - {p}" for p in problems) + "\n" + self.describe())

    def generate(self, input_ids: Any, max_new_tokens: int, *, kv: str = "auto",
                 max_length: int | None = None, eos_token_id: int | None = None,
                 progress: bool = True, return_logits: bool = False,
                 speculative: int = 0, ngram: int = 3,
                 on_token: Callable[[int], None] | None = None) -> GenerationResult:
        """Greedy decode `max_new_tokens` after `input_ids` (batch 1).

        `speculative=k` turns on prompt-lookup speculative decoding: k tokens are
        drafted from the latest earlier occurrence of the context's last n-gram
        (n <= `ngram`), verified in one k+1-token run on the `verify` slot, and the
        longest prefix greedy decoding agrees with is kept — the output is the
        same as plain greedy decoding, in fewer runs. `on_token(id)` is called for
        every new token as it is decided (e.g. to stream text).
        """
        prompt = [int(t) for t in np.asarray(input_ids).reshape(-1)]
        if not prompt:
            raise DecodeInterfaceError("the prompt is empty: give at least one token")
        if max_new_tokens < 1:
            raise DecodeInterfaceError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if speculative < 0:
            raise DecodeInterfaceError(f"speculative must be >= 0 draft tokens, got {speculative}")
        eos = self.default_eos if eos_token_id is None else eos_token_id
        mode = self._kv_mode(kv)
        if max_length is None:
            max_length = len(prompt) + max_new_tokens + speculative
        if max_length < len(prompt) + 1:
            raise DecodeInterfaceError(
                f"max_length {max_length} is smaller than the prompt ({len(prompt)} tokens) plus one new token"
            )
        if self.max_positions and max_length > self.max_positions:
            raise DecodeInterfaceError(
                f"max_length {max_length} exceeds the model's {self.max_positions} positions; "
                "lower max_new_tokens or max_length"
            )
        shared = mode == "fixed" and self.supports_shared_buffer
        result = GenerationResult(prompt, [], [], mode, shared, False)
        budget = min(max_new_tokens, max_length - len(prompt) - speculative)
        bar = _progress(budget, progress)
        # one decode per session at a time; the cache and staged feeds are written on the
        # session's stream, in order with its kernels
        with self._claim_sessions(), self._work_scope:
            cache = _KvCache(self.interface, mode, shared, max_length, self.xp, self._backend)
            try:
                self._decode(result, cache, budget, eos, speculative, ngram, return_logits, bar, on_token)
            finally:
                bar.close()
        return result

    def _claim_sessions(self) -> contextlib.ExitStack:
        """Hold every workbench session of this decode (`InferenceSession.decoding`)."""
        stack = contextlib.ExitStack()
        try:
            for session in (self.session, self.prefill_session):
                if session is not None and hasattr(session, "decoding"):
                    stack.enter_context(session.decoding(f"a Generator.generate decode (thread "
                                                         f"{threading.current_thread().name})"))
        except BaseException:
            stack.close()
            raise
        return stack

    def _decode(self, result: GenerationResult, cache: _KvCache, budget: int, eos: int | None,
                speculative: int, ngram: int, return_logits: bool, bar: Any,
                on_token: Callable[[int], None] | None) -> None:
        pending = list(result.prompt)  # tokens not yet in the KV cache
        while len(result.tokens) < budget:
            draft = _lookup_draft(result.sequence, ngram, speculative) if result.tokens else []
            t0 = time.perf_counter()
            if draft:
                phase, slot = "verify", "verify"
                logits = self._step(pending + draft, cache, phase, slot)
                start = cache.length - len(draft) - 1
                predicted = [int(np.argmax(row)) for row in logits]
                accepted = 0
                while accepted < len(draft) and predicted[accepted] == draft[accepted]:
                    accepted += 1
                cache.truncate(start + 1 + accepted)
                new = draft[:accepted] + [predicted[accepted]]
                rows = logits[: accepted + 1]
            else:
                phase = "prefill" if cache.length == 0 else "decode"
                logits = self._step(pending, cache, phase, "primary")
                new, rows = [int(np.argmax(logits[-1]))], logits[-1:]
            result.step_times.append(time.perf_counter() - t0)
            for token, row in zip(new, rows):
                if len(result.tokens) >= budget:
                    break
                self._record_token(token, cache.length)
                if return_logits:
                    result.logits.append(row)
                result.tokens.append(token)
                bar.update(1)
                if on_token is not None:
                    on_token(token)
                if eos is not None and token == eos:
                    result.stopped_by_eos = True
                    return
            pending = [result.tokens[-1]]

    def _staged(self, name: str, values: Any, dtype: Any = np.int64) -> np.ndarray:
        """Feed `values` through a persistent buffer per input, shape and dtype.

        A captured device graph replays against fixed input addresses, as engines
        that replay graphs keep static input buffers: a fresh array every step
        would retire the graph each time.
        """
        try:
            values = np.asarray(values, dtype=dtype)
        except (OverflowError, TypeError, ValueError) as error:
            raise DecodeInterfaceError(
                f"input {name!r} is {np.dtype(dtype) if isinstance(dtype, (str, type, np.dtype)) else dtype}; "
                f"cannot feed it these values ({type(error).__name__}: {error}); token ids and positions "
                "need an int32 or int64 input") from error
        key = (name, values.shape, values.dtype.str)
        buf = self._feed_buffers.pop(key, None)
        if buf is None:
            buf = self.xp.empty(values.shape, values.dtype)
            if len(self._feed_buffers) >= MAX_STAGED_BUFFERS:  # e.g. positions of a new length
                del self._feed_buffers[next(iter(self._feed_buffers))]  # least recently used
        self._feed_buffers[key] = buf  # most recently used last
        _to_buffer(self._backend, buf, values)
        return buf

    def _mask(self, name: str, length: int, dtype: Any) -> Any:
        """An all-ones attention mask of `length`: a prefix view of one row of ones kept
        per input (grown by doubling), so the mask that grows every step stays at one
        address and costs no fill; sessions only read their feeds."""
        key = (name, np.dtype(dtype).str)
        ones = self._ones.get(key)
        if ones is None or ones.shape[1] < length:
            ones = self._ones[key] = self.xp.ones((1, max(2 * length, 64)), dtype)
        return ones[:, :length]

    def _record_token(self, token: int, position: int) -> None:
        """Note the chosen token beside the step that produced it (in the recording of the
        session that ran it), for the widgets; a pair of graphs also notes which ran."""
        recording = getattr(self._ran, "recording", None)
        if recording is not None and recording.current_step >= 0:
            if self.prefill_session is None:
                recording.add_row("tokens", token=token, position=position)
            else:
                graph = "prefill" if self._ran is self.prefill_session else "decode"
                recording.add_row("tokens", token=token, position=position, graph=graph)

    def _kv_mode(self, kv: str) -> str:
        if kv not in ("auto", "growing", "fixed"):
            raise DecodeInterfaceError(f"kv must be 'auto', 'growing' or 'fixed', got {kv!r}")
        if kv == "fixed" and not self.interface.kv:
            raise DecodeInterfaceError(
                "kv='fixed' needs past/present KV inputs (e.g. past_key_values.0.key) and this "
                "model has none"
            )
        if kv == "auto":
            return "fixed" if self.interface.kv and self.supports_shared_buffer else "growing"
        return kv

    def _step(self, tokens: list[int], cache: _KvCache, phase: str, slot: str) -> np.ndarray:
        """Run `tokens` through the model; the logits of every position, [n, vocab]."""
        first = cache.length == 0 and self.prefill_session is not None
        session, io = (self.prefill_session, self.prefill_interface) if first else (self.session, self.interface)
        n, past_len = len(tokens), cache.length
        feeds: dict[str, np.ndarray] = {io.input_ids: self._staged(io.input_ids, [tokens], io.dtypes[io.input_ids])}
        if io.attention_mask:
            feeds[io.attention_mask] = self._mask(io.attention_mask, past_len + n, io.dtypes[io.attention_mask])
        if io.position_ids:
            feeds[io.position_ids] = self._staged(io.position_ids, np.arange(past_len, past_len + n)[None, :],
                                                  io.dtypes[io.position_ids])
        if io.use_cache_branch:
            feeds[io.use_cache_branch] = self._staged(io.use_cache_branch, [past_len > 0], np.bool_)
        if first:
            presents = {s.past: p.present for s in cache.io.kv
                        for p in io.kv if (p.layer, p.kind) == (s.layer, s.kind)}
            bound, wanted = {}, [io.logits] + list(presents.values())
        else:
            feeds.update(cache.past_feeds())
            presents = None
            bound, wanted = cache.bound_presents(), [io.logits] + cache.wanted_presents()
        self._ran = session
        out = run_step(session, feeds, bound, wanted, phase, slot)
        cache.advance(n, out, presents)
        # a workbench session's outputs are the caller's, no later run writes them
        # (`InferenceSession._output`): float32 logits are kept as they come
        return np.asarray(out[io.logits])[0].astype(np.float32, copy=self._backend is None)


def _shares_kv_buffers(io: DecodeInterface, session: Any) -> bool:
    """Whether a past buffer of the full capacity can also be the present it is written
    into. GroupQueryAttention then takes the valid length from the attention mask
    (seqlens_k); an export with no mask measures its past by its shape, and one that
    declares its present as past + n (transformers' exporter after onnxruntime's CPU
    fusions) grows a new one each step: fed a full-capacity past, both attend to the
    unwritten rows, with no error. Nor can a present the attention op does not write
    itself."""
    if io.attention_mask is None:
        return False
    declared = {o.name: o.shape for o in session.get_outputs()}
    producers = graph_evidence(session).producers
    for s in io.kv:
        shape = declared.get(s.present) or []
        dim = shape[s.seq_axis] if len(shape) > s.seq_axis else None
        if isinstance(dim, str) and "+" in dim:
            return False
        # the attention op must write the present itself: through a Cast (onnxruntime's fp16
        # converter with keep_io_types) the past it reads is a copy, never the bound buffer
        made_by = producers.get(s.present)
        if producers and (made_by is None or made_by.op_type not in SHARED_BUFFER_OPS):
            return False
    return True


class _KvCache:
    """The KV cache of one generation: growing arrays, or one fixed buffer per slot."""

    def __init__(self, io: DecodeInterface, mode: str, shared: bool, capacity: int, xp: Any = np,
                 backend: Any = None):
        self.io, self.mode, self.shared, self.capacity = io, mode, shared, capacity
        self.backend = backend
        self.length = 0
        self.arrays: dict[str, np.ndarray] = {}
        for slot in io.kv:
            length = capacity if mode == "fixed" else 0
            self.arrays[slot.past] = xp.zeros(_kv_shape(slot, length), dtype=slot.dtype)

    def past_feeds(self) -> dict[str, np.ndarray]:
        if self.mode == "growing" or self.shared:
            return dict(self.arrays)
        # fixed, not shared: a zero-copy view of the filled part of each buffer
        return {s.past: _take(self.arrays[s.past], s.seq_axis, 0, self.length) for s in self.io.kv}

    def bound_presents(self) -> dict[str, np.ndarray]:
        return {s.present: self.arrays[s.past] for s in self.io.kv} if self.shared else {}

    def wanted_presents(self) -> list[str]:
        return [] if self.shared else [s.present for s in self.io.kv]

    def advance(self, n: int, out: dict[str, np.ndarray], presents: dict[str, str] | None = None) -> None:
        """Take the run's new rows. `presents` (past input -> output name) when another graph
        (a prefill graph) made them; it never writes into a shared buffer, so rows are copied."""
        new_len = self.length + n
        names = presents or {s.past: s.present for s in self.io.kv}
        if self.mode == "growing":
            for s in self.io.kv:
                self.arrays[s.past] = out[names[s.past]]
        elif not self.shared or presents is not None:
            for s in self.io.kv:
                present = out[names[s.past]]  # a host array: session.run returns host copies
                _to_buffer(self.backend, _take(self.arrays[s.past], s.seq_axis, self.length, new_len),
                           _take(present, s.seq_axis, self.length, new_len))
        self.length = new_len

    def truncate(self, length: int) -> None:
        """Forget cache rows past `length` (rejected speculative drafts)."""
        if self.mode == "growing":
            for s in self.io.kv:
                self.arrays[s.past] = _take(self.arrays[s.past], s.seq_axis, 0, length)
        self.length = length  # fixed buffers: rows past `length` are overwritten later


def _lookup_draft(sequence: list[int], ngram: int, k: int) -> list[int]:
    """Prompt lookup: the k tokens that followed the latest earlier match of the
    context's last n-gram (longest n first); padded to exactly k so every verify
    run has the same length. Empty when nothing matches."""
    if k <= 0:
        return []
    for n in range(min(ngram, len(sequence) - 1), 0, -1):
        tail = sequence[-n:]
        for start in range(len(sequence) - n - 1, -1, -1):
            if sequence[start:start + n] == tail:
                follow = sequence[start + n:start + n + k]
                if follow:
                    return follow + [follow[-1]] * (k - len(follow))
    return []


def _without_seq(slot: KvTensor) -> list:
    """The slot's shape without the batch and sequence axes."""
    return [d for axis, d in enumerate(slot.shape) if axis not in (0, slot.seq_axis)]


def _kv_shape(slot: KvTensor, length: int) -> tuple[int, ...]:
    shape = []
    for axis, d in enumerate(slot.shape):
        if axis == slot.seq_axis:
            shape.append(length)
        elif isinstance(d, int):
            shape.append(d)
        elif axis == 0:
            shape.append(1)  # batch
        else:
            raise DecodeInterfaceError(
                f"KV input {slot.past!r} has symbolic dim {d!r} on axis {axis}; only batch and "
                "sequence axes may be symbolic"
            )
    return tuple(shape)


def _to_buffer(backend: Any, dst: Any, src: Any) -> None:
    """Write host values into a staged / KV buffer in place: through the backend's H2D
    copy for a workbench session (a device buffer on CUDA), plainly for numpy."""
    if backend is not None and isinstance(src, np.ndarray):
        backend.copy_from_host(dst, src)
    else:
        dst[...] = src


def _take(array: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[axis] = slice(start, stop)
    return array[tuple(index)]


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm  # noqa: PLC0415

    return tqdm(total=total, disable=not enabled, desc="decode", unit="tok", leave=False)
