"""notebooks/*.ipynb execute top to bottom on the CPU (nbclient, this venv's Python kernel), without errors."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["01_recipe_tweaking.ipynb", "02_data_pipeline.ipynb"])
def test_notebook_executes(name, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    monkeypatch.setenv("VFM_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name=NATIVE_KERNEL_NAME,
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()  # raises CellExecutionError naming the cell on the first error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {}) or "image/gif" in o.get("data", {})]
    assert images, "the notebook shows its results as pictures"
