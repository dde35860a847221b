"""``stenograph regress``: build-replay a directory of recordings, for CI outside pytest."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import click

from stenograph.ci import regress as rg
from stenograph.cli.options import RECORDING
from stenograph.errors import BadInput, CorruptLog, ReplayDiverged
from stenograph.runner.buildcode import CodeMap


@click.command("regress")
@click.argument("directory", type=RECORDING)
@click.option("-j", "--jobs", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Replays run at once (each is sealed in its own mount namespace).")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), default=None,
              help="Also write JUnit XML here (one testcase per log), for CI to show.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
@click.option("--code", "code_globs", multiple=True, metavar="GLOB",
              help="Passed to every `replay --build` (workspace files that are code).")
@click.option("--map", "map_set", multiple=True, metavar="RECORDED=HERE",
              help="Passed to every `replay --build`: the recorded directory's command "
              "files are HERE's (a recording made where the agent is deployed). Default: "
              "a recording made elsewhere maps its working directory to this one when "
              "this one holds its program.")
@click.option("--env", "env_set", multiple=True, metavar="NAME=VALUE",
              help="Passed to every `replay --build` (the program's environment).")
@click.option("--where", "where", metavar="SQL", default=None,
              help="DIRECTORY is an archive: only the runs of `SELECT traj FROM "
              "trajectories WHERE SQL` (e.g. \"tenant = 'acme' AND started > now() - "
              "INTERVAL 30 DAY\"; docs/archive.md).")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def regress(directory: str, jobs: int, junit_path: str | None, as_json: bool,
            code_globs: tuple[str, ...], map_set: tuple[str, ...], env_set: tuple[str, ...],
            where: str | None, cmd: tuple[str, ...]) -> None:
    """Build-replay every .steno under DIRECTORY against the code as it is now.

    DIRECTORY may be an archive (`stenograph archive --to`, a directory or s3://): its
    runs, or those --where selects, are brought back and replayed like files.

    Each log is one `stenograph replay --build` (model requests, tool calls, effects and
    the exit status strict; clocks, entropy and listings drift). `-- CMD` runs CMD
    instead of each recorded command. The summary groups failures by where and how they
    first diverged. Exit 0 when every log matches, 1 when one diverged, else the code of
    the worst error (2 a log that cannot be read, 3 a corrupt one).

    Example: stenograph regress golden_logs -j 2 --junit regress.xml
    """
    from stenograph.cold.restore import is_archive, restore_where

    if is_archive(directory):
        root = restore_where(directory, where)
    elif where is not None:
        raise BadInput("--where selects runs of an archive; this is not one", directory)
    else:
        root = Path(directory)
    if not root.exists():
        raise BadInput("no such directory", directory)
    logs = rg.find_logs(root)
    if not logs:
        raise BadInput("no .steno files here", directory)
    maps = [CodeMap.parse(m) for m in map_set]  # checked once, here
    options = [*(f"--code={g}" for g in code_globs), *(f"--env={e}" for e in env_set),
               *(f"--map={m.recorded}={m.here}" for m in maps)]
    if junit_path is not None and Path(junit_path).is_dir():
        raise BadInput("--junit: is a directory", junit_path)
    t0 = time.monotonic()
    outcomes = _run_all(logs, jobs, list(cmd), options, progress=not as_json)
    seconds = time.monotonic() - t0
    outcomes.sort(key=lambda o: o.rel)
    if junit_path is not None:
        Path(junit_path).write_bytes(rg.junit(outcomes, seconds))
    summary = {"passed": sum(o.status == "pass" for o in outcomes),
               "failed": sum(o.status == "fail" for o in outcomes),
               "errors": sum(o.status == "error" for o in outcomes),
               "seconds": round(seconds, 3), "jobs": jobs, "groups": rg.groups(outcomes)}
    if as_json:
        click.echo(json.dumps({"logs": [o.to_json() for o in outcomes], "summary": summary},
                              sort_keys=True, default=str))
    else:
        _print_summary(outcomes, summary)
    if summary["failed"]:
        sys.exit(ReplayDiverged.exit_code)
    if summary["errors"]:
        worst = max((o.code for o in outcomes if o.status == "error"), default=2)
        sys.exit(worst if worst in (BadInput.exit_code, CorruptLog.exit_code) else 2)


def _run_all(logs: list[tuple[str, Path]], jobs: int, cmd: list[str], options: list[str],
             progress: bool) -> list[rg.Outcome]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    console = Console(stderr=True)
    outcomes: list[rg.Outcome] = []
    show = progress and console.is_terminal
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  disable=not show, transient=True) as bar:
        task = bar.add_task("build replay", total=len(logs))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(rg.run_one, rel, path, cmd, options) for rel, path in logs]
            for fut in as_completed(futures):
                o = fut.result()
                outcomes.append(o)
                bar.advance(task)
                if progress and not show:
                    click.echo(f"{o.status:5} {o.rel} ({o.seconds:.1f} s)", err=True)
                elif show and o.status != "pass":
                    bar.console.print(f"[red]{o.status}[/red] {o.rel}: {o.site()}")
    return outcomes


def _print_summary(outcomes: list[rg.Outcome], summary: dict) -> None:
    for group in summary["groups"]:
        click.echo(f"{group['count']} log(s): {group['site']}", err=True)
        for f in group["files"][:10]:
            click.echo(f"    {f}", err=True)
        if len(group["files"]) > 10:
            click.echo(f"    ... {len(group['files']) - 10} more", err=True)
    n = len(outcomes)
    rate = n / summary["seconds"] if summary["seconds"] else 0.0
    click.echo(f"stenograph: regress: {summary['passed']} of {n} log(s) match, "
               f"{summary['failed']} diverged, {summary['errors']} error(s) in "
               f"{summary['seconds']:.1f} s ({rate:.1f} logs/s, -j {summary['jobs']})",
               err=True)
