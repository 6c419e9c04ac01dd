"""The simulate command imports what it uses: no torch or transformers at all, matplotlib only
when it draws (``python -X importtime -m kvbench ...``, read from the interpreter itself)."""

import subprocess
import sys

import pytest

TINY_RUN = ("workload=fixed", "workload.num_requests=20", "workload.prompt_tokens=100",
            "workload.output_tokens=20", "allocators=[paged]", "progress=false")  # fmt: skip


def _imported_top_modules(tmp_path, *overrides):
    """Top-level packages ``python -m kvbench OVERRIDES`` imported, from ``-X importtime``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kvbench", *TINY_RUN, *overrides,
         f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize("plots", [False, True])
def test_simulate_imports_no_torch_and_matplotlib_only_to_draw(tmp_path, plots):
    imported = _imported_top_modules(tmp_path, f"plots={str(plots).lower()}")
    assert "kvbench" in imported and "pandas" in imported  # the probe sees imports
    assert not imported & {"torch", "transformers"}
    assert ("matplotlib" in imported) == plots
    assert (tmp_path / "plots" / "usage_breakdown.png").is_file() == plots
