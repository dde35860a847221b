#!/usr/bin/env python3
"""Re-record the golden logs: real recordings of the examples, build-replayed by
tests/test_golden.py against the current code.

For each log it starts what the example talks to (the loopback model server with the
example's script, the effect service), makes the example's workspace at a fixed path
that does not depend on the checkout (/tmp/steno-golden/<name>), records the example
there with `stenograph record` in a clean environment (a fixed PATH, fake API keys),
checks the new log (`stenograph log verify`, then a build replay against the code it
was recorded with), and writes golden_logs/<name>.steno.xz (xz: the uncompressed log
of an SDK agent is ~1.5 MB, mostly the stat calls of its imports) and its entry in
golden_logs/MANIFEST.json: the example, the command to build-replay it with ({python}:
the interpreter of the build under test, {repo}: the checkout's root), the stenograph
version, the log format and the shim protocol it was recorded with, and the sha256 of
the uncompressed log.

A log that was recorded by another log format or shim protocol than this build's is
not overwritten: it is kept as <name>.f<FORMAT>-p<PROTOCOL>.steno.xz, marked
"superseded" in the manifest (the tests still read it, verify it and build-replay it
to a report; only a current log must match). See golden_logs/README.md for when to
re-record: a deliberate change to what an example sends, not a new format or protocol.

One recording per shim protocol: an exact replay of a log of another protocol than this
build's stops before it runs, in one line (tests/test_golden.py holds every log to that).
``--src DIR`` records with the stenograph source tree DIR instead of this checkout (its
shim built in place): the release of an older protocol, whose log is kept beside the
current one as <name>.f<FORMAT>-p<PROTOCOL>.steno.xz, superseded.

Needs root (like a sealed replay): each recording runs in a private mount namespace
with a fresh /tmp and /var/tmp, so that the log holds neither this machine's /tmp
listing nor anything left there by earlier runs.

    .venv/bin/python golden_logs/record.py            # every log
    .venv/bin/python golden_logs/record.py pipeline   # only these
    .venv/bin/python golden_logs/record.py --src /tmp/p5/src pipeline   # a protocol-5 one
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MANIFEST = HERE / "MANIFEST.json"
WS_ROOT = "/tmp/steno-golden"
"""Where the workspaces are made when recording; a build replay recreates them there
from the log's snapshot (the path need not exist on the machine that replays)."""
FIXED_MTIME = 1767225600  # 2026-01-01T00:00:00Z: the workspace's files and directories
PATH = "/usr/local/bin:/usr/bin:/bin"
FAKE_KEY = "sk-steno-golden-not-a-real-key"
MAX_BYTES = 1 << 20
"""A compressed log bigger than this is refused (the golden logs live in the repo)."""

WS_README = """\
# steno-golden

A fixed workspace for stenograph's golden logs: golden_logs/record.py makes it, records
an example in it, and a build replay shows these files as they were recorded.
"""

DATA_TXT = """\
the quick brown fox jumps over the lazy dog
the dog sleeps and the fox runs
a fox a dog a log
"""


@dataclass(frozen=True)
class Spec:
    name: str
    example: str  # repo-relative: the program the log records
    about: str
    args: list[str] = field(default_factory=list)  # after the example (may use {ws})
    interpreter: str = "{python}"  # or a program found on PATH
    files: dict[str, str] = field(default_factory=dict)  # workspace file -> text
    copies: dict[str, str] = field(default_factory=dict)  # workspace file -> repo file
    script: str | None = None  # the model server's script (repo-relative)
    api: str | None = None  # "openai" | "anthropic"
    effects: bool = False  # start the effect service (EFFECT_URL)

    @property
    def workspace(self) -> str:
        return f"{WS_ROOT}/{self.name}"

    def cmd(self) -> list[str]:
        """The command, in terms of {python} and {repo} (what the manifest holds)."""
        return [self.interpreter, "{repo}/" + self.example,
                *(a.replace("{ws}", self.workspace) for a in self.args)]


SPECS = [
    Spec("openai_agent", "examples/agent.py",
         "the openai-SDK agent: list_dir, read_file, run (a shell subprocess), 4 model turns",
         args=["--workdir", "{ws}"], files={"README.md": WS_README},
         copies={"agent_script.json": "examples/agent_script.json"},
         script="examples/agent_script.json", api="openai"),
    Spec("anthropic_agent", "examples/anthropic_agent.py",
         "the anthropic-SDK agent (streamed messages): the same tools and turns",
         args=["--workdir", "{ws}"], files={"README.md": WS_README},
         copies={"agent_script.json": "examples/agent_script.json"},
         script="examples/agent_script.json", api="anthropic"),
    Spec("effect_agent", "examples/effect_agent.py",
         "the openai-SDK agent with effects: a GET, two POSTs (provision, pay) to the "
         "effect service, 4 model turns",
         files={"README.md": WS_README}, script="examples/effect_script.json",
         api="openai", effects=True),
    Spec("pipeline", "golden_logs/pipeline.sh",
         "a bash pipeline of coreutils (ls, sort, wc, date, mktemp...): no model calls, "
         "only the C tape", interpreter="bash",
         files={"README.md": WS_README, "data.txt": DATA_TXT}),
]
BY_NAME = {s.name: s for s in SPECS}


def substitute(cmd: list[str], python: str, repo: str | Path) -> list[str]:
    return [a.replace("{python}", python).replace("{repo}", str(repo)) for a in cmd]


# -- the recording, in a private mount namespace ---------------------------------------

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def _private_tmp(keep: list[str]) -> None:
    """This process (and its children) get a fresh /tmp and /var/tmp; the directories in
    ``keep`` that lie there (a checkout or venv under /tmp) are bound back in."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                           ctypes.c_ulong, ctypes.c_char_p]

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    for tmp in ("/tmp", "/var/tmp"):
        if not os.path.isdir(tmp):
            continue
        tops = sorted({os.path.relpath(p, tmp).split("/")[0] for p in keep
                       if p.startswith(tmp + "/")})
        fds = [os.open(os.path.join(tmp, t), os.O_PATH) for t in tops]
        check(libc.mount(b"steno-golden", tmp.encode(), b"tmpfs", 0, b"mode=1777"),
              f"mount tmpfs on {tmp}")
        for t, fd in zip(tops, fds, strict=True):
            target = os.path.join(tmp, t)
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.mkdir(target)
            else:
                Path(target).touch()
            check(libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None,
                             MS_BIND | MS_REC, None), f"bind {target}")
            os.close(fd)


def fresh_tmp(cmd: list[str]) -> int:
    """Run ``cmd`` with a fresh, empty /tmp and /var/tmp (the checkout, this venv and
    every existing path named in ``cmd`` bound back, but nothing of WS_ROOT): a machine
    that never recorded."""
    keep = {str(REPO), sys.prefix, sys.base_prefix,
            os.path.dirname(os.path.realpath(sys.executable))}
    keep |= {os.path.abspath(a) for a in cmd if os.path.exists(a)
             and not os.path.abspath(a).startswith(WS_ROOT + "/")}
    _private_tmp(sorted(keep | {os.path.realpath(p) for p in keep}))
    return subprocess.run(cmd).returncode


def _make_workspace(spec: Spec) -> None:
    ws = Path(spec.workspace)
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir(parents=True)
    for rel, text in spec.files.items():
        (ws / rel).write_text(text)
    for rel, src in spec.copies.items():
        shutil.copyfile(REPO / src, ws / rel)
    for p in [*ws.rglob("*"), ws]:
        os.utime(p, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)


SRC_VAR = "STENO_GOLDEN_SRC"
"""``--src``'s tree, passed to the inner process (and kept out of the recording)."""


def stenograph_cmd(src: str | None) -> list[str]:
    """``python -m stenograph``, of this checkout or of the source tree ``src``."""
    if not src:
        return [sys.executable, "-m", "stenograph"]
    return [sys.executable, "-c", f"import runpy, sys; sys.path.insert(0, {src!r}); "
            "runpy.run_module('stenograph', run_name='__main__', alter_sys=True)"]


def installed_at(src: str | None) -> str:
    """The directory the recording's ``stenograph`` package was in. Its path's length is
    part of what a recorded program's stack held (the shim's path in ``LD_PRELOAD``, the
    hooks' in ``PYTHONPATH``): an exact replay gives the program the same addresses only
    from an install at a path as long (tests/test_golden.py makes one)."""
    if src:
        return os.path.abspath(src)
    import stenograph

    return str(Path(stenograph.__file__).resolve().parent.parent)


def inner(name: str, out: str) -> int:
    """In a fresh /tmp: make the workspace, `stenograph record` the example in it."""
    spec = BY_NAME[name]
    src = os.environ.get(SRC_VAR)
    keep = sorted({str(REPO), sys.prefix, sys.base_prefix,
                   os.path.dirname(os.path.realpath(sys.executable)), os.path.abspath(out),
                   *([os.path.abspath(src)] if src else [])})
    if os.environ.get("STENO_GOLDEN_SHARED_TMP") != "1":
        _private_tmp([os.path.realpath(p) for p in keep] + keep)
    _make_workspace(spec)
    cmd = substitute(spec.cmd(), sys.executable, REPO)
    env = {k: v for k, v in os.environ.items()
           if k not in ("STENO_GOLDEN_SHARED_TMP", SRC_VAR)}
    return subprocess.run([*stenograph_cmd(src), "record", "-o", out, "--", *cmd],
                          cwd=spec.workspace, env=env).returncode


# -- what the examples talk to ---------------------------------------------------------

@contextlib.contextmanager
def services(spec: Spec) -> Iterator[dict[str, str]]:
    """The servers the example needs, running; the environment that names them."""
    from stenograph.testing.effect_service import EffectService
    from stenograph.testing.model_server import ModelServer

    with contextlib.ExitStack() as stack:
        env: dict[str, str] = {}
        if spec.script is not None:
            srv = stack.enter_context(ModelServer(script=REPO / spec.script))
            if spec.api == "anthropic":
                env.update(ANTHROPIC_BASE_URL=srv.anthropic_base_url,
                           ANTHROPIC_API_KEY=FAKE_KEY)
            else:
                env.update(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY=FAKE_KEY)
        if spec.effects:
            svc = stack.enter_context(EffectService())
            env["EFFECT_URL"] = svc.url
        yield env


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """The whole environment of the recorded program (a build replay restores it): no
    trace of the machine that recorded it."""
    return {"PATH": PATH, "HOME": f"{WS_ROOT}/home", "LANG": "C.UTF-8", "TZ": "UTC",
            "PYTHONDONTWRITEBYTECODE": "1", **extra}


# -- checks, the manifest --------------------------------------------------------------

def run_started(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the file's header, the RunStarted body) of an uncompressed log."""
    from stenograph.recorder.trajfile import read_trajectory

    tf = read_trajectory(path)
    started = next(e.body for e in tf.events if e.kind == "RunStarted")
    return tf.header, started


def build_replay(log: Path, cmd: list[str]) -> tuple[int, dict[str, Any], str]:
    p = subprocess.run([sys.executable, "-m", "stenograph", "replay", "--build", str(log),
                        "--json", "--", *cmd], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    lines = p.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else {}
    except ValueError:
        report = {}
    return p.returncode, report, p.stderr


def load_manifest() -> dict[str, Any]:
    if MANIFEST.exists():
        return json.loads(MANIFEST.read_text())
    return {"logs": []}


def save_manifest(doc: dict[str, Any]) -> None:
    doc["about"] = ("Golden logs: real recordings of the examples (golden_logs/record.py "
                    "writes them; tests/test_golden.py build-replays the current ones). "
                    "In a cmd, {python} is the interpreter of the build under test and "
                    "{repo} the checkout's root; a log ending in .xz is xz-compressed.")
    doc["logs"].sort(key=lambda e: (e.get("superseded", False), e["name"], e["log"]))
    MANIFEST.write_text(json.dumps({"about": doc["about"], "logs": doc["logs"]},
                                   indent=2) + "\n")


def keep_old(doc: dict[str, Any], name: str, fmt: int, protocol: int) -> None:
    """A current entry of ``name`` recorded by another format or protocol: keep its log
    under a versioned name, mark it superseded."""
    for e in doc["logs"]:
        if e["name"] != name or e.get("superseded"):
            continue
        if (e.get("format"), e.get("protocol")) == (fmt, protocol):
            continue
        old = HERE / e["log"]
        kept = f"{name}.f{e.get('format')}-p{e.get('protocol')}.steno" + (
            ".xz" if e["log"].endswith(".xz") else "")
        if (HERE / kept).exists():
            raise SystemExit(f"record.py: {kept} exists already; not overwriting an old log")
        old.rename(HERE / kept)
        e["replay"] = str(e.get("replay", "")).replace(e["log"].removesuffix(".xz"),
                                                       kept.removesuffix(".xz"))
        e["log"], e["superseded"] = kept, True
        print(f"  kept the old log (format {e.get('format')}, protocol "
              f"{e.get('protocol')}) as golden_logs/{kept}")


def record_one(spec: Spec, doc: dict[str, Any], say: Callable[[str], None],
               src: str | None = None) -> None:
    """Record ``spec`` (with the source tree ``src``, if given: an older protocol's log,
    added as superseded), check it, and write it and its manifest entry."""
    from stenograph.recorder.kinds import FORMAT_VERSION
    from stenograph.runner.shim import PROTOCOL

    raw = HERE / f".{spec.name}.recording.steno"
    raw.unlink(missing_ok=True)
    shutil.rmtree(HERE / f".{raw.name}.rec", ignore_errors=True)  # an interrupted one's
    say(f"{spec.name}: recording {spec.example} in {spec.workspace}")
    with services(spec) as svc_env:
        env = clean_env(svc_env)
        if os.environ.get("STENO_GOLDEN_SHARED_TMP") == "1":
            env["STENO_GOLDEN_SHARED_TMP"] = "1"
        if src:
            env[SRC_VAR] = os.path.abspath(src)
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--inner",
                            spec.name, str(raw)], env=env, capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
    if p.returncode != 0 or not raw.exists():
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"record.py: recording {spec.name} failed (exit {p.returncode})")
    for line in p.stderr.splitlines():
        if line.startswith("stenograph:"):
            say(f"  {line}")
    try:
        v = subprocess.run([sys.executable, "-m", "stenograph", "log", "verify", str(raw)],
                           capture_output=True, text=True, timeout=120)
        if v.returncode != 0:
            raise SystemExit(f"record.py: log verify {spec.name}: {v.stdout}{v.stderr}")
        header, started = run_started(raw)
        shim = str(started.get("shim"))
        protocol = int(shim.partition("/")[0])
        fmt = int(header.get("format", FORMAT_VERSION))
        older = protocol < PROTOCOL and src is not None
        if protocol != PROTOCOL and not older:
            raise SystemExit(f"record.py: {spec.name} recorded with shim protocol {shim}, "
                             f"this build speaks {PROTOCOL}")
        rc, report, err = build_replay(raw, substitute(spec.cmd(), sys.executable, REPO))
        if rc != 0 or report.get("divergences"):
            raise SystemExit(f"record.py: the new {spec.name} log does not build-replay "
                             f"(exit {rc}): {json.dumps(report)[:2000]}\n{err[-2000:]}")
        data = raw.read_bytes()
        packed = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
        if len(packed) > MAX_BYTES:
            raise SystemExit(f"record.py: {spec.name}: {len(packed)} bytes compressed, "
                             f"over {MAX_BYTES}")
        if older:  # beside the current one, as keep_old would have named it
            log = f"{spec.name}.f{fmt}-p{protocol}.steno.xz"
            if (HERE / log).exists():
                raise SystemExit(f"record.py: {log} exists already; not overwriting an "
                                 "old log")
        else:
            keep_old(doc, spec.name, fmt, protocol)
            log = f"{spec.name}.steno.xz"
        (HERE / log).write_bytes(packed)
    finally:
        raw.unlink(missing_ok=True)
    if not older:
        doc["logs"] = [e for e in doc["logs"]
                       if e["name"] != spec.name or e.get("superseded")]
    doc["logs"].append({
        "name": spec.name,
        "log": log,
        "example": spec.example,
        "about": spec.about,
        "workspace": spec.workspace,
        "cmd": spec.cmd(),
        "replay": "python -m stenograph replay --build golden_logs/" + log.removesuffix(".xz")
                  + " --json -- " + " ".join(spec.cmd()),
        "stenograph": started.get("stenograph"),
        "format": fmt,
        "shim": shim,
        "protocol": protocol,
        "bytes": len(data),
        "compressed_bytes": len(packed),
        "sha256": hashlib.sha256(data).hexdigest(),
        "recorded": time.strftime("%Y-%m-%d", time.gmtime(float(started.get("started", 0)))),
        "installed_at": installed_at(src),
        **({"superseded": True} if older else {}),
    })
    say(f"  -> golden_logs/{log}: {len(data)} bytes, {len(packed)} compressed; build "
        f"replay matches (drift: {report.get('drift') or {}})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="golden_logs/record.py",
        usage="%(prog)s [NAME...]\n       %(prog)s --fresh-tmp -- CMD...",
        description=__doc__,
        epilog="the logs:\n" + "\n".join(f"  {s.name:16} {s.example}: {s.about}"
                                          for s in SPECS),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help="re-record only these logs (default: all)")
    ap.add_argument("--inner", nargs=2, metavar=("NAME", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--src", metavar="DIR",
                    help="record with the stenograph source tree DIR (`git archive COMMIT | "
                    "tar -x`, its shim built in place as DIR/stenograph/_shim*.so) instead "
                    "of this checkout: an older protocol's log, kept beside the current one")
    ap.add_argument("--fresh-tmp", action="store_true",
                    help="instead: run the command after `--` with a fresh, empty /tmp "
                    "(the checkout, its venv and the paths named in the command bound "
                    "back), as on a machine that never recorded (needs root)")
    argv = sys.argv[1:] if argv is None else argv
    cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    a = ap.parse_args(argv)
    if a.inner:
        return inner(*a.inner)
    if a.fresh_tmp:
        if not cmd:
            ap.error("--fresh-tmp wants a command after `--`")
        return fresh_tmp(cmd)
    if cmd:
        ap.error("a command after `--` needs --fresh-tmp")
    unknown = [n for n in a.names if n not in BY_NAME]
    if unknown:
        ap.error(f"no golden log named {', '.join(unknown)} (known: {', '.join(BY_NAME)})")
    if os.geteuid() != 0 and os.environ.get("STENO_GOLDEN_SHARED_TMP") != "1":
        ap.error("needs root (a private /tmp per recording; set STENO_GOLDEN_SHARED_TMP=1 "
                 "to record against this machine's /tmp instead)")
    doc = load_manifest()
    if a.src and not a.names:
        ap.error("--src wants the names of the logs to record with it")
    for spec in [BY_NAME[n] for n in a.names] or SPECS:
        record_one(spec, doc, print, a.src)
        save_manifest(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
