"""docs/examples/quickstart.ipynb runs top to bottom (a real tiny sweep on the bundled model)."""

from __future__ import annotations

import pytest

from tests.support.repo import REPO

NOTEBOOK = REPO / "docs" / "examples" / "quickstart.ipynb"


@pytest.mark.slow
def test_quickstart_notebook_executes(tiny_model, prompts_file, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook's temporary directory lands here
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(REPO / "docs" / "examples")}}
    )
    client.execute()
    outputs = {i: cell.get("outputs", []) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"}
    errors = [o for outs in outputs.values() for o in outs if o.get("output_type") == "error"]
    assert not errors
    texts = "".join(o.get("text", "") for outs in outputs.values() for o in outs)
    assert "sweep " in texts and "report.html" in texts
    tables = [o for outs in outputs.values() for o in outs if "text/html" in o.get("data", {})]
    assert any("tokens_per_s" in o["data"]["text/html"] for o in tables)
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for outs in outputs.values() for o in outs)
