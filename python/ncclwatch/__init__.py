"""ncclwatch from Python: names the rank, the collective and the line of code behind a hung NCCL job.

The wheel carries the `ncclwatch` command and `libncclwatch.so`; this package is a thin layer
over the command (the work stays in it and in the library)::

    import ncclwatch
    report = ncclwatch.analyze("ncclwatch-1234")          # the `analyze --json` report
    for verdict in report["verdicts"]:
        print(verdict["cause"], verdict["culprit_ranks"])

Reports and dumps are the documented JSON of `ncclwatch analyze --json` (docs/analysis.md) and
of the dumps (docs/trace-format.md). A failure of the command raises `NcclwatchError` with the
command's one-line message.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple, Union

from ._version import __version__

__all__ = ["NcclwatchError", "analyze", "command_path", "library_path", "load_dump", "request_dump",
           "__version__"]

PathLike = Union[str, "os.PathLike[str]"]

_HERE = os.path.dirname(os.path.abspath(__file__))


class NcclwatchError(Exception):
    """The command failed: `message` is its one-line explanation (what `ncclwatch` printed),
    `returncode` its exit status, `stderr` everything it printed there."""

    def __init__(self, message: str, returncode: int, stderr: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.returncode = returncode
        self.stderr = stderr


def library_path() -> str:
    """The path of the wheel's `libncclwatch.so`, for `LD_PRELOAD` without `ncclwatch run`."""
    return os.path.join(_HERE, "lib", "libncclwatch.so")


def command_path() -> str:
    """The path of the wheel's `ncclwatch` command (what `ncclwatch` on the PATH runs)."""
    return os.path.join(_HERE, "bin", "ncclwatch")


def _message(stderr: str, returncode: int) -> str:
    # The command says what went wrong in one line; a usage error adds "(see `ncclwatch ... --help`)".
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("(see ")]
    return lines[-1] if lines else f"ncclwatch exited with status {returncode}"


def _json_of(args: List[str], ok: Tuple[int, ...]) -> Any:
    """Runs the command with `args` and returns the JSON it printed, when its exit status is one
    of `ok` (analyze: 0 nothing hangs, 1 a hang was attributed; 2 is bad usage or nothing
    readable); raises NcclwatchError otherwise."""
    env = dict(os.environ, NO_COLOR="1")
    r = subprocess.run([command_path()] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env, universal_newlines=True)
    if r.returncode not in ok:
        raise NcclwatchError(_message(r.stderr, r.returncode), r.returncode, r.stderr)
    try:
        return json.loads(r.stdout)
    except ValueError as e:
        raise NcclwatchError(f"ncclwatch {args[0]}: no JSON in its output ({e})", r.returncode, r.stderr) from e


def _path(path: PathLike) -> str:
    """A path as an argument: one that starts with '-' is not taken for an option."""
    text = os.fspath(path)
    return "./" + text if text.startswith("-") else text


def _options(options: Dict[str, Any]) -> List[str]:
    """Keyword options as the command's: `attempt=2` is `--attempt 2`, `no_slow_ranks=True` is
    `--no-slow-ranks`; False and None leave an option out."""
    out: List[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def analyze(dump_dir: PathLike, **options: Any) -> Dict[str, Any]:
    """Analyzes the dumps in `dump_dir` (`ncclwatch analyze DIR --json`) and returns the report:
    `report["verdicts"]`, each with its `cause` (`rank_missing`, ...), `culprit_ranks` and
    evidence; schema in docs/analysis.md.

    Options are the command's, by name: `attempt=N` (a directory reused by restarts),
    `slow_ranks=True`, `no_slow_ranks=True`. Raises NcclwatchError when there is no
    readable dump or an option is refused, with the command's message."""
    return _json_of(["analyze", _path(dump_dir), "--json"] + _options(options), ok=(0, 1))


def load_dump(path: PathLike, ring: Optional[int] = None) -> Dict[str, Any]:
    """One rank's dump, read and checked by `ncclwatch show FILE --json`: the dump's own JSON
    (docs/trace-format.md). `ring`: keep only the newest N ring entries (default: all).
    Raises NcclwatchError for a missing or unreadable file."""
    keep = sys.maxsize if ring is None else ring
    return _json_of(["show", _path(path), "--json", "--ring", str(keep)], ok=(0,))


def request_dump(dump_dir: PathLike, wait: Optional[float] = None) -> Dict[str, Any]:
    """Makes every rank of the running job whose dump directory is `dump_dir` dump now (the job
    goes on), as `ncclwatch dump DIR` does: waits until every rank answered or `wait` seconds
    passed (the command's default: 15), and returns the analysis of the directory, as
    `analyze`. A healthy job reads `no_hang`; every rank answers every request with a new dump.
    Raises NcclwatchError when no rank answered (the directories it made for that path are
    removed again)."""
    args = ["dump", _path(dump_dir), "--json"]
    if wait is not None:
        args += ["--wait", str(wait)]
    return _json_of(args, ok=(0, 1))
