"""The record/replay logic the three HTTP hooks share: one seam, phases a hook calls.

Each hook (httpx, requests, aiohttp) keeps only its library's code: where the
request leaves, how a response is built, which exception a broken connection is.
Everything else happens here, in the same order for every library, so a fix to
the tape logic is made once:

* ``tape_for``: whether a request is intercepted at all (one to a server the recorded
  tree started is not: it is the socket tape's, live at both ends at replay);
* ``begin``: classify the URL, claim the stream position, describe the request;
* ``Call.replayed``: the recorded entry, or the library's own connection error;
* ``Call.sending`` / ``Call.failed``: the real call, an exception committed as an
  error entry;
* ``Call.received`` -> ``Body``: the response being recorded; ``Body.finished``
  commits it with its chunk sizes and whether it was read to the end;
* ``Chunks`` / ``AsyncChunks``: one response body as the program reads it, chunk
  by chunk, pulled off the wire as it arrives (record) or from the tape in the
  recorded boundaries (replay), so the library code above runs the same in both;
* ``passthrough`` / ``apassthrough``: the library's own work run with the C
  shim's tape paused (replay never does it, so it must not be on the tape).

An async call never keeps the tape paused across an await: its steps run paused, its
suspensions do not (other tasks of the loop run, taped, meanwhile), and where each
suspension ended is recorded with the entry (``suspend``) and reproduced at replay
(``interpose.aioloop``), so the loop's tasks wake in the recorded order.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import heapq
import ipaddress
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

from stenograph.interpose import effects
from stenograph.interpose.exchange import (
    classify,
    describe,
    error_body,
    response_headers,
    split_chunks,
)
from stenograph.interpose.exits import STOPPED_EXIT, leave, say
from stenograph.interpose.pytape import IN_DECLARED_EFFECT, PyTape, ReplayExhausted, current
from stenograph.interpose.settings import loop_taped

T = TypeVar("T")


def _aioloop() -> Any:
    """interpose.aioloop, imported on first use: it imports asyncio, which a program that
    only uses sync clients must not pay for (nor have its import order changed)."""
    from stenograph.interpose import aioloop

    return aioloop

class IntentNotDurable(ConnectionError):
    """An effect whose intent the recorder could not make durable is not sent."""


class EffectRefused(ConnectionError):
    """A fork's live part does not run a declared effect (``@stenograph.tool(effect=True)``):
    its target is the recorded run's world."""


def stop_run(reason: str, tape: PyTape | None = None) -> NoReturn:
    """A budget is spent, or a resume refuses drift: the process ends before the call
    (exit 6). With ``tape``, the recorder is told first (an ``Authorized`` ``stop``), so
    the run is left resumable, not ended; without, the stop was the recorder's own
    decision (a budget). The CLI prints the one line a person reads; this process says
    it only when the recorder could not be told."""

    told = tape is None or tape.notify({"kind": "Stop", "reason": reason})
    if not told:
        say(f"stopped: {reason}")
    leave(STOPPED_EXIT)


Rebuild = Callable[[dict[str, Any]], BaseException]
"""A recorded error (``error_body``) back as the library's exception."""

Pull = Callable[[], tuple[bytes, bool]]
"""One read off the wire: (bytes, whether the body ended with them)."""


@contextlib.contextmanager
def paused_across_awaits(tape: PyTape) -> Iterator[None]:
    """The tape paused around awaits (no ``--asyncio``), leaving the loop as replay will.

    Replay never makes the real call, so whatever the call leaves in the event loop
    changes how the program's own later iterations run. Timeouts are the case that
    matters: a library's ``wait_for``/``fail_after`` timers, cancelled when the call
    ended, stay in the loop's timer heap until their deadline, and while they are there
    each iteration reads the clock once more than at replay. Record removes the
    cancelled timers the call created (as the loop itself would, later) on the way out.
    """
    with tape.shim.paused():  # (get_running_loop calls getpid: inside the pause)
        loop = _running_loop() if tape.mode == "record" else None
        heap = getattr(loop, "_scheduled", None)
        before = {id(h) for h in heap} if isinstance(heap, list) else None
        try:
            yield
        finally:
            if before is not None:
                _drop_cancelled_timers(loop, before)


def _running_loop() -> Any:
    aio = sys.modules.get("asyncio")
    try:
        return aio.get_running_loop() if aio is not None else None
    except RuntimeError:
        return None


def _drop_cancelled_timers(loop: Any, before: set[int]) -> None:
    heap = loop._scheduled
    gone = [h for h in heap if getattr(h, "_cancelled", False) and id(h) not in before]
    if not gone:
        return
    drop = {id(h) for h in gone}
    heap[:] = [h for h in heap if id(h) not in drop]
    heapq.heapify(heap)
    for h in gone:
        h._scheduled = False
    if isinstance(getattr(loop, "_timer_cancelled_count", None), int):
        loop._timer_cancelled_count = max(0, loop._timer_cancelled_count - len(gone))


def passthrough(tape: PyTape, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with the tape paused: the library's own work, which replay skips."""
    with tape.shim.paused():
        return fn(*args)


async def apassthrough(tape: PyTape, aw: Awaitable[T], what: str, *,
                       at_replay: bool = False) -> T | None:
    """The async twin of ``passthrough``, for the library's own closes: record runs ``aw``
    (steps paused, suspensions not) and keeps how its suspensions ended on the ``await``
    channel; replay suspends the same way, and runs ``aw`` too when ``at_replay`` (a
    close whose effect the program sees, e.g. ``session.closed``) without waiting on it."""
    if not loop_taped():
        if tape.mode == "replay" and not at_replay:
            close = getattr(aw, "close", None)  # never started: closed quietly
            if close is not None:
                close()
            return None
        with paused_across_awaits(tape):
            return await aw
    with tape.shim.paused():
        slot = tape.begin("await")
        match = {"method": "AWAIT", "url": what, "body": b""}
    if tape.mode == "record":
        log: list[Any] = []
        try:
            return await _aioloop().Drive(tape, aw, log)
        finally:
            with tape.shim.paused():
                tape.commit(slot.stream, slot.pos, {"fingerprint": what, "request": match,
                                                    "suspend": log})
    with tape.shim.paused():
        try:
            entry = tape.take(slot.stream, slot.pos, match, what)
        except ReplayExhausted:
            entry = {}
    result = _aioloop().run_now(tape, aw) if at_replay else _aioloop().discard(aw)
    await _aioloop().replay_suspensions(tape, entry.get("suspend"))
    return result


def rebuild_error(err: dict[str, Any], modules: tuple[str, ...],
                  fallback: Callable[[str], BaseException]) -> BaseException:
    """The recorded exception as an instance of its own class when that class lives in one
    of ``modules`` (the library's own), carrying the recorded message as its only argument
    (``str()`` is then what the program saw); else ``fallback(message)``. Only modules
    already imported are looked in: an import here would list directories replay's tape
    does not have."""
    message = err.get("message", "")
    if err.get("module") in modules:
        with contextlib.suppress(Exception):
            cls = getattr(sys.modules[err["module"]], err["type"])
            if isinstance(cls, type) and issubclass(cls, Exception):
                exc = cls.__new__(cls)
                exc.args = (message,)
                return exc
    return fallback(message)


@dataclass
class Replayed:
    """A recorded response, ready for a hook to build its library's response from."""

    status: int
    reason: str | None
    headers: list[list[str]]
    ext: dict[str, Any]
    chunks: list[bytes]
    complete: bool
    error: dict[str, Any] | None
    suspend: dict[str, Any] = field(default_factory=dict)


@dataclass
class Body:
    """A response being recorded: committed once, when finished or abandoned."""

    call: Call
    status: int
    headers: list[tuple[str, str]]
    reason: str | None = None
    ext: dict[str, Any] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    error: dict[str, Any] | None = None
    done: bool = False

    def broke(self, exc: BaseException) -> None:
        """The wire broke mid-body: keep the chunks so far and what went wrong."""
        self.error = error_body(exc)
        self.finished(complete=False)

    def finished(self, complete: bool) -> None:
        """Commit the response (durable when this returns); later calls do nothing."""
        if self.done:
            return
        self.done = True
        tape = self.call.tape
        response: dict[str, Any] = {
            "status": self.status,
            "headers": response_headers(tape, self.headers),
            "body": tape.spill(b"".join(self.chunks)),
            "chunks": [len(c) for c in self.chunks],
            "complete": complete,
        }
        if self.reason is not None:
            response["reason"] = self.reason
        if self.ext:
            response["ext"] = self.ext
        with tape.shim.paused():
            self.call.commit(response, self.error)
            if self.call.top_model and tape.resuming and complete:
                served_check(tape, self.call.pos, b"".join(self.chunks))


class Call:
    """One intercepted exchange, from ``begin`` to its committed (or replayed) entry."""

    def __init__(self, tape: PyTape, method: str, url: str, headers: list[tuple[str, str]],
                 body: bytes) -> None:
        self.tape = tape
        self.channel = classify(url)
        self.slot = tape.begin(self.channel)
        self.stream, self.pos = self.slot.stream, self.slot.pos
        self.top_model = self.channel == "model" and not self.slot.nested
        """A model call of the program's own (a turn): not one a tool's body made."""
        self.body_override: bytes | None = None
        """A body to send instead of the program's (a resume pinning its model): the hook
        puts it in the request."""
        if self.top_model and tape.resuming and tape.mode == "record":
            self.body_override = drift_check(tape, self.pos, body)
            body = self.body_override if self.body_override is not None else body
        self.request, self.match, self.fp = describe(tape, method, url, headers, body)
        if self.top_model:
            tape.mark_turn(self.stream, self.pos, self.fp)
        self.occurrence = tape.occurrence(self.slot, self.fp)
        self.served = tape.resumed_entry(self.slot, self.fp)
        """The crashed run's entry for this call, made again inside a body a resume runs
        again: served, not sent (``PyTape.resumed_entry``)."""
        self.suspend: dict[str, list[Any]] = {"head": [], "chunks": []}
        self.effect = effects.is_effect(method, url, self.channel, tape.effect_urls,
                                        tape.readonly_urls) and not IN_DECLARED_EFFECT.get(
                                        ) and not effects.mcp_traffic(headers, body)
        self.extra_headers: list[tuple[str, str]] = []
        """Headers an effect leaves with (record): the hook adds them to the request."""
        self._target = f"{method.upper()} {url}"
        self.url_override: str | None = None
        """Where a fork's live call goes instead (``fork_route``): the hook sends it there."""
        self._refusal: str | None = None
        if tape.fork and tape.mode == "record":
            self.url_override, self._refusal = fork_route(
                url, self.channel, self.effect, tape.model_url, tape.effects_url)
        self._key: str | None = None
        if self.effect:
            self._key = effects.program_key(headers) or effects.idempotency_key(
                tape.traj, tape.proc, self.stream, self.fp, self.occurrence)
            self.extra_headers = effects.wire_headers(tape.traj, tape.epoch, self._key,
                                                      headers)
        self._body = body

    @property
    def replaying(self) -> bool:
        """Whether this call is answered from the tape (replay, or ``served``) rather than
        made: the one place a hook asks."""
        return self.tape.mode == "replay" or self.served is not None

    def commit(self, response: dict[str, Any] | None, error: dict[str, Any] | None) -> None:
        entry = {"fingerprint": self.fp, "request": self.request, "response": response,
                 "error": error}
        if self.url_override is not None:
            entry["sent_to"] = self.url_override
        if self.suspend["head"] or self.suspend["chunks"]:
            entry["suspend"] = self.suspend
        self.tape.commit(self.stream, self.pos, entry)

    def take(self, exhausted: Callable[[str], BaseException]) -> dict[str, Any]:
        """The recorded entry (replay), or the library's own connection error."""
        if self.served is not None:
            return self.served
        try:
            return self.tape.take(self.stream, self.pos, self.match, self.fp)
        except ReplayExhausted as exc:
            raise exhausted(str(exc)) from None

    def replayed(self, rebuild: Rebuild, exhausted: Callable[[str], BaseException],
                 entry: dict[str, Any] | None = None) -> Replayed:
        """The recorded answer; a recorded connection error is raised as ``rebuild`` says."""
        if entry is None:
            entry = self.take(exhausted)
        resp = entry.get("response")
        if resp is None:
            raise rebuild(entry["error"])
        return Replayed(
            status=resp["status"], reason=resp.get("reason"), headers=resp["headers"],
            ext=dict(resp.get("ext") or {}),
            chunks=split_chunks(self.tape.resolve(resp["body"]), resp["chunks"]),
            complete=resp.get("complete", True), error=entry.get("error"),
            suspend=dict(entry.get("suspend") or {}),
        )

    def failed(self, exc: BaseException) -> None:
        """The request got no response: commit what it raised."""
        with self.tape.shim.paused():
            self.commit(None, error_body(exc))

    def before_send(self, refused: Callable[[str], BaseException]) -> None:
        """Record, tape paused: what must happen before the request leaves. A model call
        or an effect is authorized (policy, budget: ``PyTape.authorize``); an effect a
        crash left in doubt is settled (resume); an effect is sent only once its intent
        is durable. A refusal is raised as ``refused(message)`` -- the library's own
        connection error, which the program already handles -- and committed, so a
        replay raises it again."""
        if self._refusal is not None:
            self._refuse(refused(self._refusal))
        if self.effect or self.channel == "model":
            self._authorize(refused)
        if self.effect and self.tape.resuming:
            self._settle_in_doubt()
        if self.effect and not self.tape.intent(self.stream, self.pos, self._target,
                                                self._body, self._key, self.fp):
            self._refuse(IntentNotDurable(f"stenograph could not make the intent of "
                                          f"{self._target} durable; the request was not "
                                          "sent"))

    def _refuse(self, exc: BaseException) -> NoReturn:
        self.failed(exc)
        raise exc

    def _authorize(self, refused: Callable[[str], BaseException]) -> None:
        from stenograph.interpose.resume_plan import described

        what = described(self._target, self._body) if self.effect else None
        authorize(self.tape, self.slot.call_id(self.tape.proc), self._target,
                  self.channel, lambda msg, _cause: refused(msg), self._refuse, what)

    @contextlib.contextmanager
    def sending(self, refused: Callable[[str], BaseException] = IntentNotDurable
                ) -> Iterator[None]:
        """The real call, tape paused; what it raises is committed, then re-raised
        (``before_send`` first)."""
        with self.tape.shim.paused():
            self.before_send(refused)
            try:
                yield
            except Exception as exc:
                self.failed(exc)
                raise

    def _settle_in_doubt(self) -> None:
        """Resume: this effect was in doubt when the run crashed. It is sent again with
        its recorded idempotency key unless its URL is one the resume was told ignores
        keys (``--settle-http``): then a person decides (exit 4). A live call whose
        derived key some other recorded intent carried is refused: a key is never sent
        for another intent."""
        cid = self.slot.call_id(self.tape.proc)
        plan = self.tape.settlement()
        how = plan.how(cid, self._target, self.fp)
        if how == "person":
            plan.needs_person(cid, self._target,
                              "its service is not trusted to honour idempotency keys",
                              self._body)
        if how is not None:
            self._key = plan.key_of(cid) or self._key
            self.extra_headers = [(k, self._key if k == effects.IDEMPOTENCY_HEADER else v)
                                  for k, v in self.extra_headers]
        elif self._key is not None:
            plan.check_fresh(cid, self._key)

    def received(self, status: int, headers: list[tuple[str, str]], *,
                 reason: str | None = None, ext: dict[str, Any] | None = None) -> Body:
        """The response head arrived: its body is recorded as the program reads it."""
        return Body(self, status, headers, reason, ext or {})


_ENDPOINT = re.compile(r"/(?:chat/completions|responses|messages)(?:/|$)")


def rebase(url: str, base: str) -> str:
    """``url`` sent to ``base`` instead: its scheme, host and port; and, when ``base`` has a
    path, that path in place of everything before the API endpoint
    (``/chat/completions``, ``/responses``, ``/messages``) or, for other URLs, before the
    whole path."""

    u, b = urlsplit(url), urlsplit(base)
    path = u.path
    prefix = b.path.rstrip("/")
    if prefix:
        m = _ENDPOINT.search(path)
        path = prefix + (path[m.start():] if m else path)
    return urlunsplit((b.scheme or u.scheme, b.netloc or u.netloc, path, u.query, u.fragment))


def fork_route(url: str, channel: str, effect: bool, model_url: str | None,
               effects_url: str | None) -> tuple[str | None, str | None]:
    """A fork's live call: (where it goes instead, or why it is refused). A model call
    goes to ``--model-url`` when one was given; an effect goes to ``--effects-url`` or
    is refused: a counterfactual run never reaches the recorded run's targets."""
    if channel == "model":
        return (rebase(url, model_url) if model_url else None), None
    if effect:
        if effects_url:
            return rebase(url, effects_url), None
        return None, (f"stenograph fork: the effect {url} was not sent (a fork sends "
                      "effects only to --effects-url)")
    return None, None


def authorize(tape: PyTape, cid: str, target: str, channel: str,
              refused: Callable[[str, BaseException | None], BaseException],
              refuse: Callable[[BaseException], NoReturn], what: str | None = None) -> None:
    """The run's policy and budget on a call about to be made (``PyTape.authorize``):
    allowed, it returns; held, it waits for a person (``stenograph.approval``: the run
    pauses, or the approval is denied); a spent budget stops the run (exit 6); denied,
    ``refuse(refused(message, approval_denied_or_None))`` -- the caller's own error,
    committed as the call's outcome."""
    d = tape.authorize(cid, target, channel)
    if d.get("decision") == "allow":
        return
    if d.get("decision") == "stop":
        stop_run(str(d.get("reason")))
    if d.get("decision") == "hold":
        from stenograph.interpose.approvals import ApprovalDenied, approval

        try:
            approval(target, str(d.get("summary") or what or target))
            return
        except ApprovalDenied as exc:
            refuse(refused(f"stenograph: {exc}", exc))
    refuse(refused(f"stenograph: the run's policy denies {target}"
                   + (f" ({d['reason']})" if d.get("reason") not in (None, "policy") else ""),
                   None))


def drift_check(tape: PyTape, pos: int, body: bytes) -> bytes | None:
    """A live model call of a resumed run, against the last one before it (the
    recording's, at first): what differs (model asked for, tool schemas, system prompt)
    is a ``Drift`` event (``--drift cross``, the default), a refusal (``refuse``: exit
    6, one line), or -- for the model -- the request pinned to the model that served
    the recording (``pin``; returns the new body). A changed schema of a tool with an
    effect in doubt always refuses."""
    import json

    from stenograph.recorder.drift import Signature, request_signature
    from stenograph.recorder.effects import call_id

    plan = tape.settlement().drift
    last = plan.get("last")
    if not isinstance(last, dict):
        return None
    old, live = Signature.from_body(last), request_signature(body)
    cid = call_id(tape.proc, "model", pos)
    doubt = sorted(set(old.changed_tools(live)) & set(plan.get("in_doubt_tools") or []))
    if doubt:
        stop_run(f"drift: the schema of tool {doubt[0]} changed since the crash and it has "
                 "an effect in doubt: resuming would reinterpret its arguments", tape)
    mode = plan.get("mode", "cross")
    out = None
    diffs = [(f, a, b) for f, a, b in old.differences(live) if f != "served"]
    if mode == "pin" and any(f == "model" for f, _a, _b in diffs):
        want = old.served or old.model
        try:
            doc = json.loads(body)
            doc["model"] = want
            out = json.dumps(doc, separators=(",", ":")).encode()
            live = request_signature(out)
            diffs = [(f, a, b) for f, a, b in old.differences(live) if f != "served"]
        except (ValueError, TypeError):
            out = None
    if diffs and mode == "refuse":
        f, a, b = diffs[0]
        stop_run(f"drift: model call {cid}: {f} was {str(a)[:24]}, is {str(b)[:24]} now "
                 "(--drift refuse)", tape)
    for f, a, b in diffs:
        tape.notify({"kind": "Drift", "call_id": cid, "field": f, "old": a, "new": b,
                     "mode": mode})
    plan["last"] = {**live.to_body(), "served": old.served}
    return out


def served_check(tape: PyTape, pos: int, response_body: bytes) -> None:
    """After a resumed run's live model call: the model that answered, against the one
    that answered before (``drift_check``)."""
    from stenograph.recorder.effects import call_id
    from stenograph.recorder.policy import usage_of

    plan = tape.settlement().drift
    last = plan.get("last")
    served = usage_of(response_body)[0]
    if not isinstance(last, dict) or served is None:
        return
    old = last.get("served")
    last["served"] = served
    if old is None or old == served:
        return
    cid = call_id(tape.proc, "model", pos)
    tape.notify({"kind": "Drift", "call_id": cid, "field": "served", "old": old,
                 "new": served, "mode": plan.get("mode", "cross")})
    if plan.get("mode") == "refuse":
        stop_run(f"drift: model call {cid} was answered by {served}, the recording by "
                 f"{old} (--drift refuse)", tape)


_ORPHANS: list[Body] = []


def _tape_free(tape: PyTape) -> bool:
    """Whether a commit can take the tape's lock now. A body collected by the cyclic
    garbage collector (an aiohttp response is in a cycle with its connection) is closed
    wherever the collection ran, possibly inside a commit of this same thread, which holds
    the lock: its entry then waits for the next call or the exit instead of deadlocking."""
    lock = getattr(tape, "_lock", None)
    if lock is None:
        return True
    if not lock.acquire(timeout=2.0):
        return False
    lock.release()
    return True


def _flush_orphans() -> None:
    while _ORPHANS:
        _ORPHANS.pop().finished(complete=False)


def tape_for(url: str) -> PyTape | None:
    """The tape a hook records a request to ``url`` on, or None: no tape, or the request
    goes to a server a process of the recorded tree bound (an agent and the MCP or HTTP
    server it started). That conversation is the program's with itself: the hook leaves
    it to the socket level, where a replay runs both ends live, as record did, and the
    server's own effects are its own. Asked with the tape running, so the answer is on
    the tape (whether the server had bound yet is timing); a request made while the tape
    is paused (inside another hooked call) stays hooked."""
    tape = current()
    if tape is None or tape.shim.active():
        return tape
    host, port = _host_port(url)
    if host is None or not tape.shim.tree_peer(host, port):
        return tape
    return None


def _host_port(url: str) -> tuple[str | None, int]:
    """An IP literal or ``localhost`` and the port of ``url``; (None, 0) for any other
    host (a name the tree could not have bound)."""
    try:
        parts = urlsplit(url)
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None, 0
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return None, 0
    return host, port or (443 if parts.scheme in ("https", "wss") else 80)


def begin(tape: PyTape, method: str, url: str, headers: list[tuple[str, str]],
          body: bytes) -> Call:
    """Classify, claim the position, describe: the start of every intercepted call."""
    _flush_orphans()
    return Call(tape, method, url, headers, body)


class _Source:
    """What ``Chunks`` and ``AsyncChunks`` share: the recorded side or the replayed side."""

    def __init__(self, tape: PyTape, body: Body | None, replayed: Replayed | None,
                 ended: Callable[[str], BaseException], rebuild: Rebuild) -> None:
        self.tape, self.body, self.replayed = tape, body, replayed
        self.ended, self.rebuild = ended, rebuild
        self.at = 0
        self.eof = body is None and replayed is None

    def _replay_next(self) -> bytes | None:
        rp = self.replayed
        assert rp is not None
        if self.at < len(rp.chunks):
            self.at += 1
            return rp.chunks[self.at - 1]
        self.eof = True
        if rp.error is not None:
            raise self.rebuild(rp.error)
        if not rp.complete:
            raise self.ended("stenograph: the recorded program stopped reading this "
                             "response here")
        return None

    def _left_waiting(self) -> bool:
        """Replay: every recorded chunk was handed over, and the recording neither saw
        the end nor an error: the program stopped waiting for the next one itself."""
        rp = self.replayed
        return (rp is not None and self.at >= len(rp.chunks) and not rp.complete
                and rp.error is None)

    def _took(self, chunk: bytes, last: bool) -> None:
        body = self.body
        assert body is not None
        if chunk:
            body.chunks.append(chunk)
        if last:
            self.eof = True
            body.finished(complete=True)

    def _abandoned(self, collected: bool) -> None:
        body = self.body
        if body is None or body.done:
            return
        if not collected or _tape_free(self.tape):
            body.finished(complete=False)
            return
        if not _ORPHANS:
            atexit.register(_flush_orphans)
        _ORPHANS.append(body)


class Chunks(_Source):
    """A body read chunk by chunk: ``next()`` is the next chunk, ``None`` the end.

    Record: ``pull`` reads the wire (tape paused) when the program asks, so the
    program gets each chunk as it arrives; the entry is committed when the last one
    has been read (before the end reaches the program), when the wire breaks, or
    when the body is closed half read.
    Replay: the recorded chunks, then the recorded error if the wire broke.
    """

    def __init__(self, tape: PyTape, *, pull: Pull | None = None, body: Body | None = None,
                 replayed: Replayed | None = None, ended: Callable[[str], BaseException],
                 rebuild: Rebuild, on_end: Callable[[bool], None] | None = None) -> None:
        super().__init__(tape, body, replayed, ended, rebuild)
        self.pull, self.on_end = pull, on_end

    def next(self) -> bytes | None:
        while True:
            if self.eof:
                return None
            if self.replayed is not None:
                return self._replay_next()
            assert self.pull is not None and self.body is not None
            with self.tape.shim.paused():
                try:
                    chunk, last = self.pull()
                except Exception as exc:
                    self.eof = True
                    self.body.broke(exc)
                    raise
                self._took(chunk, last)
                if last and self.on_end is not None:
                    self.on_end(True)
            if chunk:
                return chunk

    def close(self, collected: bool = False) -> None:
        """The program is done with the body (closed, or ``collected`` by the garbage
        collector), read or not."""
        if self.body is None:
            return
        with self.tape.shim.paused():
            self._abandoned(collected)
            if not self.eof:
                self.eof = True
                if self.on_end is not None:
                    self.on_end(False)


class AsyncChunks(_Source):
    """The async twin of ``Chunks`` (``pull`` is awaited). How the waits for each chunk
    ended is kept per chunk handed to the program (record) and reproduced before it is
    handed over again (replay)."""

    def __init__(self, tape: PyTape, *, pull: Callable[[], Awaitable[tuple[bytes, bool]]]
                 | None = None, body: Body | None = None, replayed: Replayed | None = None,
                 ended: Callable[[str], BaseException], rebuild: Rebuild) -> None:
        super().__init__(tape, body, replayed, ended, rebuild)
        self.pull = pull
        self.handed = 0

    async def next(self) -> bytes | None:
        taped = loop_taped()
        if taped and self.replayed is not None:
            groups = self.replayed.suspend.get("chunks") or []
            k, self.handed = self.handed, self.handed + 1
            if not self.eof and k < len(groups):
                await _aioloop().replay_suspensions(self.tape, groups[k])
        log: list[Any] = []
        while True:
            if self.eof:
                return None
            if self.replayed is not None:
                if taped and self._left_waiting():
                    # the recorded program was still waiting for more when it stopped
                    # (a stream it cancelled: an MCP session's GET): so does this one, until
                    # it cancels the wait at the same point of its loop
                    await asyncio.get_running_loop().create_future()
                return self._replay_next()
            assert self.pull is not None and self.body is not None
            try:
                if taped:
                    chunk, last = await _aioloop().Drive(self.tape, self.pull(), log)
                else:
                    with paused_across_awaits(self.tape):
                        chunk, last = await self.pull()
            except Exception as exc:
                with self.tape.shim.paused():
                    self.eof = True
                    if taped:
                        self.body.call.suspend["chunks"].append(log)
                    self.body.broke(exc)
                raise
            with self.tape.shim.paused():
                if taped and (chunk or last):
                    self.body.call.suspend["chunks"].append(log)
                self._took(chunk, last)
            if chunk:
                return chunk

    def close(self, collected: bool = False) -> None:
        if self.body is None:
            return
        with self.tape.shim.paused():
            self._abandoned(collected)
            self.eof = True
