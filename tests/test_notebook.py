"""notebooks/explore.ipynb is stored without outputs and runs top to bottom against an embedded grid."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore.ipynb"


def test_notebook_is_saved_without_outputs() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "clear the outputs before saving"


@pytest.fixture
def kernel_on_this_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernel spec that runs this very interpreter (where meteor-spark is installed), whatever else is on PATH."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "meteor-tests"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "meteor-spark tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    return "meteor-tests"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_notebook_runs_top_to_bottom(kernel_on_this_interpreter: str, tmp_path: Path) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name=kernel_on_this_interpreter,
        timeout=300,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError naming the cell when any cell fails

    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    text = ["".join(_texts(cell)) for cell in code_cells]

    assert "embedded grid member at 127.0.0.1:" in text[0]
    assert "published 5,000 records" in text[1]
    for page in ("/checkout", "/search", "/product", "/cart"):  # the batch read's page counts
        assert page in text[2]
    assert "micro-batches so far" in text[3]
    assert "rows in the memory sink:" in text[4] and "confirmed" in text[4]
    assert any("image/png" in output.get("data", {}) for output in code_cells[5].outputs), "the plot is missing"
    assert "stopped" in text[6]


def _texts(cell: nbformat.NotebookNode) -> list[str]:
    texts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            texts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            texts.append(output.get("data", {}).get("text/plain", ""))
            texts.append(output.get("data", {}).get("text/html", ""))
    return texts
