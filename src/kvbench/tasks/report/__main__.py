"""Command line: ``python -m kvbench.tasks.report RESULTS_DIR... [--out DIR] [--docs MD]
[--formats png svg]``."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from kvbench.plots import CHART_FORMATS, DEFAULT_CHART_FORMATS, chart_formats
from kvbench.tasks.report.aggregate import UnreadableTableWarning, find_tables
from kvbench.tasks.report.docs_blocks import BEGIN, END
from kvbench.tasks.report.run import write_report


def main(argv: list[str] | None = None) -> int:
    """Aggregate the result folders; print what was written."""
    parser = argparse.ArgumentParser(prog="python -m kvbench.tasks.report", description=__doc__)
    parser.add_argument("results", nargs="+", type=Path, help="result folders (searched deeply)")
    parser.add_argument("--out", type=Path, default=Path("results/report"),
                        help="where the tables, charts, reproduction.md and "
                             "sim_to_real_runs.md go")  # fmt: skip
    parser.add_argument("--docs", type=Path, default=None,
                        help="a markdown file whose kvbench.tasks.report blocks to refresh "
                             "(e.g. docs/reproduction.md)")  # fmt: skip
    parser.add_argument("--formats", nargs="+", choices=CHART_FORMATS,
                        default=list(DEFAULT_CHART_FORMATS),
                        help="the files of each chart (default: png)")  # fmt: skip
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.results if not path.exists()]
    if missing:
        print(f"kvbench.tasks.report: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    problem = _docs_problem(args.docs) if args.docs is not None else None
    if problem:  # before any work: the report would be written, then the doc refused
        print(f"kvbench.tasks.report: {problem}", file=sys.stderr)
        return 3 if args.docs.is_file() else 4
    try:
        with chart_formats(args.formats), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UnreadableTableWarning)
            tables = write_report(args.results, args.out, args.docs)
    except OSError as error:  # the output folder (or a file in it) cannot be written
        where = error.filename or args.out
        print(f"kvbench.tasks.report: {where}: {error.strerror or error}; expected a folder "
              "it may write: --out DIR", file=sys.stderr)  # fmt: skip
        return 4
    except KeyError as error:  # a summary of another kvbench version, or another table renamed
        print(f"kvbench.tasks.report: a table under {', '.join(map(str, args.results))} lacks "
              f"column {error.args[0]!r} (not a kvbench table, or another version's); report "
              "its folders apart", file=sys.stderr)  # fmt: skip
        return 3
    for warning in caught:  # the tables left out, one line each; other warnings as Python shows
        if issubclass(warning.category, UnreadableTableWarning):
            print(f"kvbench.tasks.report: {warning.message}", file=sys.stderr)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename,
                                 warning.lineno)  # fmt: skip
    if tables.empty:
        print(f"kvbench.tasks.report: {_nothing_found(args.results)}", file=sys.stderr)
        return 3
    num_runs = sum(t["run_dir"].nunique() for t in tables.sim_to_real.values() if not t.empty)
    print(f"kvbench.tasks.report: {len(tables.summary)} summary rows, {len(tables.knees)} knees, "
          f"{len(tables.capacity)} capacity rows, {num_runs} sim-to-real runs "
          f"-> {args.out}")  # fmt: skip
    return 0


def _docs_problem(docs: Path) -> str | None:
    """Why ``--docs`` cannot be refreshed (None when it can): not a file, or a file without any
    generated block, which the report would leave as it was without a word."""
    if not docs.is_file():
        what = "a folder" if docs.is_dir() else "no such file"
        return f"--docs {docs}: {what}; expected a markdown file with report blocks"
    if BEGIN.split("{", 1)[0] not in docs.read_text(encoding="utf-8", errors="replace"):
        return (f"--docs {docs}: holds no generated block ({BEGIN.format(name='NAME')} ... "
                f"{END.format(name='NAME')}), so nothing in it would change; expected a file "
                "with them, e.g. docs/reproduction.md")
    return None


def _nothing_found(roots: list[Path]) -> str:
    """Why the folders gave no report: no table, or summaries of ``vllm_v1`` runs only (the
    report reproduces the paper's engine)."""
    if not find_tables(roots):
        return ("no summary.parquet, sim_to_real.parquet or sim_to_vllm.parquet under the "
                "folders given")  # fmt: skip
    return ("the summaries under the folders given are all of scheduler=vllm_v1 runs, and the "
            "report reproduces the paper's engine (scheduler=vllm_v0); a vllm_v1 run's own "
            "report.md and plots/ are in its run folder")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
