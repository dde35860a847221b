"""One JSON convention for every command: ``--json`` prints one document (the whole of
stdout parses as one JSON value), ``--jsonl`` a stream (every line parses). The list of
commands is read from the CLI itself, so a command that gains ``--json`` without a case
here fails this test. Real recordings of the demo agent (examples/agent.py on the openai
SDK against the loopback model server), a real store, a real git repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from planted_agent import REPO, env, script

from stenograph.cli.main import main
from stenograph.testing.model_server import ModelServer
from stenograph.testing.postgres import cluster, installed

CLI = [sys.executable, "-m", "stenograph"]
GIT = ["git", "-c", "user.name=T", "-c", "user.email=t@example.com"]


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name)


def _options(path: tuple[str, ...]) -> set[str]:
    cmd: click.Command | None = main
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.get_command(click.Context(cmd), name)
    assert cmd is not None
    return {o for p in cmd.params for o in getattr(p, "opts", [])}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    base = Path(tempfile.mkdtemp(prefix="steno-pg-"))
    try:
        if installed():  # ship's case: a private PostgreSQL cluster (the warm tier)
            with cluster(base, options="-c fsync=off") as port:
                yield _made(tmp_path_factory,
                            f"postgresql://postgres@127.0.0.1:{port}/postgres")
        else:
            yield _made(tmp_path_factory, None)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _made(tmp_path_factory: pytest.TempPathFactory, db: str | None) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("json")
    repo = root / "agent"
    repo.mkdir()
    (repo / "notes.txt").write_text("release notes: ship it.\nplease deploy web1 tonight.\n")
    shutil.copy(REPO / "examples" / "agent.py", repo / "agent.py")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "one"], cwd=repo, check=True)
    store, steno = root / "store", root / "logs" / "run.steno"
    steno.parent.mkdir()
    with ModelServer(script=script()) as srv:
        p = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "t", "-o",
                            str(steno), "--", sys.executable, "agent.py", "--workdir", "."],
                           cwd=repo, capture_output=True, timeout=180,
                           env=env(OPENAI_BASE_URL=srv.openai_base_url,
                                   OPENAI_API_KEY="sk-test-json"))
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    # a second commit that changes what the model is sent: bisect has an answer
    src = (repo / "agent.py").read_text()
    assert "MAX_OUTPUT = 4000\n" in src
    (repo / "agent.py").write_text(src.replace("MAX_OUTPUT = 4000\n", "MAX_OUTPUT = 20\n"))
    subprocess.run([*GIT, "commit", "-qam", "two"], cwd=repo, check=True)
    reply = root / "reply.json"
    reply.write_text(json.dumps({"text": "Done, differently."}))
    return {"root": root, "repo": repo, "store": store, "steno": steno, "reply": reply,
            "db": db}


def _cases(m: dict[str, Any]) -> dict[tuple[str, ...], list[str]]:
    """Each command with --json, and the arguments that make it print (no --json)."""
    steno, store, repo = str(m["steno"]), str(m["store"]), str(m["repo"])
    good = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=repo, capture_output=True,
                          text=True, check=True).stdout.strip()
    ship = {("ship",): [store, "--to", m["db"], "--once"],
            ("drain",): ["--db", m["db"], "--host", "no-such-host", "--wait", "0"]
            } if m["db"] else {}
    arch = str(m["root"] / "archive")
    return {**ship,
        # (nothing is old enough: the store stays whole for the cases after it)
        ("archive",): [store, "--older-than", "9999d", "--to", arch],
        ("query",): [arch, "SELECT count(*) AS n FROM trajectories"],
        ("bisect",): ["--good", good, "--bad", "HEAD", "--log", steno, "--repo", repo],
        ("checkpoint", "ls"): [steno],
        ("diff",): [steno, steno],
        ("fork",): [steno, "--at", "4", "--reply", str(m["reply"]), "-o",
                    str(m["root"] / "fork.steno")],
        ("gc",): [store, "--dry-run"],
        ("log", "cat"): [steno],
        ("log", "ls"): [store],
        ("log", "scan"): [steno, "--secret", "sk-test-json"],
        ("log", "verify"): [steno],
        ("regress",): [str(m["steno"].parent)],
        ("replay",): [steno],
        ("resume",): [store, "t"],
        ("show",): [steno],
        ("status",): [store],
        ("view",): [steno, "-o", str(m["root"] / "view.html")],
    }


def test_every_json_option_prints_one_document(made: dict[str, Any]) -> None:
    cases = _cases(made)
    with_json = {c for c in _commands(main) if "--json" in _options(c)}
    if not made["db"]:  # (no PostgreSQL here: ship has nowhere to ship to)
        with_json -= {("ship",), ("drain",)}
    assert with_json == set(cases), ("a command with --json has no case here (or a case "
                                     "lost its --json)", with_json ^ set(cases))
    for cmd, args in sorted(cases.items()):
        for flag in ("--json", "--jsonl") if "--jsonl" in _options(cmd) else ("--json",):
            p = subprocess.run([*CLI, *cmd, *args, flag], cwd=made["root"],
                               capture_output=True, text=True, timeout=300, env=env())
            assert p.returncode in (0, 1), (cmd, flag, p.returncode, p.stderr[-2000:])
            assert p.stdout.strip(), (cmd, flag, p.stderr[-2000:])
            if flag == "--json":
                doc = json.loads(p.stdout)  # the whole of stdout: one document
                assert isinstance(doc, dict), (cmd, type(doc))
            else:
                lines = p.stdout.splitlines()
                assert all(isinstance(json.loads(ln), dict) for ln in lines), cmd
    # the shapes a script relies on
    st = json.loads(subprocess.run([*CLI, "status", str(made["store"]), "--json"],
                                   capture_output=True, text=True, check=True).stdout)
    assert [t["traj"] for t in st["trajectories"]] == ["t"]
    one = json.loads(subprocess.run([*CLI, "status", str(made["store"]), "t", "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    assert one["traj"] == "t" and "effects" in one
    cp = json.loads(subprocess.run([*CLI, "checkpoint", "ls", str(made["steno"]), "--json"],
                                   capture_output=True, text=True, check=True).stdout)
    assert cp["turns"] == 4 and cp["checkpoints"][0]["at"] == "start"
    ev = json.loads(subprocess.run([*CLI, "log", "cat", str(made["steno"]), "--json"],
                                   capture_output=True, text=True, check=True).stdout)
    assert ev["events"][0]["kind"] == "RunStarted"
    assert os.path.exists(made["root"] / "view.html")
