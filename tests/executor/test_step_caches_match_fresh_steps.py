"""A traced step served from the executor's per-step caches records what a fresh step
records: what the executor skips recomputing per step must not change a value nor a
recorded row.

The executor rebuilds a step's liveness rows only where something moved since
the slot's last step (same storage plan, owners, pinned and released sets: only the
rows whose value's nbytes changed), reuses an io_buffers address for the very same
array object of the same size, and emits capture segment rows from a per-slot cache.
Each test runs at least six times with inputs at stable addresses and new contents
(the decode-loop pattern), compares every output with onnxruntime, and compares the
recording with a twin session whose per-step caches are dropped before every run (so
it recomputes everything from scratch, as a fresh step does). The last
test drives `KnownAddresses` alone through the id reuse a decode loop meets by chance.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from oracles import ort_session as _ort
from oracles import tensor as _tensor

import workbench
from workbench import Generator, Recording, SessionOptions, models
from workbench.addresses import owned_addresses
from workbench.executor.io_rows import IoRows
from workbench.executor.views import KnownAddresses, address, storage_root
from workbench.tables import IO_BUFFERS_COLUMNS

RUNS = 8
OPSET = [helper.make_opsetid("", 17)]
PROMPT = [3, 7, 11, 5]


def _forget(session):
    """Drop what the executor kept from earlier steps to make the next step's rows cheap."""
    ex = session.executor
    trace = ex.step_trace
    trace.liveness_rows.clear()
    ex.addresses.clear()
    trace.segment_rows.clear()
    trace.memo_summary = None
    trace.io_rows = IoRows()


def _check_io_addresses(session):
    """After every io_buffers emission, read each array's address and size, and its root's,
    afresh and compare: the rows served from `KnownAddresses` or patched from the last
    step's must be where the arrays are (a step's fresh
    output often gets the id of the last step's, freed one)."""
    ex = session.executor
    emit = ex.step_trace.io_buffers
    checked = []

    def emit_and_check(rec, feeds, bound, arrays):
        emit(rec, feeds, bound, arrays)
        arrays = [feeds[v] for v in feeds] + list(bound.values()) + \
            [arrays[v] for v in ex.graph.outputs if v not in bound]
        roots = [storage_root(a) for a in arrays if hasattr(a, "nbytes")]
        want = [(address(a), a.nbytes, address(r), r.nbytes)
                for a, r in zip([a for a in arrays if hasattr(a, "nbytes")], roots)]
        rows = list(rec._generic["io_buffers"].pending[-1][1])  # the last (columns, rows) emitted
        assert [tuple(r[2:6]) for r in rows] == want, f"step {rec.current_step}"
        checked.append(len(want))

    ex.step_trace.io_buffers = emit_and_check
    return checked


def _frames(rec):
    """Every recorded table that must not depend on the per-step caches (timings and
    addresses aside: the twin has its own buffers)."""
    out = {"liveness": rec.liveness(), "views": rec.views(), "buffers": rec.buffer_events(),
           "aliases": rec.aliases(), "materializations": rec.materializations(),
           "memory": rec.memory_summary(), "segments": rec.segments(),
           "declines": rec.capture_declines(),
           "capture_events": rec.capture_events().drop(columns=["duration_s"]),
           "memo": rec.memo_timeline().drop(columns=["resolve_ms"]),
           "nodes": rec.node_timings().drop(columns=["duration_us"]),
           "steps": rec.steps().drop(columns=["wall_ms"]),
           "events": [type(e).__name__ for e in rec.events()]}
    if "io_buffers" in rec.tables:
        out["io_buffers"] = rec.table("io_buffers").drop(columns=["address", "base_address"])
    return out


def _decode_both_as_onnxruntime(data, session, twin, kv="growing"):
    """A greedy decode of RUNS tokens by `session` and by `twin`: the tokens of both and
    the logits of `session` as onnxruntime's. A fixed `kv` cache is one buffer per
    cache for the whole decode (stable addresses, new contents every step)."""
    kw = dict(progress=False, eos_token_id=-1, return_logits=True, kv=kv)
    got = Generator(session).generate(PROMPT, RUNS, **kw)
    other = Generator(twin).generate(PROMPT, RUNS, **kw)
    want = Generator(ort.InferenceSession(data, providers=["CPUExecutionProvider"])).generate(PROMPT, RUNS, **kw)
    assert got.tokens == want.tokens == other.tokens
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"step {step}")


def _assert_same_recording(lean, fresh):
    a, b = _frames(lean.recording), _frames(fresh.recording)
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], list):
            assert a[name] == b[name], name
        else:
            assert a[name].equals(b[name]), name


def _view_model():
    """x -> Reshape (a view, or a copy when x comes column-major) -> Mul by w -> Transpose
    (a view) -> Add; x -> Unsqueeze (a view either way, so x stays pinned) -> Neg.
    Shapes fixed, so the memo replays and capture replays."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "b")
    shape = numpy_helper.from_array(np.array([4, 6], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]),
         helper.make_node("Mul", ["r", "w"], ["m"]),
         helper.make_node("Relu", ["m"], ["h"]),
         helper.make_node("Transpose", ["h"], ["t"], perm=[1, 0]),
         helper.make_node("Add", ["t", "b"], ["y"]),
         helper.make_node("Unsqueeze", ["x", "axes"], ["u"]),
         helper.make_node("Neg", ["u"], ["z"])],
        "lean", [_tensor("x", [2, 12])], [_tensor("y", [6, 4]), _tensor("z", [1, 2, 12])],
        [w, b, shape, numpy_helper.from_array(np.array([0], np.int64), "axes")])
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


@pytest.mark.parametrize("options", [{}, {"capture": False}, {"release_dead_values": True},
                                     {"decode_memo": False}, {"views": False}])
def test_stable_addresses_new_contents_record_what_a_fresh_step_records(options):
    model = _view_model()
    lean = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False, **options))
    fresh = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False, **options))
    oracle = _ort(model)
    _check_io_addresses(lean)
    rng = np.random.default_rng(1)
    x = np.empty((2, 12), np.float32)
    for run in range(RUNS):
        x[...] = rng.standard_normal((2, 12))
        _forget(fresh)
        got = lean.run(None, {"x": x})
        twin = fresh.run(None, {"x": x})
        want = oracle.run(None, {"x": x.copy()})
        for a, b, c in zip(got, want, twin):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"run {run}")
            np.testing.assert_array_equal(a, c)
    chunks = lean.recording._lv_pending  # read before any frame lays them out
    assert len({id(rows) for _, rows, _ in chunks}) < len(chunks), "unchanged steps share their rows"
    _assert_same_recording(lean, fresh)
    if not options:
        assert (lean.recording.capture_events().event == "replay").any(), "replays must happen"


def test_an_input_that_turns_strided_changes_owners_and_the_rows_follow():
    """The Reshape of a column-major x has to copy: its value becomes an owner with bytes.
    Alternating contiguous and column-major x (each at a stable address) flips owners
    between steps; every step's rows must be those of a fresh computation."""
    model = _view_model()
    lean = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    fresh = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(2)
    contiguous = np.empty((2, 12), np.float32)
    transposed = np.empty((12, 2), np.float32)
    planned = None
    for run in range(RUNS + 2):
        x = contiguous if run % 3 else transposed.T  # (2, 12) column-major: Reshape must copy
        x[...] = rng.standard_normal((2, 12))
        _forget(fresh)
        got = lean.run(None, {"x": x})
        owners = lean.executor.state.storage.owner
        if planned is not None and owners is planned[0]:  # liveness trusts the plan's dict unwritten
            assert owners == planned[1], f"run {run}: a step wrote into the storage plan's owners"
        planned = (owners, dict(owners))
        fresh.run(None, {"x": x})
        want = oracle.run(None, {"x": np.ascontiguousarray(x)})
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"run {run}")
    _assert_same_recording(lean, fresh)
    lv = lean.recording.liveness()
    r = lv[lv.value == "r"]
    assert set(r.storage) == {"view", "owner"}, "the copy must show as an owner, the view as a view"
    assert (r[r.storage == "owner"].bytes == 2 * 12 * 4).all() and (r[r.storage == "view"].bytes == 0).all()
    pinned = {step: frozenset(g.value[g.pinned & (g.value == g.owner)]) for step, g in lv.groupby("step")}
    storage = dict(zip(r.step, r.storage))
    assert any(pinned[s] == pinned[s + 1] and storage[s] != storage[s + 1] for s in range(len(storage) - 1)), \
        "some step must differ from the last only by its owners (x pinned by u either way)"


def test_io_buffers_addresses_are_where_each_array_is_now():
    """A caller that feeds the same array (new contents), then a fresh array each run
    (old ones freed: an id may come back for a different array), then a view of a
    bigger buffer: each row's address is that array's address at that step."""
    model = _view_model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    oracle = _ort(model)
    rng = np.random.default_rng(3)
    stable = np.empty((2, 12), np.float32)
    big = np.zeros((4, 12), np.float32)
    expected = []
    x_id = session.graph.inputs[0]
    for run in range(3 * RUNS):
        if run < RUNS:
            x = stable
        elif run < 2 * RUNS:
            x = np.empty((2, 12), np.float32)  # the last run's array is freed before this one exists
        else:
            x = big[run % 3:run % 3 + 2]
        x[...] = rng.standard_normal((2, 12))
        got = session.run(None, {"x": x})
        expected.append((address(x), x.nbytes, address(storage_root(x)), storage_root(x).nbytes))
        want = oracle.run(None, {"x": x.copy()})
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"run {run}")
        del x
    io = session.recording.table("io_buffers")
    feeds = io[(io.value_id == x_id) & (io.role == "feed")]
    recorded = list(zip(feeds.address, feeds.nbytes, feeds.base_address, feeds.base_nbytes))
    assert recorded == expected
    assert feeds.base_address.iloc[2 * RUNS:].nunique() == 1 and feeds.base_nbytes.iloc[-1] == big.nbytes


def test_io_buffers_rows_of_the_very_same_arrays_are_the_last_steps():
    """A fixed-KV decode feeds the very same arrays every step and gets the last step's
    io_buffers block back, read afresh and found equal; a new array gets its own."""
    model = _view_model()
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False))
    checked = _check_io_addresses(session)
    oracle = _ort(model)
    rng = np.random.default_rng(4)
    x = np.empty((2, 12), np.float32)
    for run in range(RUNS + 1):
        if run == RUNS:
            x = np.empty((2, 12), np.float32)
        x[...] = rng.standard_normal((2, 12))
        got = session.run(None, {"x": x})
        for a, b in zip(got, oracle.run(None, {"x": x.copy()})):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"run {run}")
    assert len(checked) == RUNS + 1
    blocks = session.recording._generic["io_buffers"].pending[1::2]  # (columns, rows) of each step
    rows = [block[1] for block in blocks]
    assert all(r is rows[1] for r in rows[1:RUNS]), "one block of rows for every step of the same arrays"
    assert rows[RUNS] is not rows[RUNS - 1]


@pytest.mark.parametrize("flavor, export", [("onnx", None), ("genai", None), ("onnx", "optimum-merged")])
def test_a_decode_loop_records_what_a_fresh_step_records(flavor, export):
    """A growing KV cache: the variant values' nbytes move every step (the last rows go
    again with an nbytes patch), everything else stays; tokens and logits as onnxruntime's."""
    kw = {"export": export} if export else {}
    data = models.llama("tiny", flavor=flavor, **kw).SerializeToString()
    lean = workbench.InferenceSession(data, SessionOptions(decode_memo_verify=False))
    fresh = workbench.InferenceSession(data, SessionOptions(decode_memo_verify=False))
    fresh_run = fresh.executor.run

    def run_forgetting(*args, **kwargs):
        _forget(fresh)
        return fresh_run(*args, **kwargs)

    fresh.executor.run = run_forgetting
    checked = _check_io_addresses(lean)
    _decode_both_as_onnxruntime(data, lean, fresh)
    assert len(checked) == RUNS and min(checked) > 0
    patched = [patch for _, _, patch in lean.recording._lv_pending if patch is not None]
    assert patched, "growing steps pass their last rows with an nbytes patch"
    if (lean.recording.capture_events().event == "replay").any():  # (optimum's merged graph: no capture)
        watched = lean.executor.step_trace.liveness_rows[lean.executor.state.name]
        assert watched._watching is watched._watch_replay, "replays of the same graphs compare only the rest"
    _assert_same_recording(lean, fresh)
    lv = lean.recording.liveness()
    per_step = lv.groupby("step").bytes.sum()
    assert per_step.nunique() > 1, "a growing cache must show in the liveness bytes"


class _PlacedAtOnce(Recording):
    """Every node row takes its place among the events as it is emitted, as each
    `node` call did before the node log: the reference for the log's interleaving."""

    def node_log(self):
        return _PlacingLog(self)

    def node(self, *row):
        super().node(*row)
        self._place_nodes()

    def node_span(self, *row):
        super().node_span(*row)
        self._place_nodes()


class _PlacingLog:
    """A node log that places each row at once."""

    def __init__(self, rec):
        self.rec = rec

    def extend(self, row):
        self.rec._node_log.extend(row)
        self.rec._place_nodes()
        return self

    __iadd__ = extend


@pytest.mark.parametrize("flavor, kv, options", [
    ("onnx", "growing", {}), ("onnx", "growing", {"capture": False}), ("onnx", "growing", {"views": False}),
    ("genai", "growing", {}), ("genai", "fixed", {}), ("genai", "fixed", {"capture": False})])
def test_node_rows_logged_between_kernels_keep_their_place_in_the_events(flavor, kv, options):
    """A traced decode's eager nodes and replayed segments log their rows (no call into
    the Recording between kernels); every row lands where one call each would have put
    it among the step's buffer, view, alias and table events. Tokens and logits as
    onnxruntime's over 8 steps, on a growing cache and on a fixed one (its buffers bound
    in place: the same addresses every step, new contents)."""
    data = models.llama("tiny", flavor=flavor).SerializeToString()
    logged = workbench.InferenceSession(data, SessionOptions(**options))
    placed = workbench.InferenceSession(data, SessionOptions(**options))
    placed.new_recording().__class__ = _PlacedAtOnce
    _decode_both_as_onnxruntime(data, logged, placed, kv)
    modes = set(logged.recording.node_timings()["mode"])
    assert "eager" in modes and ("replayed" in modes) == options.get("capture", True)
    _assert_same_recording(logged, placed)
    seq = [(e.step, e.plan_index, e.mode) for e in logged.recording.events() if type(e).__name__ == "NodeExecuted"]
    assert seq == [(e.step, e.plan_index, e.mode) for e in placed.recording.events()
                   if type(e).__name__ == "NodeExecuted"]


def test_known_addresses_never_serve_a_dead_array_whose_id_came_back():
    """CPython hands a freed object's id to the next one of its size: a view of another
    buffer created right after must get its own address and root, not the dead one's."""
    from workbench.executor.views import KnownAddresses

    known = KnownAddresses()
    first, second = np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32)
    reused = 0
    for step in range(RUNS):
        known.next_step()
        a = first[step % 2:step % 2 + 2]
        assert known.where(a) == (address(a), a.nbytes, address(first), first.nbytes)
        old = id(a)
        del a
        b = second[1:3]
        reused += id(b) == old
        assert known.where(b) == (address(b), b.nbytes, address(second), second.nbytes)
        del b
    assert reused, "the id must come back at least once for this test to bite"


def test_io_rows_are_read_for_new_arrays_and_skip_positions_without_one():
    """The io_buffers rows of each step: a row per position holding an array (a position
    may hold none, e.g. an output not produced), read afresh where the array is new, the
    very last block where every array is the last step's."""
    layout = ((1, "feed"), (2, "feed"), (3, "output"))
    big = np.zeros(64, np.float32)
    a, b, c = np.ones(4, np.float32), big[8:16], np.zeros((2, 3), np.float64)
    io, addresses = IoRows(), KnownAddresses()
    steps = [(a, None, b), (a, c, b), (a, c, b), (np.ones(2, np.float32), c, None), (a, b, c)]
    last = None
    for k, arrays in enumerate(steps):
        got = io.block(layout, arrays, addresses)
        assert list(got) == _expected_io_rows(layout, arrays), f"step {k}"
        assert len(got) == len(list(got)) and all(len(row) == len(IO_BUFFERS_COLUMNS) for row in got)
        if k == 2:
            assert got is last, "the same arrays again give the last block itself"
        last = got


def _expected_io_rows(layout, arrays):
    return [(vid, role, address(arr), arr.nbytes, address(storage_root(arr)), storage_root(arr).nbytes)
            for (vid, role), arr in zip(layout, arrays) if arr is not None]


def test_io_rows_of_owning_arrays_read_together_match_one_at_a_time():
    """Plain arrays owning their bytes are read in one pass (`owned_addresses`); a
    mix with a view, a subclass or a position without an array one at a time. Both
    give each array's own address and size, and its base's."""
    layout = tuple((k, "feed") for k in range(4))
    pool = np.zeros(64, np.float32)
    io = IoRows()
    owning = [np.zeros(k + 1, np.float32) for k in range(4)]
    mixes = [tuple(owning), (owning[0], pool[3:9], owning[2], owning[3]),
             (owning[0], owning[1], pool.view(np.recarray)[:0].base, None),
             (np.zeros(0, np.float32), owning[1], owning[2], owning[3])]
    for k, arrays in enumerate(mixes * 2):
        got = io.block(layout, arrays, KnownAddresses())
        assert list(got) == _expected_io_rows(layout, arrays), f"mix {k}"
    assert owned_addresses(tuple(owning)) is not None and owned_addresses(mixes[1]) is None


class _LivenessSink:
    """What a Recording keeps of each step's liveness rows: their nbytes, patched."""

    def __init__(self):
        self.steps, self.patches = [], []

    def liveness(self, rows, patch):
        self.patches.append(patch)
        nbytes = [r[3] for r in rows]
        if patch is not None:
            for position, size in zip(*patch):
                nbytes[position] = size
        self.steps.append(dict(zip((r[0] for r in rows), nbytes)))


def test_liveness_compares_only_what_a_replay_of_the_same_graphs_does_not_restore():
    """A step that replays the same captured graphs as the last (the very `replayed`
    set) compares only the other values; a first replay, a replay of other graphs (a new
    set, even one equal to the last) or an eager step compares them all. Every step's
    sizes are the arrays' own, through changes inside and outside the replayed values."""
    from workbench.executor.liveness_rows import LivenessRows
    from workbench.executor.storage import OWNER, StoragePlan

    sp = StoragePlan()
    for vid in range(4):
        sp.storage[vid], sp.owner[vid], sp.first_def[vid], sp.last_use[vid] = OWNER, vid, vid, vid + 1
    rows, sink = LivenessRows(sp, (), frozenset()), _LivenessSink()
    arrays = [np.zeros(n, np.float32) for n in (1, 2, 3, 4)]
    graphs = frozenset({1, 2})  # what the installed graphs restore
    steps = [(None, {}),                      # eager
             (graphs, {1: 5}),                 # first replay: all compared
             (graphs, {3: 6}),                 # the same graphs: 3 compared
             (graphs, {0: 7}),
             (frozenset({1, 2}), {2: 8}),      # recaptured (a new set): all compared again
             (None, {1: 9}),                   # eager
             (graphs, {2: 10}),                # replay after an eager step: all compared
             (graphs, {3: 11}),                # the same graphs again: 0 and 3 compared
             (graphs, {0: 12}),                # ... patching only them (rows rebased on the rest)
             (graphs, {}),
             (graphs, {0: 13, 3: 14}),
             (None, {0: 7, 3: 11}),            # eager, back to the sizes before the patching steps
             (graphs, {}), (graphs, {3: 16}), (graphs, {0: 17}),
             (frozenset({1, 2}), {})]          # recaptured after patching only some
    for replayed, new in steps:
        for vid, n in new.items():
            arrays[vid] = np.zeros(n, np.float32)
        rows.emit(sink, arrays, sp.owner, {}, {}, set(), replayed)
        assert sink.steps[-1] == {vid: a.nbytes for vid, a in enumerate(arrays)}, f"step {len(sink.steps) - 1}"
    assert rows._watching is rows._watch_all, "the last step, a new set of graphs, compared them all"
    sparse = [sink.patches[k] for k in (3, 8, 9, 10, 14)]  # the same graphs replayed a third time on
    assert [len(positions) for positions, _ in sparse] == [2] * 5, "those steps patch only 0 and 3"


def test_a_replay_restores_one_set_while_the_same_graphs_stay_installed():
    """`replay_restores` is the very same set for as long as the same graphs replay, and
    another after a new capture or a retire (liveness tells a replay of the same graphs
    by that identity)."""
    from types import SimpleNamespace

    from workbench.executor.capture import SlotCapture
    from workbench.executor.capture_runner import CaptureRunner

    cap = SlotCapture()
    cap.graphs = {0: SimpleNamespace(outputs={5: None, 6: None}, free=lambda: None),
                  2: SimpleNamespace(outputs={9: None}, free=lambda: None)}
    first = CaptureRunner.replay_restores(cap)
    assert first == {5, 6, 9} and CaptureRunner.replay_restores(cap) is first
    cap.retire()
    assert CaptureRunner.replay_restores(cap) is not first
    cap.graphs, cap.captures = {0: SimpleNamespace(outputs={7: None})}, cap.captures + 1
    again = CaptureRunner.replay_restores(cap)
    assert again == {7} and CaptureRunner.replay_restores(cap) is again


def test_io_rows_patched_from_the_last_step_are_the_rows_read_afresh():
    """Each step hands IoRows new views of the same caches (one row longer), new feeds, a
    kept output, and now and then a cache replaced by another, a view of a view and an
    array owning its bytes where a view was: every block's rows are what reading every
    array afresh gives (address, size, and the root's)."""
    rng = np.random.default_rng(7)
    caches = [np.zeros((1, 2, 32, 8), np.float32) for _ in range(4)]
    kept = np.zeros((1, 1, 16), np.float32)
    rows, known = IoRows(), KnownAddresses()
    layout = tuple((i, "role") for i in range(8))
    for step in range(24):
        length = step % 30 + 1
        if step == 9:
            caches[1] = np.zeros((1, 2, 32, 8), np.float32)  # a cache that moved
        pasts = [c[:, :, :length] for c in caches]
        if step % 5 == 3:
            pasts[2] = pasts[2][:, :1]  # a view of a view
        if step % 7 == 4:
            pasts[3] = np.array(pasts[3])  # owns its bytes this step
        feeds = (np.full((1, 1), step, np.int64), rng.standard_normal((1, length)).astype(np.float32))
        arrays = (*feeds, *pasts, kept, caches[0])
        block = rows.block(layout, arrays, known)
        roots = [storage_root(a) for a in arrays]
        want = [(vid, role, address(a), a.nbytes, address(r), r.nbytes)
                for (vid, role), a, r in zip(layout, arrays, roots)]
        assert list(block) == want, f"step {step}"
