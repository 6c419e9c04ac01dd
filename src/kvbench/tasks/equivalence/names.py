"""The equivalence harness's vocabulary, importable without torch (config validation uses it)."""

from __future__ import annotations

SMOLLM2 = "smollm2-135m"
TINY_GQA = "tiny-llama-gqa"
TINY_MHA = "tiny-llama-mha"
MODEL_NAMES = (SMOLLM2, TINY_GQA, TINY_MHA)
# How a paged run reads K/V in decode steps: "torch" and "sdpa" are paged_decode_attention's
# backends of those names (the tiled online softmax; the fused SDPA over the gathered context, the
# real executor's CPU path); "gather" copies the sequence's blocks back into a contiguous cache
# and runs stock SDPA.
BACKENDS = ("torch", "sdpa", "gather")
ALLOCATORS = ("paged", "paged_prefix")
DTYPES = ("fp32",)
# fp8 K/V scales (equivalence.kv_scales): unit (1.0) or calibrated (vLLM's calculate_kv_scales).
KV_SCALES = ("unit", "calibrated")
# Largest allowed max |paged - stock| / max |stock| of a step's logits in fp32: the kernels'
# own fp32 bound (docs/kernels.md), which the model's layers must not amplify past.
FP32_REL_TOLERANCE = 1e-5
