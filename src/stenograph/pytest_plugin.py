"""The pytest plugin (entry point ``pytest11``: installing stenograph enables it).

``pytest --stenograph-logs DIR [--stenograph-cmd "CMD"]`` adds one test per ``.steno``
under DIR, with the file's path relative to DIR as its id: a build replay of the log
against the code as it is now (``stenograph replay --build``), failing with the
divergence report. Without the option the plugin adds nothing.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from stenograph.ci import regress as rg
from stenograph.errors import BadInput
from stenograph.runner.buildcode import CodeMap


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stenograph", "build replay of recorded agent runs")
    group.addoption("--stenograph-logs", action="append", default=[], metavar="DIR",
                    help="Add one build-replay test per .steno file under DIR "
                         "(repeatable).")
    group.addoption("--stenograph-cmd", default=None, metavar="CMD",
                    help="Replay each log with this command instead of the recorded one "
                         "(shell words, e.g. \"python agent.py\").")
    group.addoption("--stenograph-map", action="append", default=[], metavar="RECORDED=HERE",
                    help="A recorded directory whose command files are HERE's (as "
                         "`replay --build --map`; repeatable). Default: a recording made "
                         "elsewhere maps its working directory to pytest's when that "
                         "holds its program.")


class DivergedError(Exception):
    """A build replay that did not match: the report is the failure's text."""


class LogItem(pytest.Item):
    """One recording, build-replayed."""

    def __init__(self, *, log: Path, cmd: list[str], options: list[str],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log = log
        self.cmd = cmd
        self.options = options

    def runtest(self) -> None:
        o = rg.run_one(self.name, self.log, self.cmd, self.options)
        drift = o.report.get("drift") or {}
        if drift:
            self.add_report_section("call", "drift", ", ".join(
                f"{k} {v}" for k, v in sorted(drift.items())))
        if o.status != "pass":
            raise DivergedError("\n".join([f"{self.name}: {o.site()}", *rg.describe(o)]))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        if isinstance(excinfo.value, DivergedError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, None, str]:
        return self.log, None, f"build replay of {self.name}"


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    dirs = config.getoption("stenograph_logs")
    if not dirs:
        return
    raw = config.getoption("stenograph_cmd")
    cmd = shlex.split(raw) if raw else []
    try:
        maps = [CodeMap.parse(m) for m in config.getoption("stenograph_map")]
    except BadInput as exc:
        raise pytest.UsageError(str(exc)) from None
    options = [f"--map={m.recorded}={m.here}" for m in maps]
    for d in dirs:
        root = Path(d)
        if not root.exists():
            raise pytest.UsageError(f"--stenograph-logs: no such directory: {d}")
        logs = rg.find_logs(root)
        if not logs:
            raise pytest.UsageError(f"--stenograph-logs: no .steno files under {d}")
        for rel, path in logs:
            items.append(LogItem.from_parent(session, name=rel, nodeid=rel, log=path,
                                             cmd=cmd, options=options))
