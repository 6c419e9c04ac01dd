"""``python -m kvbench [experiment=NAME] [overrides]``: the Hydra app.

Every user mistake ends in one line on stderr, ``kvbench: <kind> error: <what>; <fix>``, and a
documented exit code (docs/errors.md lists every case): 2 a config error, 3 an input error, 4 a
file error. ``HYDRA_FULL_ERROR=1`` shows the traceback instead.
"""

from __future__ import annotations

import atexit
import difflib
import errno
import functools
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TextIO

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kvbench.allocators import ALLOCATOR_NAMES
from kvbench.config import ConfigError, check_override_keys, validate_config
from kvbench.core.packaged_conf import option_names
from kvbench.plots import chart_formats
from kvbench.referee.vllm_v1 import RefereeUnavailable
from kvbench.tables.done_marker import (
    config_fingerprint,
    is_done,
    job_dir_name,
    mark_done,
    start_run,
)
from kvbench.workloads.schema import TokenizerUnavailableError

EXIT_CONFIG_ERROR = 2
EXIT_INPUT_ERROR = 3
EXIT_FILE_ERROR = 4
FULL_ERROR_ENV = "HYDRA_FULL_ERROR"
OUTPUT_DIR_FIX = "set hydra.run.dir=DIR (hydra.sweep.dir=DIR with -m) to a folder kvbench may write"
# What to do about an OSError, by its errno (the message already says what happened).
# Every table is written atomically (tables/atomic.py), so after a failed write the same command
# redoes only what is missing.
_RERUN_KEEPS = ", then run the same command again (complete files already written are kept)"
_FILE_FIXES = {
    errno.ENOSPC: "expected room on its disk: free space or write elsewhere with "
                  f"hydra.run.dir=DIR{_RERUN_KEEPS}",
    errno.EDQUOT: "expected room in the disk quota: free space or write elsewhere with "
                  f"hydra.run.dir=DIR{_RERUN_KEEPS}",
    errno.EFBIG: "expected a smaller file (the file-size limit, ulimit -f, or the file system "
                 f"caps it): raise it or write elsewhere with hydra.run.dir=DIR{_RERUN_KEEPS}",
    errno.EACCES: "expected a path kvbench may read (input) or write (output): fix its "
                  "permissions or choose another",
    errno.EPERM: "expected a path kvbench may read (input) or write (output): fix its "
                 "permissions or choose another",
    errno.EROFS: "expected a writable file system: choose another folder (hydra.run.dir=DIR)",
    errno.ENOENT: "expected an existing path: check it",
    errno.EISDIR: "expected a file, not a folder",
    errno.ENOTDIR: "expected folders along the path, not a file",
}

# Set by main() from the user's own HYDRA_FULL_ERROR=1 (main sets the variable for Hydra itself).
_show_tracebacks = False
_python_showwarning = warnings.showwarning
# Notices already printed: a sweep's runs repeat the same one (Python's own once-per-location
# registry is reset whenever a library changes the warning filters).
_notices_shown: set[str] = set()


def _task(name: str) -> Callable[..., object]:
    """The function that runs ``task=name`` (imported late: config errors answer fast)."""
    if name == "kernel_overhead":
        from kvbench.tasks.kernel_overhead.run import run_kernel_overhead

        return run_kernel_overhead
    if name == "logit_equivalence":
        from kvbench.tasks.equivalence.run import run_logit_equivalence

        return run_logit_equivalence
    if name == "profile":
        from kvbench.tasks.profile.run import run_profile

        return run_profile
    if name == "profile_check":
        from kvbench.tasks.profile.check import run_profile_check

        return run_profile_check
    if name == "sim_to_real":
        from kvbench.tasks.sim_to_real.run import run_sim_to_real

        return run_sim_to_real
    if name == "sim_to_vllm":
        from kvbench.tasks.sim_to_real.vllm import run_sim_to_vllm

        return run_sim_to_vllm
    if name == "paper_executed":
        from kvbench.tasks.paper_executed.run import run_paper_executed

        return run_paper_executed
    from kvbench.tasks.simulate.chart_processes import num_chart_processes
    from kvbench.tasks.simulate.run import run_study

    # Chart workers from the command line only: a worker process imports the program's main
    # module, which for ``python -m kvbench`` is skipped and for a user's script would run it.
    return functools.partial(run_study, num_chart_workers=num_chart_processes())


# hydra.sweep.subdir in conf/config.yaml; registered at import, so also in the launcher's workers.
OmegaConf.register_new_resolver("kvbench_job_dir", job_dir_name, replace=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(exit_code: int, kind: str, message: str) -> NoReturn:
    print(f"kvbench: {kind} error: {_one_line(message)}", file=sys.stderr)
    sys.exit(exit_code)


def file_error_line(error: OSError, where: str, fix: str | None = None) -> str:
    """One line for an OSError: the file it names (else ``where``, if any), what happened, and
    ``fix`` (default: the usual fix for its errno).

    Writers that do not name their file (pyarrow on a full disk) are located by ``where``, the
    folder being written.
    """
    if error.errno is None:  # raised by kvbench itself with a complete message
        return _one_line(str(error))
    path = error.filename if error.filename is not None else where
    # The errno's own words: pyarrow wraps them ("Error writing bytes to file. Detail: ...").
    reason = os.strerror(error.errno)
    fix = fix or _FILE_FIXES.get(error.errno)
    return _one_line((f"{path}: " if path else "") + reason + (f"; {fix}" if fix else ""))


def _show_notices(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """kvbench's own warnings (a trace without timestamps given arrivals, a trace sorted by
    time) as one ``kvbench: ...`` line on stdout, once; any other as Python shows it."""
    if category.__module__.startswith("kvbench."):
        notice = f"kvbench: {_one_line(str(message))}"
        if notice not in _notices_shown:
            _notices_shown.add(notice)
            print(notice, flush=True)
        return
    _python_showwarning(message, category, filename, lineno, file, line)


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="config")
def _app(cfg: DictConfig) -> None:
    warnings.showwarning = _show_notices
    try:
        typed_cfg, deployment = validate_config(cfg)
    except ConfigError as error:
        _fail(EXIT_CONFIG_ERROR, "config", str(error))
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    fingerprint = config_fingerprint(cfg)
    if typed_cfg.skip_done and is_done(output_dir, fingerprint):
        print(f"kvbench: {output_dir} is complete (DONE, same config): skipped; "
              "skip_done=false runs it again")  # fmt: skip
        return
    started_s = time.perf_counter()
    try:
        start_run(output_dir)  # no DONE while the folder holds a mix; a killed run's temporaries go
        with chart_formats(typed_cfg.plot_formats):
            _task(typed_cfg.task)(typed_cfg, deployment, cfg, output_dir)
        mark_done(output_dir, fingerprint, time.perf_counter() - started_s)
    except ValueError as error:  # bad input data (a malformed trace, an impossible request)
        if _show_tracebacks:
            raise
        _fail(EXIT_INPUT_ERROR, "input", str(error))
    # A file missing, unreadable or unwritable; an optional package's file (the offline
    # tokenizer's GGUF, the referee's vLLM) not installed.
    except (OSError, TokenizerUnavailableError, RefereeUnavailable) as error:
        if _show_tracebacks:
            raise
        if not isinstance(error, OSError):
            _fail(EXIT_FILE_ERROR, "file", str(error))
        _fail(EXIT_FILE_ERROR, "file", file_error_line(error, f"writing in {output_dir}"))


def _command_line_overrides(argv: list[str]) -> list[str]:
    """The ``key=value`` overrides of ``argv``, parsed as Hydra will; a bad flag is a
    ConfigError (one line) instead of argparse's usage text."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def usage_error(message: str) -> NoReturn:
        raise ConfigError(f"{message} (python -m kvbench --help lists the flags; overrides are "
                          "key=value, after the flags)")

    parser.error = usage_error  # type: ignore[method-assign]
    overrides: list[str] = parser.parse_args(argv).overrides
    return overrides


def _hydra_error_line(error: Exception) -> str:
    """Hydra's multi-line composition errors as one line naming the override and the fix."""
    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, name = error.missing_cfg_file.rpartition("/")
        # Hydra leaves the options out for a list of them (model=[a]), a merge of several files.
        options = error.options or _group_options(group)
        if options:
            return (f"{group}={name}: no such option; {_option_hint(group, name, options)}"
                    f"expected one of {', '.join(options)} (the files in conf/{group}/)")
    if isinstance(error, OverrideParseException):
        problem = error.message.splitlines()[0]
        return (f"cannot parse the override {error.override!r}: {problem}; expected key=value in "
                "Hydra's override grammar (https://hydra.cc/docs/advanced/override_grammar/basic/)")
    # Hydra's own messages say what to do ("use +key=value"); its search path is noise here.
    line = _one_line(str(error).split("\nConfig search path")[0])
    if str(error).startswith("Error merging override") and error.__cause__ is not None:
        # Hydra's line names only the override; the cause says what is wrong with it.
        line += ": " + _one_line(str(error.__cause__).splitlines()[0])
    return line


def _group_options(group: str) -> list[str]:
    """The files of kvbench's config group ``group`` (none for a group it does not have)."""
    try:
        return option_names(group)
    except OSError:  # no such folder in kvbench.conf
        return []


def _option_hint(group: str, name: str, options: Sequence[str]) -> str:
    """``allocator=paged`` means ``allocators=[paged]``; ``hardware=h100`` means ``h100-80gb``."""
    if group == "allocator" and name in ALLOCATOR_NAMES:
        return (f"the allocators a run compares are a list, allocators=[{name}] (conf/allocator/ "
                "holds the settings they share); ")
    close = [option for option in options if option.startswith(name)] or (
        difflib.get_close_matches(name, options, n=1, cutoff=0.75))
    return f"did you mean {' or '.join(f'{group}={option}' for option in close)}? " if close else ""


def _hydra_output_dir() -> str:
    """The output folder Hydra was setting up, when it still says ("" when not)."""
    try:
        return str(HydraConfig.get().runtime.output_dir)
    except (ValueError, OmegaConfBaseException):  # no config (any more), or no folder chosen
        return ""


def run() -> None:
    """The console script and ``python -m kvbench``: ``main``, as the process's whole life.

    Once ``main`` has returned, every file is written and closed and the chart workers are
    stopped, so the process ends there, its output flushed and its exit handlers run, without
    tearing the interpreter down (freeing every object and module of a run takes a fifth of a
    second: mypy ends the same way), unless a thread other than daemons is still running. An
    error still exits through ``sys.exit``."""
    main()
    if any(thread.is_alive() and not thread.daemon and thread is not threading.main_thread()
           for thread in threading.enumerate()):  # fmt: skip
        return  # a normal exit waits for them
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # logging's flush, multiprocessing's clean-up
    os._exit(0)


def main() -> None:
    """The command line (``run`` ends the process after it): every user mistake ends in one line
    on stderr and exit code 2 (config), 3 (input) or 4 (file); ``HYDRA_FULL_ERROR=1`` shows the
    traceback instead."""
    global _show_tracebacks
    users_setting = os.environ.get(FULL_ERROR_ENV)
    _show_tracebacks = users_setting == "1"
    if _show_tracebacks:
        _app()
        return
    # Hydra then raises its errors here instead of printing its multi-line report.
    os.environ[FULL_ERROR_ENV] = "1"
    try:
        check_override_keys(_command_line_overrides(sys.argv[1:]))
        _app()
    except ConfigError as error:
        _fail(EXIT_CONFIG_ERROR, "config", str(error))
    except (HydraException, OmegaConfBaseException) as error:  # before OSError: a missing
        _fail(EXIT_CONFIG_ERROR, "config", _hydra_error_line(error))  # config is an IOError
    except OSError as error:  # Hydra creating the output folder or writing .hydra/ into it
        line = file_error_line(error, _hydra_output_dir(), fix=OUTPUT_DIR_FIX)
        _fail(EXIT_FILE_ERROR, "file", f"cannot write the run's output folder: {line}")
    finally:
        if users_setting is None:
            os.environ.pop(FULL_ERROR_ENV, None)
        else:
            os.environ[FULL_ERROR_ENV] = users_setting

