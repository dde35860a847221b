"""The sweep of a coding agent's everyday tools: each case a small project and the
command an agent runs in it, recorded once and replayed N times (``tests/test_toolbox.py``
runs the quick ones in ``make test`` and all of them in ``make soak``; ``bench/toolbox.py``
prints the table with the wall times).

A case is run twice from the same setup: natively (the time, and what it prints) and
under ``stenograph record`` (each replay of that recording must be bit-identical). Tools
that are not on the machine and cannot be installed from PyPI or the npm registry are
skipped with the reason."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "stenograph"]
PY = sys.executable

Setup = Callable[[Path], dict[str, str]]
"""Writes the project into the directory; returns environment additions."""


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]
    setup: Setup
    needs: tuple[str, ...] = ()
    """Executables the case runs (skipped without them)."""
    quick: bool = False
    """In ``make test`` (the rest in ``make soak``)."""
    before: tuple[tuple[str, ...], ...] = ()
    """Commands run natively before the recorded one (a failing run ``--lf`` reruns)."""
    after: tuple[tuple[str, ...], ...] = ()
    """Commands run natively between the recording and its replays (they change
    ``/tmp``, caches, the project: a sealed replay must not see it)."""
    known: str = ""
    """Why its replay is not bit-identical yet (``docs/determinism.md`` has the row): the
    replay must then report a divergence, never differ silently."""


@dataclass
class Outcome:
    name: str
    native_s: float = 0.0
    record_s: float = 0.0
    replay_s: float = 0.0
    identical: int = 0
    replays: int = 0
    status: int | None = None
    reason: str = ""
    reported: int = 0
    """Replays that failed with a divergence named (not a silent difference)."""
    skipped: str = ""
    outputs: list[str] = field(default_factory=list)
    record_err: str = ""


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


PYTESTS = """\
def test_a(tmp_path):
    (tmp_path / "x").write_text("1")
    assert (tmp_path / "x").read_text() == "1"

def test_b():
    assert sum([2, 2]) == 4

def test_c(tmp_path):
    assert not list(tmp_path.iterdir())
"""


def _pytest(root: Path) -> dict[str, str]:
    """Its own temporary directory: the runs of this case share ``pytest-of-USER`` there
    (as a developer's runs share /tmp's) and no other pytest session's runs do."""
    _write(root, {"test_two.py": PYTESTS})
    (root.parent / f"tmp-{root.name}").mkdir(exist_ok=True)
    return {"TMPDIR": str(root.parent / f"tmp-{root.name}")}


def _pytest_lf(root: Path) -> dict[str, str]:
    _write(root, {"test_lf.py": "import os\n\ndef test_ok():\n    assert os.sep == '/'\n\n"
                                "def test_flaky():\n    assert os.path.exists('fixed')\n"})
    return {}


def _ruff(root: Path) -> dict[str, str]:
    _write(root, {"pkg/a.py": "import os\nimport sys\n\n\ndef f(x):\n    return x == None\n",
                  "pkg/b.py": "def g():\n    return 1\n"})
    return {}


def _typed(tool: str) -> Setup:
    """A file with type errors and its formatting off, and ``tool`` from PyPI."""
    def setup(root: Path) -> dict[str, str]:
        from pip_target import installed

        where = installed(f"tool-{tool}", tool, tool)
        _write(root, {"typed.py": "def f(x: int) -> str:\n    return x\n\n\nf('a')\n"})
        return {"PYTHONPATH": str(where)}
    return setup


def _uv(root: Path) -> dict[str, str]:
    from pip_target import installed

    where = installed("tool-uv", "uv", "uv")
    _wheel(root)
    return {"PATH": f"{where / 'bin'}:{os.environ.get('PATH', '')}",
            "UV_CACHE_DIR": str(root / ".uv-cache")}


def _wheel(root: Path) -> dict[str, str]:
    """A pure-Python wheel built by hand (a zip with its dist-info), installed offline."""
    whl = root / "tiny-1.0-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n"
    wheel = "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("tiny/__init__.py", "VALUE = 42\n")
        z.writestr("tiny-1.0.dist-info/METADATA", meta)
        z.writestr("tiny-1.0.dist-info/WHEEL", wheel)
        z.writestr("tiny-1.0.dist-info/RECORD", "")
    return {}


def _npm(root: Path) -> dict[str, str]:
    _write(root, {"package.json": '{"name": "tiny", "version": "1.0.0", "private": true,\n'
                                  ' "scripts": {"test": "node test.js"}}\n',
                  "test.js": "const assert = require('node:assert');\n"
                             "const add = (a, b) => a + b;\n"
                             "assert.strictEqual(add(2, 3), 5);\n"
                             "console.log('ok', add(2, 3), typeof performance.now());\n"})
    return {}


def _tsc(root: Path) -> dict[str, str]:
    from pip_target import npm_installed

    ts = npm_installed("npm-typescript", "typescript")
    _write(root, {"a.ts": "export function add(a: number, b: number): number {\n"
                          "  return a + b;\n}\nconsole.log(add(2, 3));\n",
                  "tsconfig.json": '{"compilerOptions": {"outDir": "out", "strict": true}}\n'})
    return {"PATH": f"{ts / 'node_modules' / '.bin'}:{os.environ.get('PATH', '')}"}


def _crate(root: Path) -> dict[str, str]:
    _write(root, {"Cargo.toml": '[package]\nname = "tiny"\nversion = "0.1.0"\n'
                                'edition = "2021"\n',
                  "src/lib.rs": "pub fn add(a: i32, b: i32) -> i32 { a + b }\n\n"
                                "#[cfg(test)]\nmod tests {\n    #[test]\n"
                                "    fn adds() { assert_eq!(super::add(2, 3), 5); }\n}\n"})
    return {"CARGO_TARGET_DIR": str(root / "target"), "CARGO_TERM_COLOR": "never"}


def _make(root: Path) -> dict[str, str]:
    files = {f"m{i}.c": f"int f{i}(void) {{ return {i}; }}\n" for i in range(3)}
    files["main.c"] = ("#include <stdio.h>\nint f0(void); int f1(void); int f2(void);\n"
                       "int main(void) { printf(\"%d\\n\", f0() + f1() + f2()); return 0; }\n")
    files["Makefile"] = ("OBJS = m0.o m1.o m2.o main.o\nall: prog\n"
                         "prog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n"
                         "%.o: %.c\n\t$(CC) -O1 -c $< -o $@\n")
    _write(root, files)
    return {}


def _go(root: Path) -> dict[str, str]:
    _write(root, {"go.mod": "module tiny\n\ngo 1.19\n",
                  "add.go": "package tiny\n\nfunc Add(a, b int) int { return a + b }\n",
                  "add_test.go": "package tiny\n\nimport \"testing\"\n\n"
                                 "func TestAdd(t *testing.T) {\n"
                                 "\tif Add(2, 3) != 5 {\n\t\tt.Fatal(\"add\")\n\t}\n}\n"})
    return {"GOCACHE": str(root / ".gocache"), "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}


def _git(root: Path) -> dict[str, str]:
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@x", "GIT_CONFIG_GLOBAL": "/dev/null",
           # the hashes natively and under record alike (the replays have the clock)
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    full = {**os.environ, **env}
    run = lambda *a: subprocess.run(["git", *a], cwd=root, env=full, check=True,  # noqa: E731
                                    capture_output=True)
    run("init", "-q", "-b", "main")
    for i in range(3):
        (root / f"f{i}.txt").write_text(f"{i}\n")
        run("add", ".")
        run("commit", "-q", "-m", f"c{i}")
    run("checkout", "-q", "-b", "topic", "HEAD~2")
    (root / "t.txt").write_text("topic\n")
    run("add", ".")
    run("commit", "-q", "-m", "topic work")
    (root / "work.txt").write_text("agent's change\n")
    return env


def _text(root: Path) -> dict[str, str]:
    _write(root, {"data.json": '{"items": [{"n": "b", "v": 2}, {"n": "a", "v": 1}]}\n',
                  "notes.txt": "alpha TODO\nbeta\ngamma TODO\n",
                  "src/x.py": "# TODO: one\nprint('x')\n", "src/y.py": "print('y')  # TODO\n"})
    return {}


def _venv_tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


SH = "/bin/sh"

CASES: list[Case] = [
    Case("pytest tmp_path", [PY, "-m", "pytest", "-q", "test_two.py"], _pytest,
         after=((PY, "-m", "pytest", "-q", "test_two.py"),
                (PY, "-m", "pytest", "-q", "test_two.py"))),
    Case("pytest --lf", [PY, "-m", "pytest", "-q", "--lf", "test_lf.py"], _pytest_lf,
         before=((PY, "-m", "pytest", "-q", "test_lf.py"),)),
    Case("pytest -n 2", [PY, "-m", "pytest", "-q", "-n", "2", "-p", "xdist", "test_two.py"],
         _pytest),
    Case("ruff check", [_venv_tool("ruff"), "check", "--no-cache", "pkg"], _ruff, quick=True),
    Case("mypy", [PY, "-m", "mypy", "typed.py"], _typed("mypy")),
    Case("black", [PY, "-m", "black", "--check", "--diff", "typed.py"], _typed("black")),
    Case("pip install wheel", [PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                               "--disable-pip-version-check", "--target", "site",
                               "tiny-1.0-py3-none-any.whl"], _wheel),
    Case("uv pip install", ["uv", "pip", "install", "--offline", "--no-deps", "--target",
                            "site", "tiny-1.0-py3-none-any.whl"], _uv),
    Case("npm test", ["npm", "test", "--silent"], _npm, needs=("npm", "node")),
    Case("npx tsc", ["npx", "--no-install", "tsc", "-p", "."], _tsc, needs=("npx", "node"),
         known="a worker thread node starts just before it exits makes a wait at replay "
               "that it had not reached when the recorded process ended"),
    Case("cargo build", ["cargo", "build", "--offline", "-q"], _crate, needs=("cargo",)),
    Case("cargo test", ["cargo", "test", "--offline", "-q"], _crate, needs=("cargo",)),
    Case("make -j3", ["make", "-s", "-j3"], _make, needs=("make", "cc"), quick=True),
    Case("go test", ["go", "test", "./..."], _go, needs=("go",)),
    Case("git commit+rebase+log", [SH, "-c", "git add -A && git commit -q -m 'agent' && "
                                     "git rebase -q main && git log --oneline --stat"],
         _git, needs=("git",), quick=True),
    Case("rg", ["rg", "-n", "--sort", "path", "TODO"], _text, needs=("rg",)),
    Case("jq", ["jq", "-c", ".items | sort_by(.n) | map(.v)", "data.json"], _text,
         needs=("jq",), quick=True),
    Case("sed -i", [SH, "-c", "sed -i 's/TODO/DONE/' notes.txt && cat notes.txt"], _text,
         quick=True),
]


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO")}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    return {**env, **extra}


def _timed(argv: list[str], cwd: Path, env: dict[str, str],
           timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return p, time.perf_counter() - t0


def missing(case: Case) -> str:
    """Why the case cannot run here, or ""."""
    gone = [n for n in case.needs if not shutil.which(n)]
    return f"not installed: {', '.join(gone)}" if gone else ""


def run_case(case: Case, root: Path, replays: int = 3) -> Outcome:
    """Native once, record once, replay ``replays`` times; the outcome."""
    out = Outcome(case.name)
    native, recorded = root / "native", root / "recorded"
    for d in (native, recorded):
        d.mkdir(parents=True)
    envs = {d: _env(case.setup(d)) for d in (native, recorded)}  # each its own dirs
    for d in (native, recorded):
        for b in case.before:
            subprocess.run(list(b), cwd=d, env=envs[d], capture_output=True, timeout=600)
    nat, out.native_s = _timed(case.argv, native, envs[native])
    env = envs[recorded]
    steno = root / "run.steno"
    rec, out.record_s = _timed([*CLI, "record", "-o", str(steno), "--", *case.argv],
                               recorded, env)
    out.status = rec.returncode
    out.outputs = [nat.stdout, rec.stdout]
    out.record_err = rec.stderr[-3000:]
    if not steno.exists():
        out.reason = "record failed: " + (rec.stderr.strip().splitlines() or ["?"])[-1]
        return out
    for a in case.after:
        subprocess.run(list(a), cwd=recorded, env=env, capture_output=True, timeout=600)
    times = []
    for _ in range(replays):
        rep, took = _timed([*CLI, "replay", str(steno)], recorded, env)
        times.append(took)
        out.replays += 1
        if rep.returncode == 0 and "bit-identical" in rep.stderr:
            out.identical += 1
        elif rep.returncode != 0 and "divergence:" in rep.stderr:
            out.reported += 1
        if rep.returncode != 0 and not out.reason:
            lines = rep.stderr.splitlines()
            at = next((i for i, ln in enumerate(lines) if "divergence:" in ln), None)
            out.reason = (" / ".join(ln.strip() for ln in lines[at:at + 3]) if at is not None
                          else rep.stderr.strip()[-300:])
    out.replay_s = statistics.median(times) if times else 0.0
    return out
