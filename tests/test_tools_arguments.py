"""The tools' command lines refuse a count that cannot work (0 threads, 0 repeats, ...) in one
argparse line before any work: each used to fail in torch or ``statistics`` after it."""

from __future__ import annotations

import importlib
import json

import pytest

BAD_COUNTS = [
    ("equivalence_speed", "--rounds", "0"), ("equivalence_speed", "--threads", "0"),
    ("kernel_gate", "--attempts", "0"), ("kernel_gate", "--rounds", "0"),
    ("kernel_gate", "--slow-paged-path", "0"),
    ("measure_cpu", "--threads", "0"), ("measure_cpu", "--repeats", "0"),
    ("measure_cpu", "--matmul-size", "0"), ("measure_cpu", "--buffer-mib", "-1"),
    ("prefill_pairs", "--tokens", "0"), ("prefill_pairs", "--repeats", "0"),
    ("prefill_pairs", "--threads", "0"),
    ("prefix_hit_sdpa", "--max-keys", "8"),
    ("random_weights", "--rounds", "0"), ("random_weights", "--repeats", "0"),
    ("random_weights", "--threads", "0"),
    ("sdpa_groups", "--repeats", "0"), ("sdpa_groups", "--threads", "0"),
    ("steadiness", "--threads", "0"), ("steadiness", "--python-iterations", "0"),
    ("steadiness", "--matmuls", "0"),
]  # fmt: skip


@pytest.mark.parametrize(("tool", "option", "value"), BAD_COUNTS,
                         ids=[f"{tool}{option}={value}" for tool, option, value in BAD_COUNTS])
def test_a_count_too_small_is_refused_before_any_work(tool, option, value, capsys):
    main = importlib.import_module(f"kvbench.tools.{tool}").main
    with pytest.raises(SystemExit) as refused:
        main([option, value])
    assert refused.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {option}: {value} is too small; expected >= " in line


def test_measure_cpu_checks_its_name_and_folder_before_measuring(tmp_path, capsys):
    from kvbench.tools.measure_cpu import main

    with pytest.raises(SystemExit):
        main(["--name", "../../x", "--output-dir", str(tmp_path)])
    assert "--name '../../x': expected a plain entry name" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit):
        main(["--output-dir", str(tmp_path / "a-file")])
    assert f"--output-dir {tmp_path / 'a-file'}: Not a directory" in capsys.readouterr().err


def test_equivalence_speed_checks_the_block_size_before_timing(capsys):
    from kvbench.tools.equivalence_speed import main

    with pytest.raises(SystemExit):
        main(["--block-size", "3"])
    assert "--block-size 3: must be a power of two" in capsys.readouterr().err


@pytest.mark.parametrize("baseline", ["missing", "not json", "no shape"])
def test_kernel_gate_tells_an_unusable_baseline_from_a_failed_gate(tmp_path, capsys, baseline):
    from kvbench.tools.kernel_gate import main

    path = tmp_path / "baseline.json"
    if baseline != "missing":
        path.write_text("{" if baseline == "not json" else json.dumps({}))
    assert main(["--baseline", str(path)]) == 2  # the gate's FAIL is 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kvbench.tools.kernel_gate: {path}: not a usable baseline (")
    assert line.endswith("write one with python -m kvbench.tools.kernel_gate --write-baseline")


def test_async_gap_names_a_traces_folder_without_the_traces(tmp_path, capsys):
    from kvbench.tools.async_gap import main

    with pytest.raises(SystemExit) as refused:
        main(["--traces", str(tmp_path)])
    assert refused.value.code == 2
    assert f"--traces {tmp_path}: no sharegpt/" in capsys.readouterr().err
