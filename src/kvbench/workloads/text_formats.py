"""Convert raw-text datasets (Alpaca, ShareGPT) to token counts with a real tokenizer."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from kvbench.workloads.errors import TraceError
from kvbench.workloads.frames import trace_frame
from kvbench.workloads.locations import RowLocator
from kvbench.workloads.schemas import ALPACA, SHAREGPT
from kvbench.workloads.tokenizer import OFFLINE_TOKENIZER_NAME, count_tokens, load_tokenizer
from kvbench.workloads.values import require_columns

# ShareGPT dumps name the user "human" (sometimes "user") and the model "gpt" (or the service).
_USER_ROLES = frozenset({"human", "user"})
_ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "assistant", "bard", "bing"})


def _texts(raw: pd.DataFrame, column: str, locator: RowLocator) -> list[str]:
    texts = raw[column].tolist()
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TraceError(locator.path, locator.row(index),
                             f"{column} is {'missing' if text is None else repr(text)}", "a string")
    return texts


def alpaca_prompts(instructions: Iterable[str], inputs: Iterable[str]) -> list[str]:
    """Alpaca prompts as the vLLM paper counts them: instruction, newline, input (if any)."""
    return [f"{instruction}\n{extra}" if extra else instruction
            for instruction, extra in zip(instructions, inputs, strict=True)]


def from_alpaca(
    raw: pd.DataFrame, locator: RowLocator, tokenizer: str | None, show_progress: bool | None
) -> pd.DataFrame:
    """Alpaca records ``{instruction, input, output}``: prompt = instruction + "\\n" + input (when
    input is not empty), output = the output text; no template, no special tokens."""
    require_columns(raw, ALPACA, locator)
    instructions = _texts(raw, "instruction", locator)
    inputs = _texts(raw, "input", locator) if "input" in raw.columns else [""] * len(raw)
    outputs = _texts(raw, "output", locator)
    return _tokenized_frame(alpaca_prompts(instructions, inputs), outputs,
                            np.arange(len(raw)), tokenizer, show_progress)


def first_exchange(turns: Iterable[dict]) -> tuple[str, str] | None:
    """(prompt, answer): the first user turn and the assistant turn right after it, or None."""
    turn_list = list(turns)
    for position, turn in enumerate(turn_list[:-1]):
        if turn.get("from") in _USER_ROLES:
            answer = turn_list[position + 1]
            if answer.get("from") in _ASSISTANT_ROLES:
                return str(turn.get("value") or ""), str(answer.get("value") or "")
            return None
    return None


def from_sharegpt(
    raw: pd.DataFrame, locator: RowLocator, tokenizer: str | None, show_progress: bool | None
) -> pd.DataFrame:
    """ShareGPT conversations: the first human turn is the prompt, the gpt turn that follows it
    the output (as vLLM's benchmark_serving does). Conversations without such a pair are skipped;
    ``request_id`` keeps the record's position in the file and ``attrs["num_skipped"]`` counts
    the skipped ones."""
    require_columns(raw, SHAREGPT, locator)
    prompts, outputs, record_ids = [], [], []
    for index, turns in enumerate(raw["conversations"]):
        exchange = first_exchange(turns) if turns is not None else None
        if exchange is not None:
            prompts.append(exchange[0])
            outputs.append(exchange[1])
            record_ids.append(index)
    if not record_ids:
        raise TraceError(locator.path, locator.row(0), "no conversation has a human turn followed "
                         "by a gpt turn", "ShareGPT records with conversations [{from, value}]")
    frame = _tokenized_frame(prompts, outputs, np.array(record_ids), tokenizer, show_progress)
    frame.attrs["num_skipped"] = len(raw) - len(record_ids)
    return frame


def _tokenized_frame(
    prompts: list[str], outputs: list[str], record_ids: np.ndarray,
    tokenizer_name: str | None, show_progress: bool | None,
) -> pd.DataFrame:
    tokenizer = load_tokenizer(tokenizer_name)
    frame = trace_frame(
        prompt_tokens=count_tokens(prompts, tokenizer, show_progress),
        output_tokens=count_tokens(outputs, tokenizer, show_progress),
        request_ids=record_ids,
    )
    frame.attrs["tokenizer"] = tokenizer_name or OFFLINE_TOKENIZER_NAME
    return frame
