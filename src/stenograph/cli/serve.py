"""``stenograph serve``: the host recorder of a store (``recorder/hostserver.py``)."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

import click


@click.command("serve")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--idle", type=click.FloatRange(0), default=0.0, show_default=True,
              help="End after this many seconds with no recording attached (0: never).")
@click.option("--ship", "ship_url", metavar="URL",
              help="Also ship the store's committed events to this postgresql:// URL, as "
                   "`stenograph ship` does, while serving.")
def serve(store: Path, idle: float, ship_url: str | None) -> None:
    """Take the events of every recording into STORE on this host, with one group
    commit for all of them: the store's one writer while it runs.

    `stenograph record --store STORE` starts one by itself (ending 30 s after its last
    recording) when none serves the store; run it yourself to keep one up (under
    systemd: examples/stenograph-serve.service). Its socket is STORE/serve.sock; only
    the store's owner (and uids or a group its config.toml names) may connect. SIGTERM
    ends it after its last sync; a recording attached to it then stops with one line,
    its trajectory resumable from its last durable event."""
    import os

    from stenograph.recorder.errors import NotAStore
    from stenograph.recorder.hostserver import HostRecorder
    from stenograph.recorder.reader import is_store

    if not is_store(store):
        raise NotAStore("not a stenograph store", str(store))
    hosts: list[HostRecorder] = []  # (the shipper is checked and connected first: a bad
    # --ship leaves no socket behind)
    shipping = (_shipper(store, ship_url, lambda: hosts[0].store.synced_lsn)
                if ship_url else None)
    try:
        host = HostRecorder(store, idle=idle or None)
    except BaseException:
        if shipping is not None:
            shipping.shipper.close()
        raise
    hosts.append(host)

    def stop(*_: Any) -> None:
        host.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    click.echo(f"stenograph: serving {store} (pid {os.getpid()})", err=True)
    try:
        if shipping is not None:
            shipping.start()
        host.serve_forever()
    finally:
        if shipping is not None:
            shipping.stop()


class _Shipping:
    """``serve --ship``: a shipper following the store on its own thread; a batch the
    warm tier refused is said in one line and tried again at the next pass."""

    def __init__(self, shipper: Any) -> None:
        import threading

        self.shipper = shipper
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steno-ship", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        self.shipper.close()

    def _run(self) -> None:
        from stenograph.recorder.errors import StenographError

        while not self._done.is_set():
            try:
                self.shipper.follow(stop=self._done.is_set)
            except StenographError as exc:
                click.echo(f"stenograph: ship: {exc}", err=True)
                self._done.wait(5.0)
                with contextlib.suppress(StenographError):
                    self.shipper.close()
                    self.shipper.connect()


def _shipper(store: Path, url: str, committed: Any) -> _Shipping:
    from stenograph.recorder.errors import BadInput
    from stenograph.warm.ship import Shipper

    if not url.startswith(("postgresql://", "postgres://")):
        raise BadInput("--ship wants a postgresql:// URL", url)
    shipper = Shipper(store, url, committed=committed)
    shipper.connect()  # (an unreachable warm tier: one line, before serving)
    return _Shipping(shipper)
