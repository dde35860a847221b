"""MCP tool calls, as the official SDK's ``ClientSession`` makes them (mcp 1.x and 2.x;
the OpenAI Agents SDK, pydantic-ai and others go through it).

An MCP server the agent starts is a child of the recorded tree: its pipes and its work
are on the tape, and a replay runs both ends (a server reached over HTTP is served by the
HTTP hooks instead). What the tape does not say is *which tool was called with what*:
that is in the JSON-RPC bytes. So each ``tools/call`` is also a call on this process's
``mcp`` stream, with one shape in every mode (``McpCall``):

* **record**: a tool whose annotations do not say ``readOnlyHint`` (the spec's default:
  it acts) is an effect: the policy is asked (target ``mcp SERVER/TOOL``, with its hints
  after it for rules to match: ``mcp files/delete destructive``), then its ``ToolIntent``
  -- carrying ``idempotentHint`` -- is durable before the request is written to the
  server. Every call's entry (arguments, the whole result) is committed when it answers.
* **replay**: the call is checked against its entry (a different tool or arguments is a
  divergence, reported before anything is written to the server) and then made: the
  server is replayed too. A call the recording never sent (the policy denied it; a
  person settled it done) is answered from its entry.
* **resume**: a call the crash left in doubt is sent again when the tool says it is
  idempotent, else a policy probe or a person settles it before the resume runs
  (``runner/resume.py``); settled done, the program gets the recorded or given answer and
  the server is not asked.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from stenograph.interpose import effects
from stenograph.interpose.fingerprint import fingerprint
from stenograph.interpose.pytape import PyTape, ReplayExhausted, current

CHANNEL = "mcp"
NO_ANSWER = ("stenograph: this call was made before the run was interrupted; its answer "
             "was not recorded")
"""The text a call settled done without an answer is answered with."""


@dataclass(frozen=True)
class Hints:
    """A tool's annotations, with the spec's defaults for what it does not say."""

    read_only: bool = False
    destructive: bool = True
    idempotent: bool = False

    @classmethod
    def of(cls, tool: Any) -> Hints:
        ann = getattr(tool, "annotations", None)
        if ann is None:
            return cls()

        def hint(snake: str, camel: str, default: bool) -> bool:
            v = getattr(ann, snake, getattr(ann, camel, None))
            return default if v is None else bool(v)

        return cls(hint("read_only_hint", "readOnlyHint", False),
                   hint("destructive_hint", "destructiveHint", True),
                   hint("idempotent_hint", "idempotentHint", False))

    def words(self) -> str:
        if self.read_only:
            return "read-only"
        return " ".join(w for w, on in (("destructive", self.destructive),
                                        ("idempotent", self.idempotent)) if on)


@dataclass
class _Known:
    """What a session learned from its server: its name, its tools' hints."""

    server: str = ""
    hints: dict[str, Hints] | None = None


def _known(session: Any) -> _Known:
    k = getattr(session, "_stenograph_mcp", None)
    if k is None:
        k = _Known()
        session._stenograph_mcp = k
    return k


def _dump(result: Any) -> bytes:
    dump = getattr(result, "model_dump", None)
    doc = dump(mode="json", by_alias=True, exclude_none=True) if dump else result
    return json.dumps(doc, sort_keys=True, default=str, ensure_ascii=False).encode()


def _failed(result: Any) -> bool:
    return bool(getattr(result, "is_error", getattr(result, "isError", False)))


def _rebuilt(doc: Any) -> Any:
    """A ``CallToolResult`` from a recorded or given answer (any JSON: not one already
    is the text of one)."""
    from mcp import types

    if doc is None:
        doc = {"content": [{"type": "text", "text": NO_ANSWER}]}
    elif not (isinstance(doc, dict) and isinstance(doc.get("content"), list)):
        doc = {"content": [{"type": "text", "text": json.dumps(doc)}]}
    return types.CallToolResult.model_validate(doc)


class McpCall:
    """One ``tools/call``: its place on the ``mcp`` stream and what record, replay and
    resume do before and after the request (``before``/``after``)."""

    def __init__(self, tape: PyTape, session: Any, name: str, arguments: Any) -> None:
        self.tape, self.name = tape, name
        known = _known(session)
        self.server = known.server or _server_name(session) or "?"
        self.hints = (known.hints or {}).get(name, Hints())
        self.slot = tape.begin(CHANNEL)
        self.args = json.dumps(arguments or {}, sort_keys=True, default=str,
                               ensure_ascii=False).encode()
        self.target = f"mcp {self.server}/{name}"
        self.request = {"method": "CALL", "url": f"{CHANNEL}:{self.server}/{name}",
                        "body": self.args}
        self.fp = fingerprint("CALL", self.request["url"], self.args)
        self.cid = self.slot.call_id(tape.proc)
        self.effect = not self.hints.read_only

    def before(self) -> Any:
        """None: make the call. Else the answer the program gets instead (the call is
        not sent to the server)."""
        tape = self.tape
        if tape.mode == "replay":
            try:
                entry = tape.take(self.slot.stream, self.slot.pos, self.request, self.fp)
            except ReplayExhausted:
                return None  # reported (lenient replay): the call is made, unchecked
            return self._served(entry)
        resumed = tape.resumed_entry(self.slot, self.fp)
        if resumed is not None and (resumed.get("settled_by_person")
                                    or resumed.get("result") is not None):
            return self._served(resumed) or self._answer(resumed)  # (live, but known)
        if not self.effect:
            return None
        if tape.authorizing:
            refused = self._authorize()
            if refused is not None:
                return refused
        how = tape.settlement().how(self.cid, self.target, self.fp) if tape.resuming else None
        if how not in (None, "reissue"):  # (the resume settles these before it runs)
            tape.settlement().needs_person(self.cid, self.target, "the tool does not say it "
                                           "is idempotent", self.args)
        if not tape.intent(self.slot.stream, self.slot.pos, self.target, self.args, None,
                           self.fp, extra={"idempotent": self.hints.idempotent,
                                           "arguments": self.args.decode("utf-8", "replace")}):
            return self._refuse("stenograph could not make the intent of this call durable; "
                                "it was not sent")
        return None

    def _served(self, entry: dict[str, Any]) -> Any:
        """The answer an entry gives without the server being asked, if it is one."""
        if entry.get("settled_by_person"):  # a person's (or probe's) word, not an entry
            return _rebuilt(entry.get("result"))
        if entry.get("served"):
            return self._answer(entry)
        return None

    def _authorize(self) -> Any:
        from stenograph.interpose import seam
        from stenograph.interpose.resume_plan import described

        refusal: list[Any] = []

        def refuse(exc: BaseException) -> Any:
            refusal.append(self._refuse(str(exc)))
            raise _Refused

        try:
            seam.authorize(self.tape, self.cid, f"{self.target} {self.hints.words()}".rstrip(),
                           CHANNEL, lambda msg, _held: PermissionError(msg), refuse,
                           described(self.target, self.args))
        except _Refused:
            return refusal[0]
        return None

    def _refuse(self, message: str) -> Any:
        """The call is not sent: the program gets a tool error saying why, recorded as
        the call's answer (a replay gives it again without asking the server)."""
        result = _rebuilt({"content": [{"type": "text", "text": message}], "isError": True})
        self._commit(result, None, served=True)
        return result

    def _answer(self, entry: dict[str, Any]) -> Any:
        body = entry.get("result")
        data = None if body is None else self.tape.resolve(body)
        return _rebuilt(None if data is None else json.loads(data))

    def after(self, result: Any, error: BaseException | None) -> None:
        if self.tape.mode == "record":
            self._commit(result, error)

    def _commit(self, result: Any, error: BaseException | None, served: bool = False) -> None:
        from stenograph.interpose.exchange import error_body

        data = None if error is not None else _dump(result)
        entry: dict[str, Any] = {
            "fingerprint": self.fp, "call_id": f"{self.name}#{self.slot.pos}",
            "request": {**self.request, "headers": [], "body": self.tape.spill(self.args)},
            "result": None if data is None else self.tape.spill(data),
            "error": None if error is None else error_body(error),
            "failed": error is not None or _failed(result),
            "hints": self.hints.words()}
        if served:
            entry["served"] = True
        self.tape.commit(self.slot.stream, self.slot.pos, entry)


class _Refused(Exception):
    pass


def _taped(tape: PyTape) -> bool:
    """Whether calls go on the ``mcp`` stream: under record and resume, and in a replay
    of a recording that has one (one made before MCP calls were taped has none)."""
    if tape.mode == "record" or tape.resuming:
        return True
    return CHANNEL in tape.streams()


def install(mod: Any) -> None:
    """Wrap ``mod.ClientSession``'s ``initialize``, ``list_tools`` and ``call_tool`` (once)."""
    cls = getattr(mod, "ClientSession", None)
    if cls is None or getattr(getattr(cls, "call_tool", None), "_stenograph", False):
        return
    _wrap(cls, "initialize", _learn_server)
    _wrap(cls, "list_tools", _learn_tools)
    orig: Callable[..., Awaitable[Any]] = cls.call_tool

    async def call_tool(self: Any, name: str, arguments: Any = None, *args: Any,
                        **kwargs: Any) -> Any:
        tape = current()
        if tape is None:
            return await orig(self, name, arguments, *args, **kwargs)
        with tape.shim.paused():
            call = McpCall(tape, self, name, arguments) if _taped(tape) else None
            answer = call.before() if call is not None else None
        if call is None:
            return await orig(self, name, arguments, *args, **kwargs)
        if answer is not None:
            return answer
        effects.mcp_calls_in_flight += 1
        try:
            result = await orig(self, name, arguments, *args, **kwargs)
        except BaseException as exc:
            with tape.shim.paused():
                call.after(None, exc)
            raise
        finally:
            effects.mcp_calls_in_flight -= 1
        with tape.shim.paused():
            call.after(result, None)
        return result

    _mark(call_tool, orig)
    cls.call_tool = call_tool


def _info_name(result: Any) -> str | None:
    info = getattr(result, "server_info", getattr(result, "serverInfo", None))
    name = getattr(info, "name", None)
    return name if isinstance(name, str) else None


def _learn_server(session: Any, result: Any) -> None:
    name = _info_name(result)
    if name is not None:
        _known(session).server = name


def _server_name(session: Any) -> str | None:
    """The server's name from a session set up without ``initialize`` (mcp 2.x's client
    adopts the result of its own handshake, ``initialize`` or ``server/discover``)."""
    try:
        name = getattr(getattr(session, "server_info", None), "name", None)
    except Exception:  # a property that cannot answer yet
        name = None
    if isinstance(name, str):
        return name
    for attr in ("initialize_result", "discover_result"):
        try:
            name = _info_name(getattr(session, attr, None))
        except Exception:  # a property that cannot answer yet
            continue
        if name is not None:
            return name
    return None


def _learn_tools(session: Any, result: Any) -> None:
    known = _known(session)
    hints = dict(known.hints or {})
    for tool in getattr(result, "tools", None) or []:
        hints[str(getattr(tool, "name", ""))] = Hints.of(tool)
    known.hints = hints


def _wrap(cls: Any, method: str, learn: Callable[[Any, Any], None]) -> None:
    orig = getattr(cls, method, None)
    if orig is None:
        return

    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await orig(self, *args, **kwargs)
        learn(self, result)
        return result

    _mark(wrapper, orig)
    setattr(cls, method, wrapper)


def _mark(wrapper: Any, orig: Any) -> None:
    wrapper._stenograph = True
    wrapper.__wrapped__ = orig
    wrapper.__name__, wrapper.__doc__ = orig.__name__, orig.__doc__
