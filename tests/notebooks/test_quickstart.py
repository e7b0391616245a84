"""The quickstart notebook runs top to bottom on the tiny model: every cell, no error."""

from pathlib import Path

import nbclient
import nbformat

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def test_quickstart_runs_every_cell(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()   # raises CellExecutionError naming the failing cell
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    for expected in ("operators", "Frontier(", "budget", "simulated", "largest relative difference",
                     "one training step done"):
        assert expected in text
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 2     # the frontier and the simulated timeline
