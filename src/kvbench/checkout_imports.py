"""Running kvbench from its own checkout: the top-level ``kernels/`` folder must not hide the
Hugging Face ``kernels`` package.

``python -m kvbench ...`` (or any script) run from the repository root puts the root first on
``sys.path``, where ``kernels/`` (the source of ``kvbench.kernels``, a package with an
``__init__.py``) answers ``import kernels``. transformers imports Hugging Face's ``kernels``
package under that name whenever it is installed (it builds every model through it) and vLLM
does too, so both failed there with "cannot import name 'CUDAProperties' from 'kernels'". A
finder put first on ``sys.meta_path`` looks ``kernels`` up on the rest of ``sys.path``, so the
installed package wins; without one, the lookup falls through to the usual finders unchanged.
Nothing is imported until something asks for ``kernels``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

SHADOWED_NAME = "kernels"


class InstalledKernelsFirst(importlib.abc.MetaPathFinder):
    """Find ``kernels`` on ``sys.path`` less the checkout root (module doc)."""

    def __init__(self, checkout_root: Path) -> None:
        self.checkout_root = checkout_root.resolve()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        """The installed ``kernels`` package's spec; None for any other name, or when only the
        checkout's folder has one."""
        if fullname != SHADOWED_NAME:
            return None
        elsewhere = [entry for entry in sys.path
                     if Path(entry or os.curdir).resolve() != self.checkout_root]  # fmt: skip
        return importlib.machinery.PathFinder.find_spec(fullname, elsewhere)


def install(package_file: str) -> None:
    """Put the finder first when kvbench runs from a checkout (``src/kvbench`` beside a
    ``kernels/`` package), once."""
    checkout_root = Path(package_file).resolve().parents[2]
    if not (checkout_root / SHADOWED_NAME / "__init__.py").is_file():
        return  # an installed kvbench: no folder of that name beside it
    if not any(isinstance(finder, InstalledKernelsFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, InstalledKernelsFirst(checkout_root))
