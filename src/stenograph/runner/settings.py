"""What a run under the shim is told, and where its tape directory keeps what: the one
place the parent side writes the ``STENO_*`` environment and names the files.

The shim reads these variables at start-up (``shim_c/init.c``) and hides them from the
program; the hooks ask the shim for them (``interpose/settings.py``). Each field below is
one variable, documented in ``docs/shim-protocol.md``. ``TapeFiles`` is the Python twin of
the shim's ``tape_path``: the names of the files a run's tape directory holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from stenograph.runner.pyenv import hook_env
from stenograph.runner.shim import shim_path

USER_SETTINGS = ("STENO_REDACT_", "STENO_MODEL_URLS", "STENO_EFFECT_URLS",
                 "STENO_READONLY_URLS")
"""``STENO_*`` variables a user sets for the hooks (docs/record-your-agent.md): passed on
(the shim hides them from the program like the rest) and recorded with the environment,
since they decide which calls are model calls and which are effects; every other one is
the harness's."""


def base_env() -> dict[str, str]:
    """This process's environment without the harness's own variables (a user's hook
    settings kept)."""
    return {k: v for k, v in os.environ.items()
            if (not k.startswith("STENO_") or k.startswith(USER_SETTINGS))
            and k != "LD_PRELOAD"}



STACK_LIKE = "STENO_STACK"
"""``bytes,vars``: the size of the recorded run's environment apart from ``STENO_*``
(``RunStarted.stack``), which a run from a recording matches (``launch.pad_steno_env``)."""

@dataclass
class Settings:
    """A run's ``STENO_*`` settings (``None``/``False``: not set)."""

    mode: str
    """``record`` or ``replay`` (a resume and a fork start as a replay)."""
    tape: Path | None = None
    """``STENO_TAPE``: the prepared tape (replay, resume, fork)."""
    sock: str | None = None
    """``STENO_SOCK``: the recorder's socket for the C tape."""
    pysock: str | None = None
    """``STENO_PYSOCK``: the exchange server's socket for the hooks."""
    store: Path | None = None
    """``STENO_STORE``: the store whose blob directory the hooks spill large bodies to."""
    traj: str | None = None
    """``STENO_TRAJ``: the trajectory (idempotency keys, fencing tokens)."""
    epoch: int | None = None
    """``STENO_EPOCH``: the lease epoch effects carry in their fencing token."""
    resume: bool = False
    """``STENO_RESUME``: replay the prefix, then go live and record."""
    fork: bool = False
    """``STENO_FORK``: a fork's live part (model calls and effects rerouted)."""
    build: bool = False
    """``STENO_BUILD``: a build replay (incidental channels served while they fit)."""
    edited: bool = False
    """``STENO_EDITED``: the command differs from the recorded one."""
    lenient: bool = False
    """``STENO_LENIENT``: go on with live values past a divergence."""
    asyncio: bool = False
    """``STENO_ASYNCIO``: asyncio loops on the tape (the recording's choice)."""
    authorize: bool = False
    """``STENO_AUTHORIZE``: a policy or budget: ask the recorder before each call."""
    nonet: bool = False
    """``STENO_NONET``: refuse connections that leave the host."""
    stop_at: str | None = None
    """``STENO_STOP_AT``: ``proc:pos`` of the model request a replay stops at."""
    model_url: str | None = None
    """``STENO_MODEL_URL``: where a fork's live model calls go."""
    effects_url: str | None = None
    """``STENO_EFFECTS_URL``: where a fork's live effects go."""

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` plus the shim (``LD_PRELOAD``), the hooks' ``PYTHONPATH`` and these
        settings: the environment the program starts with."""
        so = shim_path()
        env = hook_env(self.mode, base=base)
        env.update(LD_PRELOAD=so, STENO_MODE=self.mode, STENO_PROC="0", STENO_SHIM=so)
        values: dict[str, str | None] = {
            "STENO_TAPE": str(self.tape) if self.tape else None,
            "STENO_SOCK": self.sock, "STENO_PYSOCK": self.pysock,
            "STENO_STORE": str(self.store.resolve()) if self.store else None,
            "STENO_TRAJ": self.traj,
            "STENO_EPOCH": str(self.epoch) if self.epoch is not None else None,
            "STENO_STOP_AT": self.stop_at, "STENO_MODEL_URL": self.model_url,
            "STENO_EFFECTS_URL": self.effects_url,
        }
        flags = {"STENO_RESUME": self.resume, "STENO_FORK": self.fork,
                 "STENO_BUILD": self.build, "STENO_EDITED": self.edited,
                 "STENO_LENIENT": self.lenient, "STENO_ASYNCIO": self.asyncio,
                 "STENO_AUTHORIZE": self.authorize, "STENO_NONET": self.nonet}
        env.update({k: v for k, v in values.items() if v is not None})
        env.update({k: "1" for k, on in flags.items() if on})
        return env


@dataclass(frozen=True)
class TapeFiles:
    """The files of a tape directory that the parent side reads or writes (the shim's own
    per-process files, ``<proc>/<thread>.<channel>`` and ``<proc>/where``, are
    ``recorder/tape.py``'s)."""

    root: Path

    @property
    def divergence(self) -> Path:
        """The shim's report lines (``divergence``, ``drift``, ``drift-count``)."""
        return self.root / "divergence"

    @property
    def refused(self) -> Path:
        """Connections the replay refused (the shim's ``net_refused``: one line each)."""
        return self.root / "refused"

    def refused_lines(self) -> list[str]:
        """The refused connections, each once, in the order first refused."""
        try:
            lines = self.refused.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return list(dict.fromkeys(ln.rsplit(" (proc ", 1)[0] for ln in lines if ln.strip()))

    @property
    def py(self) -> Path:
        """The hooks' tape: ``py/<proc>.msgpack`` (``recorder/exchanges.prepare_py_tape``)."""
        return self.root / "py"

    @property
    def resume_plan(self) -> Path:
        """What a resumed program settles in-doubt effects with
        (``interpose/resume_plan.py``)."""
        return self.root / "py" / "resume.json"

    @property
    def attention(self) -> Path:
        """The line of an in-doubt effect that needs a person (exit 4)."""
        return self.root / "attention.json"

    @property
    def killed(self) -> Path:
        """The signal that ended the recorded run, when one did."""
        return self.root / "killed"

    @property
    def workspace(self) -> Path:
        """The restored start snapshot, one directory per root (``runner/workspace``)."""
        return self.root / "ws"

    @property
    def writes(self) -> Path:
        """A resume's overlay upper layers, put into the real roots when it ends."""
        return self.root / "writes"

    @property
    def seal_stage(self) -> Path:
        """Where the seal mounts its scratch tmpfs (``runner/seal.py``)."""
        return self.root / ".seal"

    @property
    def stop(self) -> Path:
        """``checkpoint restore --at N``: the spec in, the snapshot out
        (``interpose/stoppoint.py``)."""
        return self.root / "stop"

    @property
    def build_divergence(self) -> Path:
        return self.root / "build-divergence.jsonl"

    @property
    def build_served(self) -> Path:
        return self.root / "build-served.jsonl"
