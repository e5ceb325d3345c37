"""Every notebook runs top to bottom under nbclient, and is committed without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    # every widget a notebook shows came back as a widget view, not a bare repr
    shown = [o for o in outputs if o.output_type in ("execute_result", "display_data")]
    assert shown, "a notebook shows something"
    widgets = [o for o in shown if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widgets, f"{path.name} shows no widget"
