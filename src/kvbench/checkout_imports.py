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
    """Find ``kernels`` on ``sys.path`` less kvbench checkouts' roots (module doc)."""

    def __init__(self, checkout_roots: set[Path]) -> None:
        self.checkout_roots = checkout_roots

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        """The installed ``kernels`` package's spec; None for any other name, or when only a
        checkout's folder has one."""
        if fullname != SHADOWED_NAME:
            return None
        elsewhere = [entry for entry in sys.path if _resolved(entry) not in self.checkout_roots]
        return importlib.machinery.PathFinder.find_spec(fullname, elsewhere)


def install(package_file: str) -> None:
    """Put the finder first, once, when a kvbench checkout's root (a ``kernels/`` package beside
    ``src/kvbench``) is on ``sys.path`` or holds this kvbench (an editable install): a wheel
    installed elsewhere and run from a checkout's root (the GPU session) is covered too."""
    candidates = {Path(package_file).resolve().parents[2], *map(_resolved, sys.path)}
    roots = {root for root in candidates if _is_checkout(root)}
    if roots and not any(isinstance(finder, InstalledKernelsFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, InstalledKernelsFirst(roots))


def _is_checkout(root: Path) -> bool:
    return (root / SHADOWED_NAME / "__init__.py").is_file() and (root / "src" / "kvbench").is_dir()


def _resolved(entry: str) -> Path:
    return Path(entry or os.curdir).resolve()
