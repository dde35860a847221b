"""``stenograph.model(fn)`` and ``@stenograph.tool``: the tape for code that does not speak HTTP.

A wrapped callable's calls land on the ``model`` or ``tool`` channel with a call
id, its arguments (for matching) and its result (a msgpack value; large bytes go
to the blob store) or the exception it raised. Replay returns the recorded result,
or raises the recorded exception, without calling the function. Outside
``stenograph record`` / ``replay`` the wrapper calls straight through.

The real call runs with the C shim's tape paused, in record mode: replay will not
run it, so what it reads (clocks, entropy) must not be on the program's tape. For the
same reason the hooked calls its body makes are numbered in its own scope
(``PyTape.begin``, ``Slot.inside``): served at replay, its body's calls never happen, and
every call after it must keep the number it had when recorded.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import inspect
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, overload

from stenograph.interpose import seam
from stenograph.interpose.exchange import error_body
from stenograph.interpose.fingerprint import fingerprint
from stenograph.interpose.pytape import IN_DECLARED_EFFECT, PyTape, ReplayExhausted, current
from stenograph.interpose.settings import loop_taped
from stenograph.recorder.blobs import BlobRef
from stenograph.recorder.codec import jsonable
from stenograph.recorder.exchanges import is_lost_body

F = TypeVar("F", bound=Callable[..., Any])


class RecordedCallError(Exception):
    """Replay of a call that raised an exception type it cannot rebuild."""

    def __init__(self, type_name: str, module: str, message: str) -> None:
        super().__init__(f"{module}.{type_name}: {message}")
        self.type_name, self.module, self.message = type_name, module, message


class UnrecordableResult(TypeError):
    """A wrapped call returned something the log cannot hold exactly."""


def _args_json(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    doc = {"args": jsonable(list(args)), "kwargs": jsonable(kwargs)}
    return json.dumps(doc, sort_keys=True, default=repr, ensure_ascii=False).encode()


def _check_value(value: Any, where: str) -> None:
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_value(v, where)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise UnrecordableResult(f"{where}: map key {k!r} is not a str or int")
            _check_value(v, where)
        return
    raise UnrecordableResult(
        f"{where} returned a {type(value).__name__}; return msgpack values (None, bool, int, "
        "float, str, bytes, list, dict) so replay can hand back exactly the same thing")


def _spill(tape: PyTape, value: Any) -> Any:
    if isinstance(value, bytes):
        return tape.spill(value)
    if isinstance(value, (list, tuple)):
        return [_spill(tape, v) for v in value]
    if isinstance(value, dict):
        if "$blob" in value:
            raise UnrecordableResult("a result may not contain a '$blob' key")
        return {k: _spill(tape, v) for k, v in value.items()}
    return value


def _unspill(tape: PyTape, value: Any) -> Any:
    if isinstance(value, dict):
        if "$blob" in value and len(value) == 2:
            return tape.resolve(BlobRef.from_body(value).to_body())
        if is_lost_body(value):  # the disk was full: resolve reports it
            return tape.resolve(value)
        return {k: _unspill(tape, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unspill(tape, v) for v in value]
    return value


def _rebuild(err: dict[str, Any]) -> BaseException:
    if (err.get("module"), err.get("type")) == ("stenograph.interpose.approvals",
                                                "ApprovalDenied"):
        from stenograph.interpose.approvals import ApprovalDenied

        return ApprovalDenied(err["message"])
    if (err.get("module"), err.get("type")) == (__name__, "PolicyDenied"):
        return PolicyDenied(err["message"])
    cls = getattr(builtins, err["type"], None) if err.get("module") == "builtins" else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls(err["message"])
    return RecordedCallError(err["type"], err.get("module", "?"), err["message"])


class _Call:
    """One call's bookkeeping, shared by the sync and async wrappers."""

    def __init__(self, tape: PyTape, channel: str, name: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.tape, self.channel, self.name = tape, channel, name
        self.slot = tape.begin(channel)
        self.stream, self.pos = self.slot.stream, self.slot.pos
        self.call_id = f"{name}#{self.pos}"
        body = _args_json(args, kwargs)
        self.request = {"method": "CALL", "url": f"{channel}:{name}", "body": body}
        self.fp = fingerprint("CALL", self.request["url"], body)
        self.occurrence = tape.occurrence(self.slot, self.fp)
        self.served = tape.resumed_entry(self.slot, self.fp)
        """The crashed run's result for this call, made again inside a body a resume
        runs again (``PyTape.resumed_entry``): returned, the function not called."""
        self.suspend: list[Any] = []  # async: how its waits ended (interpose.aioloop)
        if channel == "model" and not self.slot.nested:
            tape.mark_turn(self.stream, self.pos, self.fp)

    @property
    def replaying(self) -> bool:
        """Answered from the tape (replay, or ``served``), the function not called."""
        return self.tape.mode == "replay" or self.served is not None

    def entry(self) -> dict[str, Any]:
        if self.served is not None:
            return self.served
        try:
            return self.tape.take(self.stream, self.pos, self.request, self.fp)
        except ReplayExhausted as exc:
            raise RecordedCallError("ReplayExhausted", "stenograph", str(exc)) from None

    def replayed(self, entry: dict[str, Any] | None = None) -> Any:
        if entry is None:
            entry = self.entry()
        if entry.get("error"):
            raise _rebuild(entry["error"])
        return _unspill(self.tape, entry.get("result"))

    def recorded(self, result: Any = None, error: BaseException | None = None) -> None:
        if error is None:
            _check_value(result, f"{self.channel} {self.name!r}")
        entry = {
            "fingerprint": self.fp, "call_id": self.call_id,
            "request": {**self.request, "headers": [],
                        "body": self.tape.spill(self.request["body"])},
            "result": None if error is not None else _spill(self.tape, result),
            "error": None if error is None else error_body(error),
        }
        if self.suspend:
            entry["suspend"] = self.suspend
        self.tape.commit(self.stream, self.pos, entry)


@dataclass(frozen=True)
class EffectSpec:
    """A declared effect: ``@stenograph.tool(effect=True, idempotency_key=..., probe=...)``.
    ``idempotency_key`` is a string or a function of the call's arguments (the key the
    tool sends its service); without one stenograph derives one from the trajectory and
    the call. ``probe`` is a function of the same arguments telling whether the effect
    happened (for settling a call left in doubt)."""

    idempotency_key: str | Callable[..., str] | None = None
    probe: Callable[..., Any] | None = None
    effect: bool = True
    approval: bool | str | Callable[..., Any] | None = None
    """Hold each call for a person (``stenograph.approval``): ``True``, a summary, or a
    function of the call's arguments returning a summary (or something false: no hold)."""

    def summary(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """Why this call is held, or None when it is not."""
        held = self.approval(*args, **kwargs) if callable(self.approval) else self.approval
        if not held:
            return None
        return held if isinstance(held, str) else f"{name}{_args_json(args, kwargs).decode()}"

    def key(self, tape: PyTape, call: _Call, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> str:
        if callable(self.idempotency_key):
            return str(self.idempotency_key(*args, **kwargs))
        if self.idempotency_key is not None:
            return self.idempotency_key
        from stenograph.interpose.effects import idempotency_key

        return idempotency_key(tape.traj, tape.proc, call.stream, call.fp, call.occurrence)


_RUN = object()
"""``_intent``'s answer when the call is to run (anything else: its result, already
recorded: a resume's probe found the effect done)."""


def _settle_in_doubt(tape: PyTape, call: _Call, spec: EffectSpec, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
    """Resume: a declared effect left in doubt. With an idempotency key it runs again
    (its service sees the same key); else its probe decides: a result other than
    ``None``/``False`` means it happened (``True``: happened, no result to give), and
    the program gets that (returned) instead of a second run (``_RUN``); without
    either, a person decides."""
    cid = call.slot.call_id(tape.proc)
    target = f"tool {call.name}"
    if tape.settlement().how(cid, target, call.fp) is None or spec.idempotency_key is not None:
        return _RUN
    if spec.probe is None:
        tape.settlement().needs_person(cid, target, "the tool declares no idempotency key "
                                       "and no probe", call.request["body"])
    with _scope(spec), tape.shim.paused():
        found = spec.probe(*args, **kwargs)
    if found is None or found is False:
        return _RUN
    return None if found is True else found


class PolicyDenied(PermissionError):
    """The run's policy (``--policy``) does not allow this call."""


def _authorize(tape: PyTape, call: _Call) -> None:
    """A model call or a declared effect, authorized by the run's policy and budget."""
    if not tape.authorizing:
        return
    target = f"{call.channel} {call.name}" if call.channel == "model" else f"tool {call.name}"

    def refuse(exc: BaseException) -> NoReturn:
        call.recorded(error=exc)
        raise exc

    from stenograph.interpose.resume_plan import described

    seam.authorize(tape, call.slot.call_id(tape.proc), target, call.channel,
                   lambda msg, held: held if held is not None else PolicyDenied(msg), refuse,
                   described(target, call.request["body"]))


def _intent(tape: PyTape, call: _Call, spec: EffectSpec | None, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
    """Record: a held call's approval first (``stenograph.approval``: the run pauses, or
    ``ApprovalDenied``), then a declared effect's intent durable before the tool runs, or
    no run. ``_RUN``, or the result a resume's probe found (recorded: the call is done)."""
    if call.channel == "model" or (spec is not None and spec.effect):
        _authorize(tape, call)
    if spec is None:
        return _RUN
    if spec.approval is not None:
        summary = spec.summary(call.name, args, kwargs)
        if summary is not None:
            from stenograph.interpose.approvals import ApprovalDenied, approval

            try:
                approval(f"tool {call.name}", summary)
            except ApprovalDenied as exc:  # the call's outcome, on the tape like any
                call.recorded(error=exc)
                raise
    if not spec.effect:
        return _RUN
    if tape.fork:
        exc = seam.EffectRefused(f"stenograph fork: the effect tool {call.name} was not run "
                                 "(a fork runs no declared effect past its prefix)")
        call.recorded(error=exc)
        raise exc
    if tape.resuming and (found := _settle_in_doubt(tape, call, spec, args, kwargs)) is not _RUN:
        call.recorded(found)
        return found
    key = spec.key(tape, call, args, kwargs)
    if tape.resuming:
        plan = tape.settlement()
        cid = call.slot.call_id(tape.proc)
        if plan.how(cid, f"tool {call.name}", call.fp) is not None:
            key = plan.key_of(cid) or key
        elif spec.idempotency_key is None:
            plan.check_fresh(cid, key)
    if not tape.intent(call.stream, call.pos, f"tool {call.name}", call.request["body"],
                       key, call.fp):
        exc = seam.IntentNotDurable(f"stenograph could not make the intent of tool "
                                    f"{call.name} durable; it was not run")
        call.recorded(error=exc)
        raise exc
    return _RUN


@contextlib.contextmanager
def _scope(spec: EffectSpec | None) -> Iterator[None]:
    """A declared effect's run: the HTTP calls inside are its own (``IN_DECLARED_EFFECT``)."""
    if spec is None or not spec.effect:
        yield
        return
    token = IN_DECLARED_EFFECT.set(True)
    try:
        yield
    finally:
        IN_DECLARED_EFFECT.reset(token)


def _wrap(fn: F, channel: str, name: str | None, spec: EffectSpec | None = None) -> F:
    label = name or getattr(fn, "__qualname__", getattr(fn, "__name__", "call"))

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            tape = current()
            if tape is None:
                return await fn(*args, **kwargs)
            if not loop_taped():
                with tape.shim.paused():
                    call = _Call(tape, channel, label, args, kwargs)
                    if call.replaying:
                        return call.replayed()
                    with call.slot.inside():
                        if (done := _intent(tape, call, spec, args, kwargs)) is not _RUN:
                            return done
                        try:
                            with _scope(spec):
                                result = await fn(*args, **kwargs)
                        except Exception as exc:
                            call.recorded(error=exc)
                            raise
                    call.recorded(result)
                    return result
            with tape.shim.paused():
                call = _Call(tape, channel, label, args, kwargs)
            if call.replaying:
                with tape.shim.paused():
                    entry = call.entry()
                if tape.mode == "replay":
                    await seam._aioloop().replay_suspensions(tape, entry.get("suspend"))
                with tape.shim.paused():
                    return call.replayed(entry)
            with call.slot.inside():
                with tape.shim.paused():
                    if (done := _intent(tape, call, spec, args, kwargs)) is not _RUN:
                        return done
                try:
                    with _scope(spec):
                        result = await seam._aioloop().Drive(tape, fn(*args, **kwargs),
                                                             call.suspend)
                except Exception as exc:
                    with tape.shim.paused():
                        call.recorded(error=exc)
                    raise
            with tape.shim.paused():
                call.recorded(result)
            return result
        return awrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tape = current()
        if tape is None:
            return fn(*args, **kwargs)
        with tape.shim.paused():
            call = _Call(tape, channel, label, args, kwargs)
            if call.replaying:
                return call.replayed()
            with call.slot.inside():
                if (done := _intent(tape, call, spec, args, kwargs)) is not _RUN:
                    return done
                try:
                    with _scope(spec):
                        result = fn(*args, **kwargs)
                except Exception as exc:
                    call.recorded(error=exc)
                    raise
            call.recorded(result)
            return result
    return wrapper  # type: ignore[return-value]


@overload
def model(fn: F, *, name: str | None = None) -> F: ...
@overload
def model(fn: None = None, *, name: str | None = None) -> Callable[[F], F]: ...
def model(fn: F | None = None, *, name: str | None = None) -> F | Callable[[F], F]:
    """Put a model-calling function on the ``model`` channel: ``chat = stenograph.model(chat)``."""
    if fn is None:
        return lambda f: _wrap(f, "model", name)
    return _wrap(fn, "model", name)


@overload
def tool(fn: F, *, name: str | None = None, effect: bool = False,
         idempotency_key: str | Callable[..., str] | None = None,
         probe: Callable[..., Any] | None = None,
         approval: bool | str | Callable[..., Any] | None = None) -> F: ...
@overload
def tool(fn: None = None, *, name: str | None = None, effect: bool = False,
         idempotency_key: str | Callable[..., str] | None = None,
         probe: Callable[..., Any] | None = None,
         approval: bool | str | Callable[..., Any] | None = None) -> Callable[[F], F]: ...
def tool(fn: F | None = None, *, name: str | None = None, effect: bool = False,
         idempotency_key: str | Callable[..., str] | None = None,
         probe: Callable[..., Any] | None = None,
         approval: bool | str | Callable[..., Any] | None = None) -> F | Callable[[F], F]:
    """Put a tool on the ``tool`` channel: ``@stenograph.tool`` or ``@tool(name=...)``.

    ``effect=True`` declares that it changes the world: under record its intent
    (arguments, ``idempotency_key``, the fencing epoch) is durable before it runs. If a
    crash leaves it in doubt, ``stenograph resume`` runs it again when it declares an
    ``idempotency_key`` (its service sees the same key), else asks ``probe`` (called with
    the same arguments: the result if the effect happened, ``True`` if it has none,
    ``None``/``False`` if it did not), else stops for a person (exit 4).

    ``approval`` holds each call for a person first (``stenograph.approval``): ``True``, a
    summary string, or a function of the arguments returning one (false: not held)."""
    spec = (EffectSpec(idempotency_key, probe, effect, approval)
            if effect or approval is not None else None)
    if fn is None:
        return lambda f: _wrap(f, "tool", name, spec)
    return _wrap(fn, "tool", name, spec)
