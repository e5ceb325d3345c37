"""The `io_buffers` frame: where each step's feeds, bound outputs and graph outputs
live, with the buffer underneath — so a KV cache that never moves can be seen not to."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from builtin_models import BUILT_IN, PROMPT

import workbench
from workbench import Generator, reports


def test_a_fixed_kv_cache_keeps_its_buffer_and_decodes_token_exact():
    data = BUILT_IN["llama-genai"]().SerializeToString()
    session = workbench.InferenceSession(data)
    got = Generator(session).generate(PROMPT, 12, progress=False, eos_token_id=-1, kv="fixed")
    want = Generator(ort.InferenceSession(data, providers=["CPUExecutionProvider"])).generate(
        PROMPT, 12, progress=False, eos_token_id=-1, kv="fixed")
    assert got.tokens == want.tokens
    io = session.recording.table("io_buffers")
    names = {v.id: v.name for v in session.graph.values}
    past = io[io.value_id.map(names).str.startswith("past_key_values.0.key") & (io.role == "feed")]
    assert len(past) == 12
    assert past.base_address.nunique() == 1, "the cache buffer never moves"
    assert (past.base_nbytes >= past.nbytes).all()
    growth = reports.kv_growth(session.recording)
    assert growth[growth.io == "past"].capacity.nunique() == 1


def test_every_feed_and_output_is_listed_each_step():
    session = workbench.InferenceSession(BUILT_IN["gpt2"]().SerializeToString())
    Generator(session).generate(PROMPT, 4, progress=False, eos_token_id=-1)
    io = session.recording.table("io_buffers")
    per_step = io.groupby("step").size()
    expected = len(session.graph.inputs) + len(session.graph.outputs)
    assert (per_step == expected).all()
    assert set(io.role) == {"feed", "output"}
    assert (io.address > 0).all() and np.all(io.base_nbytes >= io.nbytes)


def test_the_same_arrays_again_give_the_same_rows_and_new_ones_are_read():
    """IOBinding with the very same arrays step after step: the rows are those of the
    first step (held, not re-read); a feed rebound to another array is read anew."""
    session = workbench.InferenceSession(BUILT_IN["gpt2"]().SerializeToString())
    feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape],
                              np.int64 if "int64" in i.type else np.float32) for i in session.get_inputs()}
    past = [n for n in feeds if n.startswith("past")]
    for n in past:  # an empty past: the step's own key and value only
        shape = list(feeds[n].shape)
        shape[-2] = 0
        feeds[n] = np.zeros(shape, np.float32)
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_input(name, array)
    for output in session.get_outputs():
        binding.bind_output(output.name)
    for _ in range(3):
        session.run_with_iobinding(binding)
    other = feeds["input_ids"].copy()
    binding.bind_input("input_ids", other)
    session.run_with_iobinding(binding)
    io = session.recording.table("io_buffers")
    names = {v.id: v.name for v in session.graph.values}
    ids = io[io.value_id.map(names) == "input_ids"]
    assert len(ids) == 4
    assert ids.address.iloc[:3].nunique() == 1
    assert ids.address.iloc[3] != ids.address.iloc[0], "the rebound feed is read anew"
    from workbench.addresses import address
    assert ids.address.iloc[3] == address(other)


def test_a_few_new_arrays_are_read_alone_and_give_a_full_reads_rows():
    """Where only a few arrays are new objects (a fixed cache's feeds), their numbers are
    read and the rest kept from the last step: the block equals one read in full, for
    owning arrays, views of a wider buffer and a view swapped for another view."""
    from workbench.executor.io_rows import IoRows
    from workbench.executor.views import KnownAddresses

    wide = np.zeros((1, 2, 64, 16), np.float32)
    arrays = [np.zeros((1, 1), np.int64), np.zeros((1, 7), np.int64), wide[:, :, :9], wide[:, :1],
              np.zeros((1, 2, 9, 16), np.float32), np.zeros((3, 5), np.float32)]
    layout = tuple((i, "feed") for i in range(len(arrays)))
    patched, addresses = IoRows(), KnownAddresses()
    for step in range(8):
        arrays[0] = np.full((1, 1), step, np.int64)  # a new feed every step
        if step % 3 == 2:
            arrays[2] = wide[:, :, :9 + step]  # another view of the same buffer
        if step == 5:
            arrays[4] = np.zeros((1, 2, 9, 16), np.float32)
        got = patched.block(layout, tuple(arrays), addresses)
        want = IoRows().block(layout, tuple(arrays), KnownAddresses())
        assert list(got) == list(want), f"step {step}"
    held = list(got)
    assert patched.block(layout, tuple(arrays), addresses) is got, "the very same arrays: the same block"
    assert list(got) == held


def test_a_view_grown_in_place_shares_the_last_blocks_base_columns():
    """An attention mask's prefix of one row of ones, one longer each step: only its own
    address and size are read; the base columns are the last block's very arrays, never
    written (a block's columns stay as made), and the rows equal a read in full."""
    from workbench.executor.io_rows import IoRows
    from workbench.executor.views import KnownAddresses

    ones, ids = np.ones((1, 64), np.int64), np.zeros((1, 1), np.int64)
    rows, layout = IoRows(), ((0, "feed"), (1, "feed"))
    blocks = []
    for length in range(5, 12):
        arrays = (ids, ones[:, :length])
        block = rows.block(layout, arrays, KnownAddresses())
        assert list(block) == list(IoRows().block(layout, arrays, KnownAddresses())), length
        blocks.append((block, [list(c) for c in block.columns]))
    for (before, columns), (after, _) in zip(blocks, blocks[1:]):
        assert after.columns[2] is before.columns[2] and after.columns[3] is before.columns[3]
        assert [list(c) for c in before.columns] == columns, "an earlier block was written into"
