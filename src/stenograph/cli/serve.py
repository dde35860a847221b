"""``stenograph serve``: the host recorder of a store (``recorder/hostserver.py``)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click


@click.command("serve")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--idle", type=click.FloatRange(0), default=0.0, show_default=True,
              help="End after this many seconds with no recording attached (0: never).")
def serve(store: Path, idle: float) -> None:
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
    host = HostRecorder(store, idle=idle or None)

    def stop(*_: Any) -> None:
        host.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    click.echo(f"stenograph: serving {store} (pid {os.getpid()})", err=True)
    host.serve_forever()
