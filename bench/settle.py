"""Settling by probe: how long a resume takes to find out by itself that a payment in
doubt was made, and to go on.

The payments agent (``tests/programs/payments_agent.py``, the official ``openai`` SDK)
pays four times through ``curl`` against the loopback effect service; the whole tree is
killed once the ``--at``-th payment is made, before its answer. Then, measured each:

* ``probe``: the policy's probe alone (``python probe.py``: a GET of the service's ledger),
  as ``sh -c`` runs it -- the peer;
* ``resume by probe``: ``stenograph resume --policy`` (the probe run by the resume, the
  payment settled done with the probe's answer, the prefix replayed, the rest live);
* ``resume settled``: the same resume after a person settled it with the same answer
  (``settle --result``): what settling by probe adds is the difference;
* ``record``: the recording up to the kill, for scale.

The least of ``--tries`` runs each; the ratio of the probe's part against running the
probe alone.

    python bench/settle.py [--at 2] [--tries 3] [--json]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from crashes import Run, go, service  # noqa: E402
from ways_out import PROBE, _script  # noqa: E402

from stenograph.testing.model_server import ModelServer  # noqa: E402

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)
AGENT = REPO / "tests" / "programs" / "payments_agent.py"


def _timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=300)
    return time.perf_counter() - t0, p.returncode


def one(at: int, work: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    (work / "probe.py").write_text(PROBE)
    current = [Run(kill=("applied", at))]
    with ModelServer(script=_script()) as model, service(current) as svc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
        env.update(OPENAI_BASE_URL=model.openai_base_url, PAY_VIA="curl")
        (work / "policy.toml").write_text(
            f'[[probe]]\nmatch = "."\ncommand = "{PY} {work / "probe.py"} {svc.url}"\n')
        policy = ["--policy", str(work / "policy.toml")]
        stores = {}
        for name in ("by-probe", "settled"):
            store = work / name
            t0 = time.perf_counter()
            current[0] = Run(kill=("applied", at))
            go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t",
                            "--workspace", "none", *policy, "--", PY, str(AGENT), svc.url],
               work, env)
            out["record"] = min(out.get("record", 1e9), time.perf_counter() - t0)
            stores[name] = store
        doc = json.loads(subprocess.run([*CLI, "status", "--json", str(stores["settled"]),
                                         "t"], capture_output=True, text=True,
                                        env=env).stdout)
        (doubt,) = [e for e in doc["effects"] if e["state"] == "in-doubt"]
        penv = {**env, "STENO_PROBE_ARGUMENTS": doubt["did"]["request"].get("body", ""),
                "STENO_PROBE_TARGET": doubt["target"]}
        out["probe"] = _timed(["/bin/sh", "-c", f"{PY} {work / 'probe.py'} {svc.url}"],
                              work, penv)[0]
        (work / "answer.json").write_text(json.dumps(svc.payments[-1]))
        subprocess.run([*CLI, "settle", str(stores["settled"]), "t", doubt["call_id"],
                        "--as", "done", "--result", str(work / "answer.json")], env=env,
                       check=True, capture_output=True)
        current[0] = Run(kill=None, resume=True)
        out["resume by probe"], rc1 = _timed([*CLI, "resume", str(stores["by-probe"]), "t",
                                              *policy], work, env)
        out["resume settled"], rc2 = _timed([*CLI, "resume", str(stores["settled"]), "t",
                                             *policy], work, env)
        if rc1 or rc2:
            raise SystemExit(f"a resume failed ({rc1}, {rc2})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--at", type=int, default=2, help="the payment killed once made")
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not shutil.which("curl"):
        raise SystemExit("curl is not installed")
    best: dict[str, float] = {}
    for _ in range(args.tries):
        work = Path(tempfile.mkdtemp(prefix="steno-bench-settle-"))
        try:
            for k, v in one(args.at, work).items():
                best[k] = min(best.get(k, 1e9), v)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    added = best["resume by probe"] - best["resume settled"]
    doc: dict[str, Any] = {k: round(v, 3) for k, v in best.items()}
    doc["probe part"] = round(added, 3)
    doc["probe part / probe alone"] = round(added / best["probe"], 2)
    if args.json:
        print(json.dumps(doc))
        return
    print(f"settle by probe (curl payments agent, killed once payment {args.at} was made; "
          f"least of {args.tries})")
    for k, v in doc.items():
        print(f"  {k:<26} {v}{'' if '/' in k else ' s'}")


if __name__ == "__main__":
    main()
