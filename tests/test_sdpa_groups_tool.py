"""python -m kvbench.tools.sdpa_groups: both plans run the same attention, and the tool prints a
row per case."""

import torch
from kvbench.kernels import decode_torch

from kvbench.tools import sdpa_groups


def test_batch_order_plan_pads_to_its_run_and_length_plan_does_not():
    lens = (40,) * 6 + (320,) + (40,) * 7
    token_bytes = 1536
    old = sdpa_groups.batch_order_groups(lens, token_bytes, 4 << 20, 512 << 10)
    assert old == ((tuple(range(8)), 320), (tuple(range(8, 14)), 40))  # 8 a group at 320
    new = decode_torch.length_groups(lens, token_bytes, 4 << 20, 512 << 10)
    padded = {plan: sum(len(group) * length for group, length in plan) for plan in (old, new)}
    assert padded[old] == 8 * 320 + 6 * 40 and padded[new] == 13 * 40 + 320


def test_the_tool_times_every_case_under_both_plans_and_restores_the_planner(capsys):
    before = decode_torch.length_groups
    assert sdpa_groups.main(["--repeats", "1", "--threads", str(torch.get_num_threads())]) == 0
    assert decode_torch.length_groups is before
    rows = capsys.readouterr().out.splitlines()[2:]
    assert len(rows) == len(sdpa_groups.CASES)
    assert all(float(cell) > 0 for row in rows for cell in row.strip("| ").split(" | ")[1:])
