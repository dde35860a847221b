"""This process's tape for the channels Python code reaches: ``http``, ``model``, ``tool``.

The C shim tapes what libc sees; this module tapes what the Python-level hooks
(HTTP transports, ``stenograph.model`` / ``stenograph.tool``) see. Every entry
belongs to a stream (process path, channel) and has a position in it, assigned
when the call *starts*, so concurrent calls get the positions of their start
order.

Record: each finished entry is sent to the recorder over a unix
``SOCK_SEQPACKET`` socket (``STENO_PYSOCK``) as one msgpack message; the
recorder appends it as an ``Exchange`` event and acknowledges once it is durable,
so a call's result is in the log before the program acts on it. Bodies larger
than ``SPILL`` bytes go to the store's blob directory first (content-addressed,
atomic, safe beside the recorder), keeping messages small. On a full disk a body
the blob store cannot take stays inline; one that then makes the message larger
than ``MAX_MESSAGE`` is replaced by a marker, ``{"lost": "body", "bytes": n,
"sha256": hex, ...}``: the call is recorded without it, and a replay that needs it
reports so (a lost request body does not stop a replay: calls match on a
fingerprint taken before). An entry the recorder cannot store is answered ``NACK``
and counted (``lost``); the program never sees any of this.

Replay: the recorder writes ``STENO_TAPE/py/<proc>.msgpack``: for each channel,
the recorded entries in position order. A call is served the entry at the head of
its stream if the request fingerprint matches; a match a few entries later is
taken too (concurrent calls may start in another order); anything else is a
divergence, reported with a diff against the nearest candidate.

While a hook works (its own I/O, and in record mode the real network call), it
pauses the C shim's tape for this thread: in replay those calls do not happen at
all, so they must not be on the tape either.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import hashlib
import importlib
import json
import os
import socket
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from stenograph.interpose import gcpoints, resume_plan, stoppoint
from stenograph.interpose.exits import diverged
from stenograph.interpose.fingerprint import distance, json_diff, request_diff, request_json
from stenograph.interpose.incidental import (
    Incidentals,
    differences,
    incidental_only,
    request_text,
)
from stenograph.interpose.redact import RedactionRules
from stenograph.interpose.settings import getenv, shim_proc
from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.exchanges import is_lost_body

IN_DECLARED_EFFECT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "stenograph_in_declared_effect", default=False)
"""Inside a declared effect tool's run (or its probe): the HTTP calls it makes are its
implementation, covered by the tool's own intent, not effects of their own."""

SCOPE: contextvars.ContextVar[str] = contextvars.ContextVar("stenograph_scope", default="")
"""The hooked call whose own code is running (``"tool/0"``, ``"tool/0/model/1"``): a
``stenograph.tool``/``model`` body, a tool's probe, an approval's precondition. Calls made
inside it are numbered in streams of their own (``tool/0/http``), so a replay or a resume
that serves the outer call without running its body numbers every later call as the
recording did. A context variable: an asyncio task started inside inherits it, a
concurrent task does not."""


@dataclass(frozen=True)
class Slot:
    """A call's place on its process's Python tape: the stream (its channel, prefixed by
    the scope it was made in) and its position there, claimed when the call starts."""

    stream: str
    pos: int

    @property
    def nested(self) -> bool:
        """Made inside another hooked call's body (a replay that serves that call never
        makes this one)."""
        return "/" in self.stream

    @property
    def channel(self) -> str:
        """The kind of call (``http``, ``model``, ``tool``...), without its scope."""
        return self.stream.rpartition("/")[2]

    def call_id(self, proc: str) -> str:
        from stenograph.recorder.effects import call_id

        return call_id(proc, self.stream, self.pos)

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """The calls made in this block are this call's own (numbered under it)."""
        token = SCOPE.set(f"{self.stream}/{self.pos}")
        try:
            yield
        finally:
            SCOPE.reset(token)

SPILL = 32 << 10
INTENT_BODY = 4 << 10
"""An effect's body up to this size is in its intent; a larger one by its sha256."""
MAX_MESSAGE = 1 << 20
"""The largest message the recorder takes (``recorder.exchanges.MAX_MESSAGE``)."""
MATCH_WINDOW = 16


class _ShimControl:
    """Pause/resume the C shim's tape for this thread, if the shim is loaded.

    With ``track`` set (record), modules first imported while paused are noted in
    ``imported``: they are imported by the real network call (``encodings.idna`` for a
    host name, an async backend on the first connection...), which replay never makes.
    Their imports list directories and fill the import system's caches off the tape, so
    replay must import the same modules at the same point, paused too, or every later
    import lists directories the recording did not (see ``PyTape.take``).
    """

    def __init__(self) -> None:
        self._pause: Any = None
        self._resume: Any = None
        self._ended: Any = None
        self._go_live: Any = None
        self._is_live: Any = None
        self._park_live: Any = None
        self._seeds: Any = None
        self._tree_peer: Any = None
        self.track = False
        self.imported: list[str] = []
        self._local = threading.local()
        try:
            me = ctypes.CDLL(None)
            self._pause = me.steno_pause
            self._resume = me.steno_resume
            self._ended = me.steno_tape_ended
            self._go_live = me.steno_go_live
            self._is_live = me.steno_is_live
            self._park_live = me.steno_park_live
            self._seeds = me.steno_paused_seeds
            self._tree_peer = me.steno_tree_peer
            self._tree_peer.argtypes = [ctypes.c_char_p, ctypes.c_int]
        except (OSError, AttributeError):
            pass

    def tree_peer(self, host: str, port: int) -> bool:
        """Is ``host:port`` a server a process of the recorded tree bound? Asked with the
        tape running: the answer is taped (the shim's ``steno_tree_peer``)."""
        if self._tree_peer is None:
            return False
        return bool(self._tree_peer(host.encode("ascii", "replace")[:63], port))

    def go_live(self) -> None:
        """Resume: the process leaves the recorded prefix and records from here."""
        if self._go_live is not None:
            self._go_live()

    def park_live(self) -> None:
        """Fork: the process goes live once every taped thread reached its prefix's end."""
        if self._park_live is not None:
            self._park_live()
        elif self._go_live is not None:
            self._go_live()

    def is_live(self) -> bool:
        """Resume: has the C tape of this process gone live (its streams ran out)?"""
        return bool(self._is_live()) if self._is_live is not None else False

    def tape_ended(self) -> None:
        """A stream ran out where the program asks for more. If the recorded run was
        killed there, the process ends as it did (the shim's ``await_kill``: it does
        not return); else this returns and the caller reports the divergence."""
        if self._ended is not None:
            self._ended()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        if self._pause is None:
            yield
            return
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0 and self.track:
            self._local.mark = len(sys.modules)
            self._local.seeds = self._seeds() if self._seeds is not None else 0
        self._pause()
        try:
            yield
        finally:
            if depth == 0 and self.track:
                self.collect()
                self._local.mark = None
            self._local.depth = depth
            self._resume()

    def active(self) -> bool:
        """Is this thread inside ``paused()``?"""
        return getattr(self._local, "depth", 0) > 0

    def collect(self) -> None:
        """Note the modules imported since this thread's outermost pause began (and
        whether OpenSSL seeded its generator meanwhile: ``SEED_OPENSSL``)."""
        mark = getattr(self._local, "mark", None)
        if mark is None:
            return
        n = len(sys.modules)
        if n > mark:
            self.imported.extend(list(sys.modules)[mark:n])
        self._local.mark = n
        if self._seeds is not None:
            seeds = self._seeds()
            if seeds > getattr(self._local, "seeds", seeds) and \
                    SEED_OPENSSL not in self.imported:
                self.imported.append(SEED_OPENSSL)
            self._local.seeds = seeds


SEED_OPENSSL = "<stenograph:seed-openssl>"
"""In an entry's ``imports``: the recorded call's paused work seeded OpenSSL's generator
(``steno_paused_seeds``); replay does it there too, so the seeding is off the tape in
both runs instead of moving to the next unpaused use of OpenSSL."""


def _import_all(names: list[str]) -> None:
    for name in names:
        if name == SEED_OPENSSL:
            with contextlib.suppress(Exception):
                importlib.import_module("ssl").RAND_status()
        elif name not in sys.modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


class PyTape:
    """The Python-level tape of this process (one per process; see ``current``)."""

    def __init__(self, mode: str, proc: str, *, sock_path: str | None = None,
                 tape_dir: str | None = None, store_dir: str | None = None,
                 lenient: bool = False) -> None:
        self.mode = mode
        self.proc = proc
        self.lenient = lenient
        self.rules = RedactionRules.from_env()
        self.shim = _ShimControl()
        self._stop_at = stoppoint.parse(getenv("STENO_STOP_AT")) if mode == "replay" else None
        self.shim.track = mode == "record"
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}
        self._seen: Counter[tuple[str, str]] = Counter()
        self._sock_path = sock_path
        self._sock: socket.socket | None = None
        self.lost = 0  # entries the recorder did not take (record): see commit
        self._broken = False  # the recorder is gone: send nothing more
        self._blobs = BlobStore(Path(store_dir) / "blobs") if store_dir else None
        self._tape_dir = Path(tape_dir) if tape_dir else None
        self._streams: dict[str, list[dict[str, Any]]] | None = None
        self._used: dict[str, set[int]] = {}
        self.traj = getenv("STENO_TRAJ") or ""
        self.epoch = int(getenv("STENO_EPOCH") or 0)
        self.effect_urls = getenv("STENO_EFFECT_URLS") or ""
        self.readonly_urls = getenv("STENO_READONLY_URLS") or ""
        self.resuming = getenv("STENO_RESUME") == "1"
        self.fork = getenv("STENO_FORK") == "1"
        """``stenograph fork``: past the prefix, model calls and effects are rerouted."""
        self.model_url = getenv("STENO_MODEL_URL") or None
        self.effects_url = getenv("STENO_EFFECTS_URL") or None
        self.authorizing = getenv("STENO_AUTHORIZE") == "1"
        """``--policy`` or a budget: every model call and effect is authorized first."""
        """``stenograph resume``: replay while the recorded calls last, then record."""
        self.build = mode == "replay" and getenv("STENO_BUILD") == "1"
        """``replay --build``: requests match with their incidental values masked."""
        self._incidentals: Incidentals | None = None
        self._texts: dict[tuple[str, int], str] = {}
        self._turns = 0
        self._settle: resume_plan.Settlement | None = None
        os.register_at_fork(after_in_child=self._after_fork)

    # -- common ---------------------------------------------------------------------

    def begin(self, channel: str) -> Slot:
        """Claim the next position of ``channel``, in the current scope (``SCOPE``), for a
        call that starts now. Resuming, a call past the recorded ones (or one made once
        the C tape has run out) is where the prefix ends: the process goes live and this
        call is made for real."""
        scope = SCOPE.get()
        stream = f"{scope}/{channel}" if scope else channel
        with self._lock:
            pos = self._next.get(stream, 0)
            self._next[stream] = pos + 1
        if self.resuming and self.mode == "replay" and (
                pos >= len(self._load().get(stream, [])) or self.shim.is_live()):
            self.go_live(park=self.fork)
        if not scope:  # inside a body the tape is paused and replay never gets there
            gcpoints.at_exchange(self.shim)
        return Slot(stream, pos)

    def occurrence(self, slot: Slot, fp: str) -> int:
        """How many calls of this process before this one asked exactly this (same stream,
        same request fingerprint). Counted in every mode, served calls too, so a resume
        counts what its recording counted: part of an intent's identity
        (``effects.idempotency_key``)."""
        with self._lock:
            n = self._seen[(slot.stream, fp)]
            self._seen[(slot.stream, fp)] = n + 1
        return n

    def resumed_entry(self, slot: Slot, fp: str) -> dict[str, Any] | None:
        """Resuming, live: a call the crashed run's prefix has an entry for (same place,
        same request) is served that entry, not made: what it did is durable, and is not
        done twice. Two ways to get here live: a call inside a body that runs again (the
        crash came before the outer call's result), and a call the process reached after
        its C tape ran out -- a SIGKILL loses the tape's unflushed tail, so a prefix can
        end before a call whose entry (an answer, or a person's settlement) is in the log."""
        if not (self.resuming and self.mode == "record"):
            return None
        return self.recorded(slot.stream, slot.pos, fp)

    def follow_shim(self) -> bool:
        """Resuming: if the C tape has gone live (a stream ran out), so does this one.
        Whether this process records now."""
        if self.resuming and self.mode == "replay" and self.shim.is_live():
            self.go_live()
        return self.mode == "record"

    def go_live(self, park: bool = False) -> None:
        """The end of a resumed prefix: from here this process records (``live.c``).
        ``park`` (a fork): once the other threads reached the ends of their prefixes."""
        if park and self.mode == "replay":
            self.shim.park_live()
        with self._lock:
            if self.mode != "replay":
                return
            self.shim.go_live()
            self.mode = "record"
            self.shim.track = True

    def settlement(self) -> resume_plan.Settlement:
        """How ``stenograph resume`` settles the effects it found in doubt."""
        if self._settle is None:
            self._settle = resume_plan.Settlement.load(self._tape_dir)
        return self._settle

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._sock = None
        self._broken = False
        proc = shim_proc()
        if proc:
            self.proc = proc
        self._next = {}
        self._seen = Counter()
        self._streams = None  # the parent's entries are not this process's
        self._used = {}

    # -- record -------------------------------------------------------------------------

    def spill(self, data: bytes) -> bytes | dict[str, Any]:
        """Keep small bodies inline; put large ones (scrubbed) in the blob store. A body
        the blob store cannot take (a full disk) stays inline: the recording must never
        be why the program's own request fails."""
        self.rules.learn_shapes(data)
        data = self.rules.scrub(data)
        if len(data) <= SPILL or self._blobs is None:
            return data
        try:
            return self._blobs.put(data).to_body()
        except OSError:
            return data

    def commit(self, channel: str, pos: int, entry: dict[str, Any]) -> None:
        """Send a finished entry to the recorder; return once it is durable.

        Whatever goes wrong on the way (a full disk, the recorder gone) is the
        recording's failure, never the program's: nothing is raised into the program's
        call. The entry is then missing from the recording (``lost`` counts it; the
        recorder counts the ones it refused, for the run's report), and a replay stops
        there with a divergence. Once the recorder is gone nothing more is sent."""
        if self._broken:
            self.lost += 1
            return
        try:
            self._commit(channel, pos, entry)
        except _Refused:
            self.lost += 1
        except (OSError, RuntimeError, ValueError):
            self.lost += 1
            self._broken = True

    def _commit(self, channel: str, pos: int, entry: dict[str, Any]) -> None:
        try:
            entry = self.rules.response(entry, self._blobs)
        except OSError as exc:  # the blob store is full: this entry is lost, not the next
            raise _Refused(str(exc)) from None
        self.rules.learn_shapes(entry)  # a key in a response: scrubbed like any other
        entry = _fit_scrubbed(self.rules.scrub(entry))
        with self._lock:
            self.shim.collect()
            # a call inside a body keeps its imports for the outer call's entry: a replay
            # that serves the outer call never gets to this one
            if self.shim.imported and "/" not in channel:
                entry = {**entry, "imports": self.shim.imported[:]}
                self.shim.imported.clear()
        entry = {"proc": self.proc, "channel": channel, "pos": pos, **entry}
        self._send(entry)

    def intent(self, channel: str, pos: int, target: str, body: bytes | Any,
               key: str | None, fingerprint: str | None = None,
               extra: dict[str, Any] | None = None) -> bool:
        """Make an effect's intent durable before it is dispatched: the recorder drains
        every ring of the tree, appends ``ToolIntent`` and answers once its sync returned
        (so everything taped before it is durable too). False if it could not be made
        durable: the effect must not be sent."""
        if self._broken or self.mode != "record":
            return False
        from stenograph.recorder.effects import call_id

        if isinstance(body, bytes) and len(body) > INTENT_BODY:
            # the result's entry has the body; the intent only has to name it, and stay
            # small enough to go in when little room is left
            body = {"sha256": hashlib.sha256(self.rules.scrub(body)).hexdigest(),
                    "bytes": len(body)}
        record = {"kind": "ToolIntent", "call_id": call_id(self.proc, channel, pos),
                  "proc": self.proc, "channel": channel, "pos": pos, "target": target,
                  "body": self.rules.scrub(body), "idempotency_key": key,
                  "epoch": self.epoch, "fingerprint": fingerprint, **(extra or {})}
        try:
            self._send(record)
        except (_Refused, OSError, RuntimeError, ValueError):
            return False
        return True

    def authorize(self, call_id: str, target: str, channel: str) -> dict[str, Any]:
        """The recorder's decision on a call about to be made (``recorder/policy.py``):
        ``{"decision": allow | deny | hold | stop, "reason", "summary"...}``, its
        ``Authorized`` event appended before the answer. Without a policy or budget:
        allow, no round trip. A recorder that cannot be asked: deny (a gate that opens
        when its keeper is gone is no gate)."""
        if not self.authorizing or self.mode != "record":
            return {"decision": "allow"}
        msg = msgpack.packb({"kind": "Authorize", "call_id": call_id, "target": target,
                             "channel": channel}, use_bin_type=True)
        try:
            with self._lock:
                self._connect()
                assert self._sock is not None
                self._sock.sendall(msg)
                answer = self._sock.recv(1 << 16)
            doc = msgpack.unpackb(answer, raw=False)
        except (OSError, ValueError, msgpack.UnpackException):
            return {"decision": "deny", "reason": "the recorder could not be asked"}
        return doc if isinstance(doc, dict) else {"decision": "deny", "reason": "no answer"}

    def _connect(self) -> None:
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with contextlib.suppress(OSError):  # a message may be up to MAX_MESSAGE
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE + (64 << 10))
            s.connect(self._sock_path or "")
            self._sock = s

    def notify(self, record: dict[str, Any]) -> bool:
        """A harness event (``{"kind": ...}``: an approval request) made durable by the
        recorder before this returns True; False if it could not be."""
        if self._broken or self.mode != "record":
            return False
        try:
            self._send(record)
        except (_Refused, OSError, RuntimeError, ValueError):
            return False
        return True

    def mark_turn(self, channel: str, pos: int, fingerprint: str) -> None:
        """Record: a model call is about to be made. The recorder drains every ring and
        appends a ``ContextBuilt`` marker, so the log has a point where the tape is
        consistent at the start of each turn: a fork at that turn (and a resume of a run
        that crashed during the call) cuts there. What it cannot send is not missed:
        the cut then falls on the call before."""
        if self.mode == "record":
            self.notify({"kind": "ContextBuilt", "proc": self.proc, "channel": channel,
                         "pos": pos, "fingerprint": fingerprint})

    def _send(self, entry: dict[str, Any]) -> None:
        """One message to the recorder; return once it answered that it is durable."""
        msg = msgpack.packb(entry, use_bin_type=True)
        if len(msg) > MAX_MESSAGE:
            msg = _without_big_bodies(entry)
        with self._lock:
            self._connect()
            assert self._sock is not None
            try:
                self._sock.sendall(msg)
            except OSError as exc:  # the kernel's limit is lower than ours here
                if exc.errno != errno.EMSGSIZE:
                    raise
                self._sock.sendall(_without_big_bodies(entry, limit=0))
            ack = self._sock.recv(16)
        if not ack:
            raise RuntimeError("stenograph recorder closed the exchange socket")
        if ack != b"\x01":
            raise _Refused("the recorder could not store the entry")

    # -- replay -------------------------------------------------------------------------

    def _load(self) -> dict[str, list[dict[str, Any]]]:
        """Read this process's entries on first use, not at start-up: unpacking allocates,
        and with ASLR off the program's own allocations must land where they did when it
        was recorded (``id()``, set order of objects hashed by address)."""
        if self._streams is None:
            assert self._tape_dir is not None
            path = self._tape_dir / "py" / f"{self.proc}.msgpack"
            self._streams = (msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
                             if path.exists() else {})
        return self._streams

    def streams(self) -> set[str]:
        """Replay: the names of this process's recorded streams."""
        return set(self._load()) if self._tape_dir is not None else set()

    def recorded(self, channel: str, pos: int, fp: str) -> dict[str, Any] | None:
        """Resuming: the prefix's entry for this call, if it has one with this fingerprint."""
        if self._tape_dir is None:
            return None
        for entry in self._load().get(channel, []):
            if entry.get("pos") == pos and entry.get("fingerprint") == fp:
                return entry
        return None

    def resolve(self, value: Any) -> bytes:
        """Inline bytes, or the bytes of a blob reference (replay prepared them). A body
        recorded only as a marker (see ``_without_big_bodies``) is a divergence."""
        if isinstance(value, bytes):
            return value
        if is_lost_body(value):
            self.diverge(str(value.get("channel", "http")), int(value.get("pos", -1)), [
                f"{value.get('channel', 'http')} call #{value.get('pos', '?')} in process "
                f"{self.proc}: its body ({value.get('bytes')} bytes, sha256 "
                f"{str(value.get('sha256'))[:16]}...) was not recorded: the disk was full "
                "and it was too large to keep in the log"])
            return b""
        ref = BlobRef.from_body(value)
        assert self._tape_dir is not None
        return BlobStore(self._tape_dir / "blobs").get(ref)

    def take(self, channel: str, pos: int, request: dict[str, Any], fp: str) -> dict[str, Any]:
        """The recorded entry that answers ``request`` (or a divergence)."""
        if channel == "model" and self._stop_at == (self.proc, pos) and self._tape_dir:
            stoppoint.stop_here(str(self._tape_dir), self.shim)
        stream = self._load().get(channel, [])
        with self._lock:
            used = self._used.setdefault(channel, set())
            free = [i for i in range(len(stream)) if i not in used][:MATCH_WINDOW]
            found = next((i for i in free if stream[i].get("fingerprint") == fp), None)
            if found is None and self.build:
                found = self._masked_match(channel, stream, free, request)
            if found is not None:
                used.add(found)
        if found is not None:
            self._served(channel, stream[found])
            _import_all(stream[found].get("imports") or [])
            return stream[found]
        nearest = None
        if free:
            nearest = min(free, key=lambda i: distance(self._req_of(stream[i]), request))
        elif not self.lenient:
            self.shim.tape_ended()  # a killed recording ends here, as the C tape does
        lines = [f"{channel} call #{pos} in process {self.proc}: "
                 + ("no recorded call left" if nearest is None else "request differs")]
        lines.append(f"asked:    {request['method']} {request['url']}")
        if nearest is not None:
            rec = self._req_of(stream[nearest])
            lines.append(f"nearest recorded (#{stream[nearest]['pos']}): "
                         f"{rec['method']} {rec['url']}")
            lines.extend("  " + d for d in request_diff(rec, request))
            doubt = self.settlement().drift.get("in_doubt_tools") if self.resuming else None
            if doubt and channel == "model" and any("body $.tools" in ln for ln in lines):
                lines.insert(0, f"the tool schemas changed since the crash, and "
                                f"{', '.join(doubt)} has an effect in doubt: refusing to "
                                "resume (its recorded arguments would mean something else)")
        if self.build:
            self._build_divergence(channel, pos, request, stream, nearest)
        self.diverge(channel, pos, lines)
        if nearest is None:
            raise ReplayExhausted("\n".join(lines))
        with self._lock:
            self._used[channel].add(nearest)
        _import_all(stream[nearest].get("imports") or [])
        return stream[nearest]

    # -- build replay -----------------------------------------------------------------

    def _masked_match(self, channel: str, stream: list[dict[str, Any]], free: list[int],
                      request: dict[str, Any]) -> int | None:
        """The first free entry equal to ``request`` once incidental values are masked
        (``incidental``): the new build's own timestamps and ids are not changes."""
        if self._tape_dir is None:
            return None
        if self._incidentals is None:
            self._incidentals = Incidentals.from_tape(self._tape_dir)
        inc = self._incidentals
        asked = request_text(request["method"], request["url"], request["body"])
        for i in free:
            k = (channel, i)
            if k not in self._texts:
                rec = self._req_of(stream[i])
                self._texts[k] = request_text(rec["method"], rec["url"], rec["body"])
            if differences(self._texts[k], asked, inc):
                self._note("build-masked.jsonl", {"channel": channel,
                                                  "pos": stream[i].get("pos")})
                return i
        return None

    def _served(self, channel: str, entry: dict[str, Any]) -> None:
        if channel == "model":
            self._turns += 1
        if self.build:
            self._note("build-served.jsonl", {"channel": channel, "pos": entry.get("pos")})

    def _build_divergence(self, channel: str, pos: int, request: dict[str, Any],
                          stream: list[dict[str, Any]], nearest: int | None) -> None:
        """The structured form of a semantic divergence (``replay --build --json``): the
        request asked, and its diff against the nearest free recorded call -- or, for a
        call past every recorded one (``unrecorded``), against the channel's last."""
        turn = self._turns + (1 if channel == "model" else 0)
        doc: dict[str, Any] = {
            "turn": turn, "channel": channel,
            "call": f"{channel} #{pos} {request['method']} {request['url']}",
            "kind": "unrecorded" if nearest is None else "changed",
            "request": request_json(request),
        }
        against = stream[nearest] if nearest is not None else (stream[-1] if stream else None)
        if against is not None:
            if self._incidentals is None and self._tape_dir is not None:
                self._incidentals = Incidentals.from_tape(self._tape_dir)
            inc = self._incidentals or Incidentals()
            doc["nearest"] = against.get("pos")
            if nearest is None:
                doc["nearest_is"] = "the last recorded call of its channel"
            doc["diff"] = [c for c in json_diff(self._req_of(against), request)
                           if not incidental_only(c["recorded"], c["asked"], inc)]
        self._note("build-divergence.jsonl", doc)

    def _note(self, name: str, doc: dict[str, Any]) -> None:
        if self._tape_dir is None:
            return
        doc = {"proc": self.proc, **doc}
        fd = os.open(self._tape_dir / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(doc, default=str) + "\n").encode())
        finally:
            os.close(fd)

    def _req_of(self, entry: dict[str, Any]) -> dict[str, Any]:
        req = entry["request"]
        body = b"" if is_lost_body(req["body"]) else self.resolve(req["body"])
        return {"method": req["method"], "url": req["url"], "body": body}

    def diverge(self, channel: str, pos: int, lines: list[str]) -> None:
        """Report a divergence; in strict mode stop the process (exit 86)."""
        record = {"proc": self.proc, "channel": channel, "position": pos,
                  "lenient": self.lenient, "report": lines}
        if self._tape_dir is not None:
            fd = os.open(self._tape_dir / "divergence-py.jsonl",
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, (json.dumps(record) + "\n").encode())
            finally:
                os.close(fd)
        if not self.lenient:
            diverged("\n".join(lines))


def _fit_scrubbed(entry: dict[str, Any]) -> dict[str, Any]:
    """A response body that lost a secret to ``scrub`` is shorter than the wire said: make
    ``content-length`` and the chunk sizes agree with it, or replay hands the client a
    truncated body (the chunk boundaries of such a body are not kept)."""
    resp = entry.get("response")
    if not isinstance(resp, dict) or not isinstance(resp.get("chunks"), list):
        return entry
    body = resp.get("body")
    size = len(body) if isinstance(body, bytes) else (body or {}).get("size")
    if not isinstance(size, int) or size == sum(resp["chunks"]):
        return entry
    headers = [[k, str(size)] if k.lower() == "content-length" else [k, v]
               for k, v in resp.get("headers", [])]
    return {**entry, "response": {**resp, "headers": headers, "chunks": [size] if size else []}}


class _Refused(Exception):
    """The recorder answered that it could not store an entry (a full disk)."""


def _without_big_bodies(entry: dict[str, Any], limit: int = MAX_MESSAGE) -> bytes:
    """``entry`` packed with its inline bodies (bytes over ``SPILL``: the ones the blob
    store could not take) replaced by markers, largest first, until it fits ``limit``
    (0: all of them). Raises ``_Refused`` if it is still over ``MAX_MESSAGE``."""
    entry = _copy(entry)  # the caller's entry is left as it was
    found: list[tuple[int, Any, Any]] = []  # (size, container, key)
    stack: list[Any] = [entry]
    while stack:
        v = stack.pop()
        for k, x in (v.items() if isinstance(v, dict) else enumerate(v)):
            if isinstance(x, bytes) and len(x) > SPILL:
                found.append((len(x), v, k))
            elif isinstance(x, (dict, list)):
                stack.append(x)
    found.sort(key=lambda f: f[0], reverse=True)
    msg = b""
    for size, holder, key in found:
        holder[key] = {"lost": "body", "bytes": size,
                       "sha256": hashlib.sha256(holder[key]).hexdigest(),
                       "channel": entry.get("channel"), "pos": entry.get("pos")}
        msg = msgpack.packb(entry, use_bin_type=True)
        if len(msg) <= limit:
            return msg
    msg = msg or msgpack.packb(entry, use_bin_type=True)
    if len(msg) > MAX_MESSAGE:
        raise _Refused("entry too large to record even without its bodies")
    return msg


def _copy(value: Any) -> Any:
    """A copy of the dicts and lists of ``value`` (leaves shared)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


class ReplayExhausted(ConnectionError):
    """Lenient replay asked for a call the recording does not have."""


_current: PyTape | None = None


def current() -> PyTape | None:
    """The tape of this process, created from the environment on the first intercepted call
    (never at start-up: see ``site/sitecustomize.py``)."""
    global _current
    if _current is None:
        mode = getenv("STENO_MODE") or ""
        if mode not in ("record", "replay"):
            return None
        _current = PyTape(
            mode, shim_proc() or "0",
            sock_path=getenv("STENO_PYSOCK"),
            tape_dir=getenv("STENO_TAPE"),
            store_dir=getenv("STENO_STORE"),
            lenient=getenv("STENO_LENIENT") == "1" and getenv("STENO_BUILD") != "1",
        )
    return _current
