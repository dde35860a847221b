"""Another version of a package beside the virtualenv's, for tests that run a program on
it: ``pip install --target`` once into a directory under ``.venv/`` (put first on the
program's ``PYTHONPATH``), made whole under another name and renamed into place, so two
test workers never see half an install. Skips the test when pip cannot get it. The same
for a package from the npm registry (``npm_installed``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _into_place(target: Path, done: Path, argv: list[str], what: str) -> Path:
    """Run the installer ``argv`` into a fresh directory beside ``target`` (``{tmp}`` in
    argv), check ``done`` (relative) is there, and rename it into place; skip the test
    when it cannot."""
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([a.replace("{tmp}", str(tmp)) for a in argv], capture_output=True,
                       text=True, timeout=600)
    if p.returncode != 0 or not (tmp / done).is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(f"cannot install {what}: {p.stderr.strip()[-300:]}")
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another run got there first
    return target


def installed(name: str, requirement: str, module: str) -> Path:
    """``.venv/<name>`` holding ``requirement`` (its import package ``module``)."""
    target = Path(sys.prefix) / name
    if (target / module).is_dir():
        return target
    return _into_place(target, Path(module), [
        sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
        "--target", "{tmp}", requirement], requirement)


def npm_installed(name: str, package: str) -> Path:
    """``.venv/<name>`` holding ``package`` from the npm registry (``npm install
    --prefix``), made whole under another name and renamed into place. Skips the test
    when there is no npm or it cannot get the package."""
    target = Path(sys.prefix) / name
    if (target / "node_modules" / package).is_dir():
        return target
    if not shutil.which("npm") or not shutil.which("node"):
        pytest.skip("node and npm are not installed")
    return _into_place(target, Path("node_modules") / package, [
        "npm", "install", "--prefix", "{tmp}", "--no-audit", "--no-fund",
        "--loglevel=error", package], f"{package} from npm")
