"""Every notebook runs top to bottom under nbclient, and is committed without outputs."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


def test_the_five_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == ["01_tour.ipynb", "02_capture_declines.ipynb",
                                           "03_memo_and_views.ipynb", "04_bring_your_own_model.ipynb",
                                           "05_debugging_a_decode.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear the outputs"


_EXECUTED: dict[str, nbformat.NotebookNode] = {}


def executed(name: str) -> nbformat.NotebookNode:
    """The notebook run top to bottom (once per test session)."""
    if name not in _EXECUTED:
        path = next(p for p in NOTEBOOKS if p.name.startswith(name))
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=180, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()  # raises CellExecutionError on the first failing cell
        _EXECUTED[name] = nb
    return _EXECUTED[name]


def cell_output(nb, needle: str) -> str:
    """Every text / html output of the code cell whose source contains `needle`."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and needle in c.source)
    parts = []
    for o in cell.outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif "data" in o:
            parts.append(o["data"].get("text/html", "") + o["data"].get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, tmp_path):
    nb = executed(path.name[:2])
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    # every widget a notebook shows came back as a widget view, not a bare repr
    shown = [o for o in outputs if o.output_type in ("execute_result", "display_data")]
    assert shown, "a notebook shows something"
    widgets = [o for o in shown if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widgets, f"{path.name} shows no widget"


def test_notebook_02_shows_the_growing_symbol_and_full_decline_detail():
    out = cell_output(executed("02"), "growing = declines")
    assert "grows_with" in out and "total_sequence_length" in out
    # the detail is not cut before the growing dimension
    assert "has shape ['batch_size', 'total_sequence_length']" in out.replace("&#x27;", "'")
    assert "<table" in out and "..." not in out.split("<table", 1)[1]


def test_notebook_02_comparison_says_what_it_counts():
    out = cell_output(executed("02"), "comparison =")
    assert "capture declines at the last step" in out and "plan nodes" in out
    assert "onnx ops" not in out


def test_notebook_04_lists_the_last_steps_views_replayed_or_not():
    """phi3-tiny's ten Splits are zero-copy views at every step, so the last step (a
    captured replay) lists them too, as a table, not an empty one."""
    out = cell_output(executed("04"), "zero-copy views, ")
    assert "10 zero-copy views, 0 in-place writes" in out
    assert "<table" in out and "Empty DataFrame" not in out
    assert "none: no node produced a view" not in out


def test_notebook_03_draws_the_2x3_transpose_with_the_widgets_figure():
    nb = executed("03")
    cell = next(c for c in nb.cells if c.cell_type == "code" and "reports.walk_of(" in c.source)
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in cell.outputs)
    assert "reads source elements in order: [0, 3, 1, 4, 2, 5]" in cell_output(nb, "reports.walk_of(")


def test_notebook_05_says_what_int4_weighs_in_the_file_and_resident():
    """Its text said the int4 model holds a third of the weight bytes while the cell above
    showed equal resident bytes (the blocks are dequantized at load): both are now computed."""
    nb = executed("05")
    out = cell_output(nb, "file_weight_bytes(")
    file_ratio = float(re.search(r"int4 [\d,]+ B \(([\d.]+)x\)", out).group(1))
    resident_ratio = float(re.search(r"resident while decoding: .* \(([\d.]+)x\)", out).group(1))
    assert 0.25 < file_ratio < 0.45 and resident_ratio == 1.0
    text = next(c.source for c in nb.cells if c.cell_type == "markdown" and "MatMulNBits" in c.source)
    assert "third" in text and "dequantizes" in text and "same size" in text
