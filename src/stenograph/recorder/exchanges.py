"""The recorder's end of the Python-level tape (``interpose.pytape``).

Record: ``ExchangeServer`` listens on a unix ``SOCK_SEQPACKET`` socket; every
message is one finished call (HTTP exchange, model or tool call) as a msgpack
map. It is appended as an ``Exchange`` event before the one-byte acknowledgement
(``ACK``) goes back. The answer to a call that made an effect (its ``ToolIntent`` came
first) is durable by then; any other rides the next sync -- an effect's intent, the
group commit's next batch, the run's end. No effect leaves before its intent is synced,
and that sync covers every event appended before it, so nothing the program does that
the world sees can depend on an answer the log could lose; a crash may lose answers no
effect depended on, and a resume asks for those again. One the store cannot take (a full
disk) gets ``NACK`` instead: the program goes on unharmed, and ``lost`` counts it for the
run's report (``loss_note``). An entry whose body was too large to keep without the blob store
arrives with that body replaced by a marker (``is_lost_body``); ``bodies_lost``
counts those.

Replay: ``prepare_py_tape`` turns a trajectory's ``Exchange`` events into the
per-process files the hooks serve from, and copies the blobs they reference.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgpack

from stenograph.recorder.blobs import BlobRef, BlobStore, blob_refs
from stenograph.recorder.codec import Event
from stenograph.recorder.effects import base_channel, call_id
from stenograph.recorder.errors import StenographError
from stenograph.recorder.seqpacket import SeqpacketServer

MAX_MESSAGE = 1 << 20
"""The largest exchange message taken (``interpose.pytape.MAX_MESSAGE`` is the same)."""
ACK, NACK = b"\x01", b"\x00"


def is_lost_body(value: Any) -> bool:
    """The marker a body that could not be recorded is replaced by:
    ``{"lost": "body", "bytes": n, "sha256": hex, ...}``."""
    return isinstance(value, dict) and value.get("lost") == "body"


def _lost_bodies(entry: dict[str, Any]) -> int:
    stack: list[Any] = [entry]
    n = 0
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if is_lost_body(v):
                n += 1
            else:
                stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return n


HARNESS_EVENTS = frozenset({"ToolIntent", "ApprovalRequested", "Drift", "Stop",
                            "ContextBuilt"})
"""What a hook may send besides its finished calls (``PyTape.intent`` / ``notify``)."""
QUEUED_EVENTS = frozenset({"ContextBuilt"})
"""Harness events appended without a sync of their own (a turn's start marker rides the
sync of the turn's ``Exchange``): the drain before them is what they are for."""


class ExchangeServer:
    """Accepts exchange messages from every process of a recorded tree."""

    def __init__(self, store: Any, traj: str, sock_path: str | Path, *,
                 after_model: Callable[[str, int, int], None] | None = None,
                 before_intent: Callable[[], None] | None = None,
                 before_append: Callable[[], None] | None = None,
                 before_approval: Callable[[], None] | None = None,
                 authorizer: Any = None) -> None:
        self.store = store
        self.authorizer = authorizer
        """``recorder.policy.Authorizer`` when the run has a policy or a budget."""
        self.stopped_for: str | None = None
        """Why a budget stopped the run (the program then exits 6)."""
        self._before_approval = before_approval
        """Called before an ``ApprovalRequested`` is appended: the checkpoint of a pause."""
        self.paused_for: str | None = None
        """The call an approval request paused the run at (the program then exits 5)."""
        self.paused_call: dict[str, Any] = {}
        """That request: ``call`` (what is held) and ``summary`` (what it does)."""
        self.stopped_at: dict[str, Any] = {}
        """The call a budget stopped the run before: ``call_id``, ``target``."""
        self._after_model = after_model
        self._before_intent = before_intent
        self._before_append = before_append
        """Called before any entry is appended: the tape session drains every ring, so
        everything the tree taped before the entry precedes it in the log -- each Python
        event is then a point a resume can cut the tape at (``recorder/resumes.py``)."""
        """Called before a ``ToolIntent`` is appended: the tape session drains every
        process's rings, so the intent's sync covers all the tree taped before it."""
        """Called with (proc, pos, lsn) once a model exchange is durable, before the
        program is answered: the turn boundary checkpoints are taken at."""
        self.after_intent: Callable[[], None] | None = None
        """Called once an effect's intent is durable, before the hook is answered (``--db``:
        the intent into the warm tier too)."""
        self.traj = traj
        self.count = 0
        self.lost = 0
        """Messages that arrived but could not be appended (answered ``NACK``)."""
        self.bodies_lost = 0
        """Appended entries with a body recorded only as a marker (``is_lost_body``)."""
        self._lock = threading.Lock()
        self._effects: set[str] = set()  # call ids whose intent came: their answer is synced
        self._queued: list[int] = []  # LSNs of the answers that rode a later sync
        self._server = SeqpacketServer(sock_path, self._handle, name="steno-exchanges",
                                       max_message=MAX_MESSAGE, stop_on_error=True)
        self.path = self._server.path
        self.errors = self._server.errors

    def _handle(self, conn: socket.socket, msg: bytes) -> None:
        try:
            body = msgpack.unpackb(msg, raw=False, strict_map_key=False)
            if not isinstance(body, dict):
                raise ValueError("exchange message is not a map")
            kind = body.get("kind")
            if kind == "Authorize":  # answered with the decision, not an ACK
                self._authorize(conn, body)
                return
            if kind is not None:
                self._harness_event(str(kind), body)
                conn.sendall(ACK)
                return
            if self._before_append is not None:
                self._before_append()
            body["at"] = time.time()  # when its answer came (``harness/work.py``)
            synced = self._effect(body)
            lsn = self.store.append(self.traj, "Exchange", body, durable=synced)
            if not synced:
                with self._lock:
                    self._queued.append(lsn)
        except Exception as exc:  # the store refused it (a full disk): say so, go on
            with self._lock:
                self.lost += 1
                if len(self.errors) < 20:
                    self.errors.append(f"exchange not recorded: {type(exc).__name__}: {exc}")
            conn.sendall(NACK)
            return
        with self._lock:  # one thread per connected process
            self.count += 1
            self.bodies_lost += _lost_bodies(body) > 0
            if self.authorizer is not None and base_channel(str(body.get("channel"))) == "model":
                self._spend(body)  # a model call a tool's body made spends too
        if self._after_model is not None and body.get("channel") == "model":
            pos = body.get("pos")
            self._after_model(str(body.get("proc")), pos if isinstance(pos, int) else -1, lsn)
        conn.sendall(ACK)

    def _effect(self, body: dict[str, Any]) -> bool:
        """Did this answer's call make an effect (its intent was appended)? Its answer
        then is what decides whether the effect is settled: synced before the program
        reads it, or a crash leaves the effect in doubt for a person."""
        pos = body.get("pos")
        cid = call_id(str(body.get("proc")), str(body.get("channel")),
                      pos if isinstance(pos, int) else -1)
        with self._lock:
            if cid in self._effects:
                self._effects.discard(cid)
                return True
        return False

    def _harness_event(self, kind: str, body: dict[str, Any]) -> None:
        """An event a hook sends (``HARNESS_EVENTS``), durable before the ACK: its own
        preparation first (the checkpoint before an effect or a pause), every ring
        drained, then the append."""
        if kind not in HARNESS_EVENTS:
            raise ValueError(f"unknown harness event {kind!r}")
        before = {"ToolIntent": self._before_intent,
                  "ApprovalRequested": self._before_approval}.get(kind)
        if before is not None:
            before()
        if self._before_append is not None:
            self._before_append()
        fields = {k: v for k, v in body.items() if k != "kind"}
        if kind == "ToolIntent":
            with self._lock:
                self._effects.add(str(fields.get("call_id")))
        if kind == "ContextBuilt":  # when the model call began (``harness/work.py``)
            fields["at"] = time.time()
        if kind == "Stop":  # the program stops itself (a resume refusing drift)
            self.stopped_for = str(body.get("reason"))
            kind, fields = "Authorized", {"decision": "stop", "reason": self.stopped_for}
        self.store.append(self.traj, kind, fields, durable=kind not in QUEUED_EVENTS)
        if kind == "ToolIntent" and self.after_intent is not None:
            self.after_intent()  # (raising: NACK, the effect is not made)
        if kind == "ApprovalRequested":
            self.paused_for = str(body.get("call_id"))
            self.paused_call = {"call": body.get("call"), "summary": body.get("summary")}

    def request_approval(self, call_id: str, call: str, summary: str) -> None:
        """A call held by the policy outside Python (a command, a program's own request):
        ``ApprovalRequested`` made durable the way a hook's is, the run paused at it."""
        self._harness_event("ApprovalRequested", {
            "call_id": call_id, "call": call, "summary": summary,
            "requested_at": time.time(), "expires_at": None})

    def _authorize(self, conn: socket.socket, body: dict[str, Any]) -> None:
        """Decide (policy, budget), append ``Authorized`` first, then answer the decision."""
        answer = self.decide(body.get("call_id"), str(body.get("target")),
                             str(body.get("channel")))
        conn.sendall(msgpack.packb(answer, use_bin_type=True))

    def decide(self, call_id: Any, target: str, channel: str) -> dict[str, Any]:
        """The policy's and budget's decision on a call (``allow`` without either), its
        ``Authorized`` event appended; also asked by the tape for an effect a program
        sends on its own connection (``RecordSession``, channel ``net``)."""
        with self._lock:
            if self.authorizer is None:
                return {"decision": "allow"}
            answer = self.authorizer.decide(target, channel)
            if answer["decision"] == "stop":
                self.stopped_for = str(answer["reason"])
                self.stopped_at = {"call_id": call_id, "target": target}
        # queued, not waited for: durable with the next sync, which an effect's intent
        # (after this) makes before the effect leaves
        self.store.queue(self.traj, "Authorized", {"call_id": call_id, **answer})
        return answer

    def _spend(self, entry: dict[str, Any]) -> None:
        self.spend_into(self.authorizer, entry, self.store.blobs)

    @staticmethod
    def spend_into(authorizer: Any, entry: dict[str, Any], blobs: BlobStore) -> None:
        """Count a model exchange's tokens (and dollars) against the run's budget."""
        from stenograph.recorder.policy import usage_of

        resp = entry.get("response")
        body = resp.get("body") if isinstance(resp, dict) else None
        if isinstance(body, dict):
            try:
                body = blobs.get(BlobRef.from_body(body))
            except (OSError, KeyError, ValueError, StenographError):
                body = None
        if isinstance(body, bytes):
            authorizer.budget.spend(*usage_of(body))

    def _unsynced(self) -> int:
        """Exchanges appended without a sync of their own that no sync ever covered: the
        store refused a later write (a full disk). Asked once, as the run ends: a sync
        now covers them, or says how far the log got."""
        with self._lock:
            queued, self._queued = self._queued, []
        if not queued:
            return 0
        try:
            self.store.flush()
            return 0
        except Exception:  # (the write the store refused: those after its last sync)
            try:
                synced = int(self.store.synced_lsn)
            except Exception:
                synced = 0
            return sum(1 for lsn in queued if lsn > synced)

    def loss_note(self) -> str | None:
        """What the run's report must say about exchanges the recording lacks, or None."""
        parts = []
        self.lost += self._unsynced()
        if self.lost:
            parts.append(f"{self.lost} exchange(s) could not be recorded (replay stops "
                         "at the first)")
        if self.bodies_lost:
            parts.append(f"{self.bodies_lost} exchange(s) recorded without a body too "
                         "large to keep without the blob store")
        return "; ".join(parts) or None

    def close(self) -> None:
        self._server.close()


def prepare_py_tape(events: Iterable[Event], tape_dir: str | Path,
                    blobs: dict[str, bytes] | BlobStore | None = None) -> dict[str, int]:
    """Write ``tape_dir/py/<proc>.msgpack`` and ``tape_dir/blobs``; return counts per proc."""
    tape_dir = Path(tape_dir)
    by_proc: dict[str, dict[str, list[dict[str, Any]]]] = {}
    out_blobs = BlobStore(tape_dir / "blobs")
    for ev in events:
        if ev.kind != "Exchange":
            continue
        body = ev.body
        by_proc.setdefault(str(body["proc"]), {}).setdefault(str(body["channel"]), []).append(body)
        for ref in blob_refs(body):
            if out_blobs.has(ref.sha256):
                continue
            if isinstance(blobs, dict):
                data = blobs[ref.sha256]
            elif blobs is not None:
                data = blobs.get(ref)
            else:
                raise KeyError(f"blob {ref.sha256} referenced but no blobs were given")
            out_blobs.put(data)
    (tape_dir / "py").mkdir(parents=True, exist_ok=True)
    counts = {}
    for proc, channels in by_proc.items():
        for entries in channels.values():
            entries.sort(key=lambda e: e["pos"])
        (tape_dir / "py" / f"{proc}.msgpack").write_bytes(
            msgpack.packb(channels, use_bin_type=True))
        counts[proc] = sum(len(v) for v in channels.values())
    return counts
