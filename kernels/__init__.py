"""Attention kernels (Triton, with torch references), imported as ``kvbench.kernels``.

The folder sits at the repository top level but is installed as a sub-package of kvbench: a
top-level module named ``kernels`` would shadow the Hugging Face package of that name, which
transformers probes for.
"""
