"""``python -m kvbench.tasks.report RESULTS_DIR...``: aggregate runs into one report.

Reads every ``summary.parquet`` (and ``capacity.parquet``) under the folders given, single runs
and Hydra multiruns alike, and writes the aggregated tables, the charts and the reproduction
report (each paper figure beside kvbench's, the gap explained). Over ``sim_to_real`` and
``sim_to_vllm`` runs (their ``sim_to_real.parquet`` / ``sim_to_vllm.parquet``), it writes their
errors across runs, each predictor paired with the engine's own repeat (``sim_to_real_runs.md``).
"""

from kvbench.tasks.report.aggregate import load_summaries, load_tables
from kvbench.tasks.report.run import ReportTables, compute_tables, write_report

__all__ = ["ReportTables", "compute_tables", "load_summaries", "load_tables", "write_report"]
