"""``stenograph replay``: re-run a recorded command with every recorded value served, and
say whether it was the same run (``runner/replay.py``).

Exit 0 when the replay was bit-identical; 1 on a divergence, or when stdout, stderr or
the exit status differ (a script or CI step cannot take it for a pass); 2 before anything
runs for a recording of another shim protocol (one line: ``--build`` reads it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from stenograph.cli.options import RECORDING
from stenograph.recorder.errors import BadInput, ReplayDiverged
from stenograph.recorder.inputs import input_file
from stenograph.runner import buildreplay
from stenograph.runner.buildcode import CodeMap
from stenograph.runner.replay import ReplayRequest
from stenograph.runner.replay import replay as replay_run
from stenograph.runner.workspace import SecretServed


@click.command("replay")
@click.argument("file", type=RECORDING)
@click.option("--lenient", is_flag=True, help="Serve live values past a divergence; list all.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (program output "
              "is not passed through).")
@click.option("--allow-network", is_flag=True, help="Let connections the recording never "
              "made reach peers outside the recorded tree (loopback, Unix sockets and "
              "beyond); they are refused by default. Recorded connections are served from "
              "the socket tape either way: no peer gets a recorded send again.")
@click.option("--unsealed", is_flag=True, help="Replay against the live /tmp, /var/tmp, "
              "$TMPDIR and workspace, not sealed (the default seals in a mount or user "
              "namespace, or by the shim's path mapping where neither can be made): names "
              "the recording created there are taken, and the program reads and writes "
              "today's files.")
@click.option("--keep-tape", type=click.Path(file_okay=False), default=None,
              help="Keep the replay's tape in this directory (new or empty), moved "
              "there once the program has run; nothing is left there if the replay "
              "fails to run.")
@click.option("--keep-writes", type=click.Path(file_okay=False), default=None,
              help="Keep what the program wrote to its workspace here (an overlay's upper "
              "layer per workspace root; deleted files are overlayfs whiteouts). The real "
              "workspace is never written.")
@click.option("--live", "live", multiple=True, type=click.Path(exists=True), metavar="PATH",
              help="Show PATH (a file or directory in the workspace) as it is now, not as "
              "recorded: the code of a program you changed. Files named on an edited "
              "command line (`-- CMD`) are live anyway.")
@click.option("--build", "build", is_flag=True,
              help="Judge another build of the program (CI, regress, bisect): model "
              "requests, tool calls, effects and the exit status are strict; clocks, "
              "entropy, listings, identity, waits, pipe shape and threads are served "
              "while they fit, then live, and counted as drift. The workspace's code "
              "(--code) is live, its other files as recorded; stdout is not compared.")
@click.option("--compare-output", is_flag=True,
              help="With --build: stdout and stderr must be identical too.")
@click.option("--code", "code_globs", multiple=True, metavar="GLOB",
              help="With --build: workspace files that are the build's code, shown as "
              "they are now (default: *.py, *.pyi, *.so, pyproject.toml, setup.py, lock "
              "files...; repeatable; `none`: every file as recorded).")
@click.option("--map", "map_set", multiple=True, metavar="RECORDED=HERE",
              help="With --build: the recorded directory RECORDED shows the code of HERE "
              "(the build under test) in place of its own; its other files stay the "
              "recording's. Default: a recording made in another directory maps its "
              "working directory to this one when this one holds the program it ran.")
@click.option("--env", "env_set", multiple=True, metavar="NAME=VALUE",
              help="With --build: set NAME in the program's environment (which is "
              "otherwise the recorded one), e.g. PYTHONPATH for the build under test.")
@click.option("--stop-at", hidden=True, default=None, metavar="PROC:POS",
              help="Snapshot the workspace at this model request into KEEP_TAPE/stop and "
              "end there (`stenograph checkpoint restore`).")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def replay(file: str, lenient: bool, as_json: bool, allow_network: bool, unsealed: bool,
           keep_tape: str | None, keep_writes: str | None, live: tuple[str, ...],
           build: bool, compare_output: bool, code_globs: tuple[str, ...],
           map_set: tuple[str, ...], env_set: tuple[str, ...], stop_at: str | None,
           cmd: tuple[str, ...]) -> None:
    """Re-run a recorded command, serving every recorded clock, byte and listing.

    Sealed (the default): the program runs in a private mount namespace where /tmp is
    fresh and each recorded workspace directory holds the files it held when the
    recording started, whatever it holds now; nothing it writes reaches the real files."""
    input_file(file)
    overrides = {}
    for item in env_set:
        name, eq, value = item.partition("=")
        if not eq or not name or name.startswith("STENO_") or "\0" in item:
            raise BadInput("--env wants NAME=VALUE (not a STENO_ variable)", item)
        overrides[name] = value
    report = replay_run(ReplayRequest(
        file, cmd=list(cmd), lenient=lenient, passthrough=not as_json,
        allow_network=allow_network, unsealed=unsealed,
        keep_tape=Path(keep_tape) if keep_tape else None,
        keep_writes=Path(keep_writes) if keep_writes else None, live=list(live),
        build=build, compare_output=compare_output, code_globs=code_globs,
        maps=[CodeMap.parse(m) for m in map_set], env=overrides,
        stop_at=stop_at))
    if build:
        if as_json:
            click.echo(json.dumps(report, sort_keys=True, default=str))
        else:
            buildreplay.print_report(report, lambda line: click.echo(line, err=True))
        _verdict(report["divergences"], None, as_json, f"build replay diverged "
                 f"({len(report['divergences'])} divergence(s))", file)
        return
    _print_report(report, as_json)
    different = ", ".join(k for k, v in report["identical"].items() if not v)
    _verdict(report["divergences"], different, as_json,
             f"replay diverged ({len(report['divergences'])} divergence(s))", file)


def _verdict(divergences: list[Any], different: str | None, as_json: bool, line: str,
             file: str) -> None:
    """Exit 1 on a divergence or a difference: one error line, or (``--json``, whose
    report said it) just the status."""
    if divergences:
        if not as_json:
            raise ReplayDiverged(line, file)
        sys.exit(ReplayDiverged.exit_code)
    if different:
        if not as_json:
            raise ReplayDiverged(f"replay is not bit-identical ({different} differ)", file)
        sys.exit(ReplayDiverged.exit_code)


def _print_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report, indent=None, sort_keys=True))
        return
    say = lambda line: click.echo(line, err=True)  # noqa: E731
    for d in report["drift"]:
        say(f"stenograph: drift: process {d['proc']} thread {d['thread']} "
            f"{d['channel']}#{d['position']}: {d['asked']}")
    for d in report["divergences"]:
        if d.get("detail"):
            say(f"stenograph: divergence: process {d['proc']} channel {d['channel']} "
                f"position {d['position']}")
            for line in d["detail"]:
                say(f"  {line}")
            continue
        say(f"stenograph: divergence: process {d['proc']} thread {d['thread']} "
            f"channel {d['channel']} position {d['position']}")
        say(f"  recorded: {d['recorded']}")
        say(f"  asked:    {d['asked']}")
        for line in d.get("before", []):
            say(f"  before:   {line}")
        for line in d.get("python_stack", []):
            say(f"  where:    {line}")
    refused = report.get("refused", [])
    if refused:
        say(f"stenograph: note: refused {len(refused)} connection(s) the recording never "
            f"made, to peers outside the recorded tree (a replay reaches no service; "
            f"--allow-network lets them through): "
            f"{'; '.join(refused[:3])}{' ...' if len(refused) > 3 else ''}")
    if report.get("network") == "allowed":
        say("stenograph: note: --allow-network: connections the recording never made "
            "reached live peers (recorded ones were served from the tape)")
    if report["divergences"] or not all(report["identical"].values()):
        for n in report.get("secret_files", []):  # a masked secret file may be why
            if n["served"] == "masked" or n["same"] is False:
                say(f"stenograph: note: {SecretServed(**n).line()}")
    if not report["divergences"]:
        same = report["identical"]
        verdict = "bit-identical" if all(same.values()) else "DIFFERENT"
        if report.get("killed") and all(same.values()):
            verdict += f" up to the kill (signal {report['killed']['signal']})"
            past = report["killed"]["after_kill_bytes"]
            verdict += "".join(f"; {n} byte(s) of {k} after the point the recorded run "
                               f"was killed at" for k, n in past.items() if n)
        parts = ", ".join(f"{k} {'identical' if v else 'differs'}" for k, v in same.items())
        say(f"stenograph: replay {verdict}: {parts}")
