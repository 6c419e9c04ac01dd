"""experiment=paper_executed: the paper's comparison served on a real model beside its
simulations. The table's arithmetic on runs whose figures are known; the interleaved real runs
and the simulations on a tiny random Llama under a binding pool (seconds); the config's checks."""

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest
from conftest import compose_config, forbid_model_load

from kvbench.config import ConfigError
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine.scheduler import SchedulerLimits
from kvbench.tasks.paper_executed.run import ServingSetup, serve_rounds, simulate_sources
from kvbench.tasks.paper_executed.table import FIGURES, PROBE_COLUMNS, markdown_rows, paper_table

MAX_MODEL_LEN = 64


def _run(source, allocator, round_index, throughput, batch=1.0):
    figures = dict.fromkeys(FIGURES, 1.0)
    figures.update(output_token_throughput=throughput, mean_batch_size=batch)
    return {"request_rate": 8.0, "source": source, "allocator": allocator, "round": round_index,
            **figures}  # fmt: skip


def test_table_takes_medians_over_rounds_and_ratios_within_a_source():
    runs = pd.DataFrame([
        _run("measured", "naive_max", 0, 10.0), _run("measured", "naive_max", 1, 30.0),
        _run("measured", "naive_max", 2, 20.0), _run("measured", "naive_oracle", 0, 40.0),
        _run("measured", "paged", 0, 50.0, batch=9.0), _run("measured", "paged", 1, 70.0),
        _run("profiled", "naive_max", 0, 25.0), _run("profiled", "paged", 0, 100.0),
    ])  # fmt: skip
    table = paper_table(runs).set_index(["source", "allocator"])
    measured_max = table.loc[("measured", "naive_max")]
    assert measured_max["output_token_throughput"] == 20.0  # median of 10, 30, 20
    assert measured_max["num_runs"] == 3
    assert measured_max["output_token_throughput_spread_pct"] == pytest.approx(100.0)  # 20 / 20
    paged = table.loc[("measured", "paged")]
    assert paged["mean_batch_size"] == pytest.approx(5.0)  # median of 9 and 1
    assert paged["paged_over_naive_max"] == pytest.approx(60.0 / 20.0)
    assert paged["paged_over_naive_oracle"] == pytest.approx(60.0 / 40.0)
    # The profiled source's ratio uses its own rows; it ran no naive_oracle: NaN, not the other's.
    profiled = table.loc[("profiled", "paged")]
    assert profiled["paged_over_naive_max"] == pytest.approx(4.0)
    assert math.isnan(profiled["paged_over_naive_oracle"])
    # Each simulated figure over the real run's of the same allocator: 25 / 20, 100 / 60.
    assert table.loc[("profiled", "naive_max"), "throughput_over_measured"] == pytest.approx(1.25)
    assert profiled["throughput_over_measured"] == pytest.approx(100.0 / 60.0)
    assert paged["throughput_over_measured"] == 1.0
    assert "| 8.000 | measured | paged | 2 | 60.000 |" in markdown_rows(paper_table(runs))
    assert not set(PROBE_COLUMNS) & set(paper_table(runs).columns)  # no probes, no columns


def test_table_takes_the_probes_medians_for_measured_rows_only():
    runs = pd.DataFrame([
        {**_run("measured", "paged", 0, 50.0), PROBE_COLUMNS[0]: 1.0, PROBE_COLUMNS[1]: 1.2},
        {**_run("measured", "paged", 1, 70.0), PROBE_COLUMNS[0]: 1.2, PROBE_COLUMNS[1]: 1.4},
        _run("profiled", "paged", 0, 100.0),
    ])  # fmt: skip
    table = paper_table(runs).set_index(["source", "allocator"])
    assert table.loc[("measured", "paged"), PROBE_COLUMNS[0]] == pytest.approx(1.1)
    assert table.loc[("measured", "paged"), PROBE_COLUMNS[1]] == pytest.approx(1.3)
    assert math.isnan(table.loc[("profiled", "paged"), PROBE_COLUMNS[0]])
    rows = markdown_rows(paper_table(runs)).splitlines()
    assert rows[2].endswith("| 1.10 / 1.30 |") and rows[3].endswith("|  |")


@pytest.fixture(scope="module")
def tiny_setup():
    deployment = get_deployment("smollm2-135m", "cpu")
    # 4 x 64 slots: naive_max holds 4 requests at once, paged (requests of <= 20 tokens) all 10.
    return ServingSetup(limits=SchedulerLimits(max_model_len=MAX_MODEL_LEN), num_slots=256,
                        block_size=8, max_model_len=MAX_MODEL_LEN, deployment=deployment,
                        decode_backend="sdpa")


def _requests():
    shapes = [(12, 5), (7, 4), (10, 6), (8, 5), (14, 3), (9, 5), (6, 4), (11, 3), (13, 5),
              (10, 4)]  # fmt: skip
    return [Request(request_id=i, arrival_s=0.0, prompt_tokens=prompt, output_tokens=output)
            for i, (prompt, output) in enumerate(shapes)]  # fmt: skip


@pytest.fixture
def one_thread():
    """torch on one thread (as executor.num_threads=1): a loaded machine's spinning threads
    otherwise cost this test several times its work; restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_real_rounds_interleave_and_the_budget_binds_naive_max_only(tiny_setup, one_thread,
                                                                     capsys):  # fmt: skip
    from kvbench.tasks.equivalence.models import load_model
    from kvbench.tasks.equivalence.names import TINY_GQA

    allocators = ["naive_max", "naive_oracle", "paged"]
    runs = serve_rounds(load_model(TINY_GQA), _requests(), allocators, 2, tiny_setup)
    # Round 0 runs in the given order, round 1 starts at the second allocator.
    assert list(runs["allocator"]) == [*allocators, "naive_oracle", "paged", "naive_max"]
    assert (runs["num_finished"] == 10).all() and (runs["output_token_throughput"] > 0).all()
    assert (runs["kv_pool_bytes"] > 0).all() and (runs["wall_s"] > 0).all()
    by_allocator = runs.groupby("allocator")[["mean_batch_size", "kv_in_use_gb", "kv_used_gb"]]
    batch = by_allocator.mean()["mean_batch_size"]
    assert batch["naive_max"] <= 4.0 < batch["paged"]  # the pool binds naive_max at 4 requests
    # naive_max's requests hold 64 slots each whatever they store; paged's at most a block more.
    means = by_allocator.mean()
    assert (means["kv_in_use_gb"] >= means["kv_used_gb"]).all()
    assert means.loc["naive_max", "kv_in_use_gb"] > 2 * means.loc["naive_max", "kv_used_gb"]
    assert "round 2/2, naive_max" in capsys.readouterr().out


def test_each_real_run_is_preceded_by_the_probes_priced_by_the_profile(tiny_setup, monkeypatch):
    from kvbench.tasks.equivalence.models import load_model
    from kvbench.tasks.equivalence.names import TINY_GQA
    from kvbench.tasks.paper_executed import run
    from kvbench.tasks.profile import measure

    timed = []

    def time_iteration(model, point, repeats, decode_backend, kv_dtype):
        timed.append(point)
        real_shape, _ = real_time_iteration(model, point, 1, decode_backend, kv_dtype)
        # 0.2 s (4 sequences) or 0.3 s (16), 0.1 s more at each call: a machine slowing down.
        seconds = (0.3 if len(point.decode_contexts) > 4 else 0.2) + 0.1 * ((len(timed) - 1) // 2)
        return real_shape, measure.Timing(seconds, 0.0)

    real_time_iteration = measure.time_iteration
    monkeypatch.setattr(measure, "time_iteration", time_iteration)
    setup = dataclasses.replace(tiny_setup, probe_cost_model=_fixed_cost(0.1)("paged", 16))
    runs = serve_rounds(load_model(TINY_GQA), _requests(), ["naive_max", "paged"], 1, setup)
    # Both probes before the first run and after each (one run's after is the next's before).
    assert timed == [*run.PROBES.values()] * 3
    # Each probe's measured time over the profile's price of its shape (0.1 s whatever it is),
    # the mean of the two around its run.
    assert list(runs[PROBE_COLUMNS[0]]) == pytest.approx([2.5, 3.5])
    assert list(runs[PROBE_COLUMNS[1]]) == pytest.approx([3.5, 4.5])


def test_fp8_k_v_are_served_and_probed_in_fp8_pools(tiny_setup, one_thread, kv_memories):
    import torch

    from kvbench.executors.forward import model_kv_shape
    from kvbench.tasks.equivalence.models import load_model
    from kvbench.tasks.equivalence.names import TINY_GQA

    deployment = tiny_setup.deployment
    fp8 = dataclasses.replace(deployment, model=dataclasses.replace(deployment.model,
                                                                    kv_dtype="fp8"))
    setup = dataclasses.replace(tiny_setup, deployment=fp8,
                                probe_cost_model=_fixed_cost(0.1)("paged", 16))  # fmt: skip
    model = load_model(TINY_GQA)
    runs = serve_rounds(model, _requests(), ["paged"], 1, setup)
    assert runs["num_finished"].tolist() == [10]
    # The probes before and after the run, and the run, each on pools of one byte an element.
    assert [memory.keys[0].dtype for memory in kv_memories] == [torch.float8_e4m3fn] * 5
    num_layers, num_kv_heads, head_dim = model_kv_shape(model)
    assert runs["kv_pool_bytes"].tolist() == [256 * 2 * num_layers * num_kv_heads * head_dim]


def test_a_run_of_fp8_k_v_refuses_a_profile_of_fp32_k_v_before_the_model_loads(tmp_path,
                                                                                monkeypatch):
    from kvbench.tasks.paper_executed import run

    cfg, deployment, raw = compose_config("experiment=paper_executed", "model.kv_dtype=fp8")

    forbid_model_load(monkeypatch, run)
    with pytest.raises(ValueError, match=r"profile stored K/V in fp32, this run in fp8; set "
                                         r"model\.kv_dtype=null or profile it"):  # fmt: skip
        run.run_paper_executed(cfg, deployment, raw, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def _fixed_cost(seconds):
    from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, ProfiledCostModel

    coefficients = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 0.0)
    return lambda name, block_size: ProfiledCostModel({**coefficients, "fixed_s": seconds},
                                                      block_size)  # fmt: skip


def test_simulated_sources_price_the_same_requests(tiny_setup):
    runs = simulate_sources(_requests(), ["naive_max", "paged"],
                            {"slow": _fixed_cost(0.5), "fast": _fixed_cost(0.05)}, tiny_setup)
    table = paper_table(runs.assign(request_rate=8.0)).set_index(["source", "allocator"])
    # The same schedule whatever prices it (every iteration costs the same): batches equal,
    # throughput 10x at a tenth of the price, and paged's ratio the same in both.
    assert table.loc[("slow", "paged"), "mean_batch_size"] == pytest.approx(
        table.loc[("fast", "paged"), "mean_batch_size"])
    assert table.loc[("fast", "paged"), "output_token_throughput"] == pytest.approx(
        10 * table.loc[("slow", "paged"), "output_token_throughput"])
    ratio = table.loc[("slow", "paged"), "paged_over_naive_max"]
    assert ratio > 1.5 and ratio == pytest.approx(table.loc[("fast", "paged"),
                                                            "paged_over_naive_max"])


def test_paper_executed_needs_a_profile():
    cfg, _, _ = compose_config("experiment=paper_executed")
    assert cfg.task == "paper_executed" and cfg.executor.profile
    with pytest.raises(ConfigError, match=r"executor\.profile=FILE"):
        compose_config("experiment=paper_executed", "executor.profile=null")
    with pytest.raises(ConfigError, match=r"paper_executed\.rounds=0"):
        compose_config("experiment=paper_executed", "paper_executed.rounds=0")


def test_paper_executed_serves_one_workload_at_the_rates_given_for_it():
    from omegaconf import OmegaConf, open_dict

    from kvbench.config import run_rates, validate_config

    cfg, _, raw = compose_config("experiment=paper_executed")
    workload = cfg.workload
    assert run_rates(cfg, workload.name, workload) == [8.0]  # request_rates
    cfg, _, _ = compose_config("experiment=paper_executed",
                               f"+workload_request_rates.{workload.name}=[2,4]")  # fmt: skip
    assert run_rates(cfg, workload.name, workload) == [2.0, 4.0]
    cfg, _, _ = compose_config("experiment=paper_executed", "request_rates=[]",
                               "workload.request_rate=3")  # fmt: skip
    assert run_rates(cfg, workload.name, cfg.workload) == [3.0]  # the workload's own
    untimed = dataclasses.replace(cfg.workload, request_rate=None)
    assert run_rates(cfg, workload.name, untimed) == [0.0]  # the trace's own times
    two = OmegaConf.create(OmegaConf.to_container(raw))
    with open_dict(two):
        two.workloads = {"first": OmegaConf.to_container(raw.workload),
                         "second": OmegaConf.to_container(raw.workload)}  # fmt: skip
    with pytest.raises(ConfigError, match="serves one workload, this run has first, second"):
        validate_config(two)


@pytest.mark.parametrize("run", ["amd-epyc-2026-12-03", "intel-xeon-2026-12-04",
                                 "amd-epyc-2026-12-07"])  # fmt: skip
def test_the_figures_the_docs_quote_are_the_committed_run_s(run):
    root = Path(__file__).resolve().parents[1]
    table = pd.read_parquet(root / "results/reference/paper_executed" / run
                            / "paper_executed.parquet").set_index(["source", "allocator"])
    measured = "measured " + " / ".join(
        f"{table.loc[('measured', name), 'output_token_throughput']:.1f}"
        for name in ("naive_max", "naive_oracle", "paged"))  # fmt: skip
    paged, profiled = table.loc[("measured", "paged")], table.loc[("profiled", "paged")]
    docs = " ".join((root / "docs" / "paper_executed.md").read_text().split())
    assert measured + " tokens/s" in docs
    assert (f"paged {paged.paged_over_naive_max:.2f}x `naive_max` and "
            f"{paged.paged_over_naive_oracle:.2f}x `naive_oracle` (profiled: "
            f"{profiled.paged_over_naive_max:.2f}x and {profiled.paged_over_naive_oracle:.2f}x)"
            in docs)  # fmt: skip


def test_chart_draws_each_source_and_the_papers_range(tmp_path, monkeypatch):
    from chart_layout import foreign_colors, layout_problems

    from kvbench.plots import paper_executed_chart as chart

    runs = pd.DataFrame([
        _run(source, allocator, 0, throughput * scale)
        for source, scale in (("measured", 1.0), ("profiled", 1.2), ("roofline", 3.0))
        for allocator, throughput in (("naive_max", 10.0), ("naive_oracle", 20.0), ("paged", 30.0))
    ])  # fmt: skip
    table = paper_table(runs).assign(workload="sharegpt")
    drawn = {}
    save = chart.save_figure

    def capture(fig, out_dir, name):
        drawn["problems"] = layout_problems(fig) + foreign_colors(fig)
        drawn["labels"] = [text.get_text() for ax in fig.axes for text in ax.texts]
        save(fig, out_dir, name)

    monkeypatch.setattr(chart, "save_figure", capture)
    chart.paper_executed_chart(table, tmp_path)
    assert (tmp_path / "paper_executed.png").stat().st_size > 0
    assert drawn["problems"] == []
    # Both ratios of each of the three sources, written on their bars (3.00x and 1.50x each).
    assert sorted(drawn["labels"]) == ["1.50x"] * 3 + ["3.00x"] * 3


def test_a_profile_of_another_device_threads_or_backend_is_named_before_tokens_per_s_compare(
    tmp_path, capsys
):
    import torch

    from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS
    from kvbench.tasks.paper_executed.run import _warn_of_another_setup
    from kvbench.tasks.profile.profile_file import device_name, write_profile

    coefficients = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 0.0)
    deployment = get_deployment("smollm2-135m", "cpu")
    threads = torch.get_num_threads()
    cases = [((threads, "sdpa"), None),
             ((threads + 3, "sdpa"), f"num_threads {threads + 3} (here {threads})"),
             ((threads, "torch"), "decode_backend torch (here sdpa)")]  # fmt: skip
    for index, ((profile_threads, backend), warning) in enumerate(cases):
        path = tmp_path / f"profile_{index}.json"
        write_profile(path, {"model": "smollm2-135m", "num_threads": profile_threads,
                             "decode_backend": backend, "device": device_name(),
                             "coefficients": coefficients})  # fmt: skip
        _warn_of_another_setup(str(path), deployment, "sdpa", "aten")
        printed = capsys.readouterr().out
        if warning is None:
            assert printed == ""
        else:
            assert "warning" in printed and f"fitted on {warning}" in printed
    path = tmp_path / "profile_elsewhere.json"
    write_profile(path, {"model": "smollm2-135m", "num_threads": threads, "decode_backend": "sdpa",
                         "device": "another CPU", "coefficients": coefficients})  # fmt: skip
    _warn_of_another_setup(str(path), deployment, "sdpa", "aten")
    assert f"fitted on device another CPU (here {device_name()})" in capsys.readouterr().out
    write_profile(path, {"model": "smollm2-135m", "num_threads": threads, "decode_backend": "sdpa",
                         "device": device_name(), "linear_backend": "onednn",
                         "coefficients": coefficients})  # fmt: skip
    _warn_of_another_setup(str(path), deployment, "sdpa", "aten")
    assert "fitted on linear_backend onednn (here aten)" in capsys.readouterr().out
