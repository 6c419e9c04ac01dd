"""Logit equivalence: a transformers causal LM decoding with its K/V in kvbench's paged block
pool, compared step by step with the stock contiguous cache (method and columns:
``docs/metrics.md``, section ``equivalence.parquet``).

Importing this package imports no torch; the modules below do.
"""
