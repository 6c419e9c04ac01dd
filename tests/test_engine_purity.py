"""The engine is pure: importing it reads no file and pulls in no edge dependency.

The design keeps I/O, config parsing, tables, kernels and plotting at the edges; the engine (and
``core.specs``, which it imports through ``engine.roofline``) must import without them, so that
nothing downstream can sneak a file read or a heavy import into a simulation.
"""

import json
import subprocess
import sys

# Modules the engine must not import: the config reader (a file read, and the old route of the
# deployment defaults into core.specs) and the edges (kernels, tables, plots).
EDGE_MODULES = ("omegaconf", "kvbench.core.packaged_conf", "torch", "matplotlib", "pandas")


def test_importing_the_engine_imports_no_edge_module():
    # A fresh interpreter: this one has already imported everything the other tests use.
    probe = (
        "import json, sys, kvbench.engine; "
        f"print(json.dumps([name for name in {list(EDGE_MODULES)!r} if name in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []
