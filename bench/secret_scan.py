"""What masking secrets costs a snapshot: a 10,000-file text workspace, with and without.

The workspace is ``--files`` text files in 100 directories, made from this repository's
own Python sources cut into 1-4 KiB pieces (text a coding agent's workspace holds), plus
a ``.env``, a PEM key and a config with a token among them. Each way takes the first
snapshot of it into a fresh blob directory (every file read, hashed and stored: the most
a checkpoint ever costs); median of ``--repeat`` runs, after an ``os.sync`` each:

* ``plain``: ``Snapshotter`` without secret rules (the peer: what a snapshot cost before);
* ``masked``: with the rules the recorder uses (secret files by name, every text file
  scanned for the maintained key shapes and secret-named assignments).

Then one incremental snapshot after 1 % of the files changed, both ways.

    python bench/secret_scan.py [--files 10000] [--repeat 3] [--json]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.keyshapes import KeyShapes, maintained
from stenograph.recorder.secretfiles import SecretRules
from stenograph.recorder.snapshots import Snapshotter

ROOT = Path(__file__).resolve().parent.parent


def make_workspace(work: Path, files: int, rng: random.Random) -> int:
    corpus = b"\n".join(p.read_bytes() for p in sorted((ROOT / "src").rglob("*.py")))
    total = 0
    for i in range(files):
        d = work / f"d{i % 100:02d}"
        d.mkdir(parents=True, exist_ok=True)
        size = rng.randint(1024, 4096)
        at = rng.randrange(0, len(corpus) - size)
        data = corpus[at:at + size]
        (d / f"f{i:05d}.py").write_bytes(data)
        total += len(data)
    (work / ".env").write_text("STRIPE_SECRET_KEY=sk_live_51HxYzAbCdEfGhIjKlMnOpQr\n"
                               "DB_PASSWORD=Tr0ub4dor&3-horse-battery\n")
    (work / "deploy.pem").write_text("-----BEGIN RSA PRIVATE KEY-----\n"
                                     + "MIIEowIBAAKCAQEA7x" * 4 + "\n"
                                     "-----END RSA PRIVATE KEY-----\n")
    (work / "d00" / "settings.yaml").write_text(
        "upstream_token: ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5\n")
    return total


def take(work: Path, blobs_dir: Path, secrets: SecretRules | None) -> tuple[float, Any]:
    os.sync()
    snap = Snapshotter(BlobStore(blobs_dir), [str(work)], secrets=secrets)
    t0 = time.perf_counter()
    snap.take()
    return time.perf_counter() - t0, snap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rng = random.Random(7)
    rules = SecretRules(shapes=KeyShapes(maintained()))
    out: dict[str, Any] = {"files": a.files}
    with tempfile.TemporaryDirectory(prefix="steno-bench-secrets-") as tmp:
        work = Path(tmp) / "ws"
        out["bytes"] = make_workspace(work, a.files, rng)
        times: dict[str, list[float]] = {"plain": [], "masked": []}
        masked_files = 0
        for r in range(a.repeat):
            for way, secrets in (("plain", None), ("masked", rules)):
                dt, snap = take(work, Path(tmp) / f"blobs-{way}-{r}", secrets)
                times[way].append(dt)
                if secrets is not None:
                    masked_files = len(snap.redacted)
        for way in times:
            out[f"first_{way}_s"] = round(statistics.median(times[way]), 3)
        out["first_ratio"] = round(out["first_masked_s"] / out["first_plain_s"], 2)
        out["masked_files"] = masked_files
        incr: dict[str, float] = {}
        snaps = {way: Snapshotter(BlobStore(Path(tmp) / f"blobs-i-{way}"), [str(work)],
                                  secrets=secrets)
                 for way, secrets in (("plain", None), ("masked", rules))}
        for s in snaps.values():
            s.take()
        paths = sorted(work.rglob("*.py"))
        for p in rng.sample(paths, max(1, len(paths) // 100)):
            p.write_bytes(p.read_bytes()[::-1])
        for way, s in snaps.items():
            os.sync()
            t0 = time.perf_counter()
            s.take()
            incr[way] = time.perf_counter() - t0
        out["incremental_plain_s"] = round(incr["plain"], 3)
        out["incremental_masked_s"] = round(incr["masked"], 3)
        out["incremental_ratio"] = round(incr["masked"] / incr["plain"], 2)
    if a.json:
        print(json.dumps(out))
        return
    print(f"secret scan: {out['files']} files, {out['bytes'] / 2**20:.1f} MiB; "
          f"{out['masked_files']} stored masked")
    print(f"  first snapshot:   plain {out['first_plain_s']:.3f} s, masked "
          f"{out['first_masked_s']:.3f} s ({out['first_ratio']}x plain)")
    print(f"  1 % changed:      plain {out['incremental_plain_s']:.3f} s, masked "
          f"{out['incremental_masked_s']:.3f} s ({out['incremental_ratio']}x plain)")


if __name__ == "__main__":
    main()
