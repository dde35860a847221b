"""What sealing a replay costs, by the way it is sealed: root's mount namespace, a user's
own user namespace, and unsealed (the peer: the same replay with no namespace at all).

``/bin/true`` recorded in a workspace of ``--files`` small files, then replayed through
the real CLI: as root sealed (``mount-namespace``) and ``--unsealed``; as ``nobody`` with
stenograph from ``.venv-user`` (``make test`` builds it) sealed (``user-namespace``) and
``--unsealed``. Then the demo agent (``examples/agent.py``, the official openai SDK,
against the loopback model server) recorded and replayed the same four ways (as nobody
only when ``.venv-user`` has ``openai``: ``make bench`` installs it). Each also sealed by
the shim's path mapping (``STENOGRAPH_SEAL=path-map``: what a user gets where no user
namespace can be made). Median of ``--repeat`` wall times each.

    python bench/seal.py [--json] [--files 1000] [--repeat 5]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
USER_PY = ROOT / ".venv-user" / "bin" / "python"
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def _tree(root: Path, n: int) -> None:
    rng = random.Random(3)
    for i in range(n):
        p = root / f"d{i % 10}" / f"f{i:05d}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randint(1024, 4096)))


def _median_wall(argv: list[str], cwd: Path, env: dict[str, str], repeat: int) -> float:
    """The median wall time; NaN when a replay is not bit-identical (an unsealed replay
    reads today's files, which the recording may have changed): no figure for it."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        if p.returncode == 1 and "--unsealed" in argv:
            return float("nan")
        if p.returncode != 0:
            raise SystemExit(f"bench/seal.py: {' '.join(argv)} exited {p.returncode}: "
                             f"{p.stderr[-2000:]}")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _ways(py_root: str, cwd: Path, env: dict[str, str], steno_root: Path, steno_user: Path,
          repeat: int, user: bool) -> dict[str, float]:
    out = {
        "root_sealed_s": _median_wall([py_root, "-m", "stenograph", "replay", str(steno_root)],
                                      cwd, env, repeat),
        "root_unsealed_s": _median_wall([py_root, "-m", "stenograph", "replay", "--unsealed",
                                         str(steno_root)], cwd, env, repeat),
    }
    pm_env = {**env, "STENOGRAPH_SEAL": "path-map"}
    out["root_pathmap_s"] = _median_wall([py_root, "-m", "stenograph", "replay",
                                          str(steno_root)], cwd, pm_env, repeat)
    if user:
        cli = [*AS_NOBODY, str(USER_PY), "-m", "stenograph", "replay"]
        out["user_sealed_s"] = _median_wall([*cli, str(steno_user)], cwd, env, repeat)
        out["user_pathmap_s"] = _median_wall([*cli, str(steno_user)], cwd, pm_env, repeat)
        out["user_unsealed_s"] = _median_wall([*cli, "--unsealed", str(steno_user)], cwd, env,
                                              repeat)
    for who in ("root", "user"):
        if f"{who}_sealed_s" in out:
            out[f"{who}_sealed_x_unsealed"] = round(
                out[f"{who}_sealed_s"] / out[f"{who}_unsealed_s"], 3)
            out[f"{who}_pathmap_x_unsealed"] = round(
                out[f"{who}_pathmap_s"] / out[f"{who}_unsealed_s"], 3)
    return out


def _record(py: str, argv: list[str], out: Path, cwd: Path, env: dict[str, str],
            nobody: bool) -> None:
    cmd = [py, "-m", "stenograph", "record", "-o", str(out), "--", *argv]
    subprocess.run([*AS_NOBODY, *cmd] if nobody else cmd, cwd=cwd, env=env, check=True,
                   capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    user = os.geteuid() == 0 and USER_PY.exists() and shutil.which("setpriv") is not None
    base = Path(tempfile.mkdtemp(prefix="steno-seal-", dir="/tmp"))
    base.chmod(0o755)
    nobody = pwd.getpwnam("nobody")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "LANG": "C.UTF-8"}
    res: dict[str, dict[str, float]] = {}
    server = None
    try:
        ws = base / "ws"
        _tree(ws, a.files)
        for p in [base, *ws.rglob("*")]:
            os.chown(p, nobody.pw_uid, nobody.pw_gid)
        _record(sys.executable, ["/bin/true"], base / "true-root.steno", ws, env, False)
        if user:
            _record(str(USER_PY), ["/bin/true"], base / "true-user.steno", ws, env, True)
        res["true"] = _ways(sys.executable, ws, env, base / "true-root.steno",
                            base / "true-user.steno", a.repeat, user)
        port_file = base / "port"
        server = subprocess.Popen([sys.executable, "-m", "stenograph.testing.model_server",
                                   "--port", "0", "--script",
                                   str(ROOT / "examples" / "agent_script.json"),
                                   "--port-file", str(port_file)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not port_file.exists() or not port_file.read_text().strip():
            time.sleep(0.05)
        demo = base / "demo"
        shutil.copytree(ROOT / "examples", demo)
        for p in [demo, *demo.rglob("*")]:
            os.chown(p, nobody.pw_uid, nobody.pw_gid)
        denv = {**env, "OPENAI_BASE_URL": f"http://127.0.0.1:{port_file.read_text().strip()}/v1",
                "OPENAI_API_KEY": "sk-bench-not-a-key"}
        agent = ["agent.py"]
        _record(sys.executable, [sys.executable, *agent], base / "demo-root.steno", demo,
                denv, False)
        demo_user = user and subprocess.run([str(USER_PY), "-c", "import openai"],
                                            capture_output=True).returncode == 0
        if demo_user:
            _record(str(USER_PY), [str(USER_PY), *agent], base / "demo-user.steno", demo,
                    denv, True)
        res["demo_agent"] = _ways(sys.executable, demo, env, base / "demo-root.steno",
                                  base / "demo-user.steno", a.repeat, demo_user)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        shutil.rmtree(base, ignore_errors=True)
    if a.json:
        print(json.dumps(res))
        return
    for name, r in res.items():
        line = (f"{name:10s} root: sealed {r['root_sealed_s'] * 1e3:.0f} ms, unsealed "
                f"{r['root_unsealed_s'] * 1e3:.0f} ms ({r['root_sealed_x_unsealed']}x), "
                f"path-map {r['root_pathmap_s'] * 1e3:.0f} ms ({r['root_pathmap_x_unsealed']}x)")
        if "user_sealed_s" in r:
            line += (f"; user: sealed {r['user_sealed_s'] * 1e3:.0f} ms, unsealed "
                     f"{r['user_unsealed_s'] * 1e3:.0f} ms ({r['user_sealed_x_unsealed']}x), "
                     f"path-map {r['user_pathmap_s'] * 1e3:.0f} ms "
                     f"({r['user_pathmap_x_unsealed']}x)")
        else:
            line += "; user: not measured (no .venv-user, setpriv or openai there)"
        print(line)


if __name__ == "__main__":
    main()
