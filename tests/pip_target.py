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


def installed(name: str, requirement: str, module: str) -> Path:
    """``.venv/<name>`` holding ``requirement`` (its import package ``module``)."""
    target = Path(sys.prefix) / name
    if (target / module).is_dir():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", "--target", str(tmp), requirement],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0 or not (tmp / module).is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(f"cannot install {requirement}: {p.stderr.strip()[-300:]}")
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another run got there first
    return target


def npm_installed(name: str, package: str) -> Path:
    """``.venv/<name>`` holding ``package`` from the npm registry (``npm install
    --prefix``), made whole under another name and renamed into place. Skips the test
    when there is no npm or it cannot get the package."""
    target = Path(sys.prefix) / name
    if (target / "node_modules" / package).is_dir():
        return target
    if not shutil.which("npm") or not shutil.which("node"):
        pytest.skip("node and npm are not installed")
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["npm", "install", "--prefix", str(tmp), "--no-audit", "--no-fund",
                        "--loglevel=error", package], capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0 or not (tmp / "node_modules" / package).is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(f"cannot install {package} from npm: {p.stderr.strip()[-300:]}")
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another run got there first
    return target

