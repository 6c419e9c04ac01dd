"""The prompts the harness decodes: real instructions, as token ids.

The first Alpaca instructions of ``../shared/traces/alpaca/alpaca_5000.json`` when the project's
shared traces are present, else a few instructions written here. SmolLM2's prompts go through its
chat template, whose system prompt is a real shared prefix (24 tokens) for ``paged_prefix``; the
tiny random models get seeded random ids with a shared random prefix instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# src/kvbench/tasks/equivalence/prompts.py -> the repository's parent holds shared/.
SHARED_DIR = Path(__file__).resolve().parents[5] / "shared"
ALPACA_JSON = SHARED_DIR / "traces" / "alpaca" / "alpaca_5000.json"
BUILTIN_INSTRUCTIONS = (
    "Give three tips for staying healthy.",
    "Explain why the sky is blue in two sentences.",
    "Write a haiku about a cache that never forgets.",
    "List the planets of the solar system in order from the sun.",
    "Translate 'good morning, how are you?' into French.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "What is the difference between a list and a tuple in Python?",
    "Suggest a name for a bakery that sells only bread made with rye.",
)
TINY_PREFIX_TOKENS = 21  # shared random prefix of the tiny models' prompts (not block-aligned)


def instructions(num_prompts: int) -> list[str]:
    """``num_prompts`` instructions (Alpaca's first ones when present, input appended)."""
    if ALPACA_JSON.is_file():
        records = json.loads(ALPACA_JSON.read_text())[:num_prompts]
        texts = [_alpaca_text(record) for record in records]
    else:
        texts = list(BUILTIN_INSTRUCTIONS[:num_prompts])
    if len(texts) < num_prompts:
        raise ValueError(f"num_prompts={num_prompts}: only {len(texts)} prompts are available")
    return texts


def _alpaca_text(record: dict[str, str]) -> str:
    extra = record.get("input", "")
    return f"{record['instruction']}\n\n{extra}" if extra else record["instruction"]


def chat_prompt_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text as a user turn of the chat template, ready for the answer."""
    prompts = []
    for text in texts:
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        prompts.append([int(token) for token in ids])
    return prompts


def random_prompt_ids(
    num_prompts: int, vocab_size: int, seed: int, prefix_tokens: int = TINY_PREFIX_TOKENS
) -> list[list[int]]:
    """Seeded random prompts of varied lengths that share their first ``prefix_tokens`` ids."""
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab_size, (prefix_tokens,), generator=generator)  # [prefix]
    prompts = []
    for index in range(num_prompts):
        suffix_len = 3 + (7 * index) % 29  # 3..31 tokens: ends land anywhere in a block
        suffix = torch.randint(0, vocab_size, (suffix_len,), generator=generator)  # [suffix]
        prompts.append(torch.cat([prefix, suffix]).tolist())
    return prompts
