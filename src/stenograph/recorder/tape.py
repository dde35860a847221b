"""The process tape: the recorder end of the C shim's protocol (docs/shim-protocol.md).

Record: a ``RecordSession`` listens on a unix SOCK_SEQPACKET socket. Every process of
the recorded tree connects and hands over its arena of per-thread rings in shared
memory (``rings``); what a drain takes from one ring becomes one ``TapeChunk`` event
``{"proc", "thread", "data"}`` appended without waiting for a sync (a start-up alone
makes ~1000 clock reads); a barrier or exit message is answered with one byte once
everything the process taped before it has been appended (ordering); the store is
synced by the recorder at least every 0.2 s.

Replay: ``prepare_tape`` splits the chunks of a trajectory back into per-stream files
``TAPE/<proc>/<thread>.<channel>`` -- the concatenated records of that stream, in log
order -- which the shim maps and serves.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder import chunks as chunks_mod
from stenograph.recorder.codec import Event
from stenograph.recorder.commands import Commands, command_line
from stenograph.recorder.errors import CorruptLog
from stenograph.recorder.rings import Arena, Drained, process_gone
from stenograph.recorder.seqpacket import SeqpacketServer
from stenograph.recorder.tapesecrets import Redactor, masked_sends

MAGIC = b"STP1"
MSG_DATA, MSG_BARRIER, MSG_EXIT, MSG_RING, MSG_NUDGE, MSG_BIG, MSG_SYNC = 1, 2, 3, 4, 5, 6, 7
MSG_INTENT, MSG_RESULT, MSG_EXEC = 8, 9, 10
ANS_REFUSED, ANS_GO, ANS_SKIP, ANS_ANSWERED = 0, 1, 2, 3
HEADER = struct.Struct("<4sHHIH")
_ARENA_ID = struct.Struct("<Q")
RECORD = struct.Struct("<BBHI")
CHANNELS = {1: "clock", 2: "entropy", 3: "dirents", 4: "identity", 5: "wait", 6: "io",
            7: "sched", 8: "meta", 9: "signal", 10: "net"}
CHANNEL_IDS = {v: k for k, v in CHANNELS.items()}
DIVERGENCE_EXIT = 86
MAX_MESSAGE = 8 << 20

_PROC_RE = re.compile(r"0(\.[1-9][0-9]{0,8}){0,64}")

OP_NAMES = {
    (1, 1): "clock_gettime", (1, 2): "gettimeofday", (1, 3): "time", (1, 4): "timespec_get",
    (1, 5): "clock", (2, 1): "getrandom", (2, 2): "getentropy", (2, 3): "read(/dev/urandom)",
    (2, 4): "syscall-instruction(getrandom)",
    (3, 1): "opendir", (4, 1): "getpid", (4, 2): "getppid", (4, 3): "gettid",
    (4, 4): "gethostname", (4, 5): "uname", (4, 6): "procinfo",
    (4, 7): "fork", (4, 8): "posix_spawn", (4, 9): "wait", (4, 10): "waitid",
    (4, 11): "getpgid", (4, 12): "getsid", (4, 13): "exit",
    (5, 1): "nanosleep", (5, 2): "clock_nanosleep",
    (5, 3): "sleep", (5, 4): "usleep", (5, 5): "poll", (5, 6): "select", (5, 7): "epoll_wait",
    (5, 8): "asyncio loop tick",
    (6, 1): "read(pipe)", (6, 2): "poll(pipes)", (6, 3): "waitpid(WNOHANG)",
    (6, 4): "exec (recorded whole)", (6, 5): "output (recorded whole)",
    (6, 6): "exit (recorded whole)", (6, 7): "accept", (6, 8): "rename",
    (7, 1): "thread start", (7, 2): "mutex wait", (7, 3): "condition wait",
    (7, 4): "semaphore wait", (7, 5): "after sleep", (7, 6): "after I/O wait",
    (7, 7): "after pthread_join", (7, 8): "sched_yield", (7, 9): "futex wait",
    (7, 10): "after waiting for a child", (7, 11): "after a run of clock reads",
    (8, 1): "fstatat", (8, 2): "statx",
    (4, 20): "ioctl(SIOCGIF*)", (9, 1): "signal handler",
    (10, 1): "connect", (10, 2): "send", (10, 3): "recv", (10, 4): "socket call",
    (10, 5): "epoll_wait(connections)", (10, 6): "connect (the tree's own)",
    (10, 7): "bind(port 0)", (10, 8): "the tree's own server?",
}


def check_proc(proc: str) -> str:
    """A process path is ``0`` followed by ``.N`` parts, at most a file name long (it names
    a directory of TAPE/); anything else could escape TAPE/ or fail to be made."""
    if not isinstance(proc, str) or len(proc) > 255 or not _PROC_RE.fullmatch(proc):
        raise CorruptLog(f"bad process path {proc!r} in a tape chunk", "tape", 0)
    return proc


def iter_records(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(channel, op, payload) of every record in a chunk; ``ValueError`` if truncated."""
    off, end = 0, len(data)
    while off < end:
        if off + RECORD.size > end:
            raise ValueError(f"truncated record header at byte {off}")
        ch, op, _flags, n = RECORD.unpack_from(data, off)
        off += RECORD.size
        if off + n > end:
            raise ValueError(f"record at byte {off - RECORD.size} runs past the chunk")
        yield ch, op, data[off:off + n]
        off += n


def iter_runs(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """Runs of consecutive records of one channel and one payload size, as
    ``(channel, start, end, ops)`` (``ops``: each record's op byte) -- what
    ``iter_records`` gives, found with strided slices at C speed: a chunk of 4,000
    clock reads is one run, found in a dozen slice compares instead of 4,000 header
    unpacks. ``ValueError`` if truncated, as ``iter_records``."""
    off, end = 0, len(data)
    while off < end:
        if off + RECORD.size > end:
            raise ValueError(f"truncated record header at byte {off}")
        ch, _op, _site, n = RECORD.unpack_from(data, off)
        stride = RECORD.size + n
        if off + stride > end:
            raise ValueError(f"record at byte {off} runs past the chunk")
        m = (end - off) // stride
        k = _same_run(data, off, stride, m) if m > 1 else 1
        stop = off + k * stride
        yield ch, off, stop, data[off + 1:stop:stride]
        off = stop


def _same_run(data: bytes, off: int, stride: int, m: int) -> int:
    """How many of the ``m`` records at ``stride`` from ``off`` have the first one's
    channel and length bytes: the longest such prefix, by galloping then bisection, so
    a mixed chunk costs a short compare per record and a run of k records O(k log k)."""
    cols = [(i, data[off + i:off + i + 1]) for i in (0, 4, 5, 6, 7)]

    def agree(k: int) -> bool:
        return all(data[off + i:off + k * stride:stride] == b * k for i, b in cols)

    lo, k = 1, 2
    while k <= m and agree(k):
        lo, k = k, k * 2
    if k > m:
        if lo == m or agree(m):
            return m
        k = m
    while k - lo > 1:  # agree(lo), not agree(k)
        mid = (lo + k) // 2
        if agree(mid):
            lo = mid
        else:
            k = mid
    return lo


def describe(ch: int, op: int, payload: bytes) -> str:
    """A human line for one record (for divergence reports: "the last events before it")."""
    name = OP_NAMES.get((ch, op), f"op{op}")
    try:
        if ch == 1:
            arg, rc, a, b = struct.unpack_from("<iiqq", payload)
            args = f"clock={arg}" if op == 1 else (f"base={arg}" if op == 4 else "")
            val = f"{a}.{b:09d}" if op in (1, 4) else (f"{a}.{b:06d}" if op == 2 else f"{a}")
            return f"{name}({args}) -> {val}" + (f" rc={rc}" if rc and op != 4 else "")
        if ch == 2:
            size = struct.unpack_from("<I", payload)[0]
            body = payload[16:] if op in (1, 4) else payload[8:]
            return f"{name}(size={size}) -> {body[:16].hex()}{'...' if len(body) > 16 else ''}"
        if ch == 3:
            (pl,) = struct.unpack_from("<H", payload)
            path = payload[2:2 + pl].decode(errors="replace")
            err, count = struct.unpack_from("<iI", payload, 2 + pl)
            return f"{name}(path={path}) -> " + (f"errno {err}" if err else f"{count} entries")
        if ch == 4:
            if op in (1, 2, 3):
                return f"{name}() -> {struct.unpack_from('<i', payload)[0]}"
            if op == 4:
                k = struct.unpack_from("<I", payload, 8)[0]
                host = payload[12:12 + k].rstrip(b"\0").decode(errors="replace")
                return f"{name}() -> {host}"
            if op == 7:
                return f"{name}() -> {struct.unpack_from('<i', payload)[0]}"
            if op == 8:
                rc, pid = struct.unpack_from("<ii", payload)
                return f"{name}() -> " + (f"error {rc}" if rc else f"pid {pid}")
            if op == 9:
                pid, opts, res, status = struct.unpack_from("<iiii", payload)
                return f"{name}(pid={pid}, options={opts}) -> {res}, status {status}"
            if op == 10:
                idtype, ident, opts, rc, spid, code, status = struct.unpack_from("<7i", payload)
                return (f"{name}(idtype={idtype}, id={ident}, options={opts}) -> "
                        + (f"{rc}" if rc else f"pid {spid}, code {code}, status {status}"))
            if op in (11, 12):
                pid, res = struct.unpack_from("<ii", payload)
                return f"{name}({pid}) -> {res}"
            return f"{name}()"
        if ch == 8:
            return _describe_meta(name, op, payload)
        if ch == 5:
            return f"{name}({payload[:24].hex()})"
        if ch == 6 and op == 1:
            asked, got = struct.unpack_from("<Ii", payload)
            return f"{name}(size={asked}) -> {got}"
        if ch == 7:
            grant, result = struct.unpack_from("<Ii", payload)
            return f"{name} -> turn {grant}" + (f", outcome {result}" if result else "")
        if ch == 9 and op == 1:
            pos, k, sig, flags = struct.unpack_from("<IIiI", payload)
            return (f"{name}(signal {sig}) at record {pos}"
                    + (f" after {k} mask calls" if k else "")
                    + (" (untaped)" if flags & 1 else ""))
        if ch == 10:
            return _describe_net(name, op, payload)
        if ch == 6 and op == 2:
            timeout, nfds = struct.unpack_from("<iI", payload)
            (res,) = struct.unpack_from("<i", payload, 8 + 2 * nfds)
            return f"{name}(timeout_ms={timeout}, nfds={nfds}) -> {res}"
    except struct.error:
        pass
    return f"{name}(<{len(payload)} bytes>)"


def net_address(payload: bytes) -> str:
    """The peer an ``OP_NET_CONNECT`` record names: ``127.0.0.1:8080``, ``unix /run/x``."""
    family, port, n = struct.unpack_from("<HHI", payload)
    raw = payload[8:8 + n]
    if family == socket.AF_UNIX:
        return "unix " + raw.replace(b"\0", b"@").decode(errors="replace")
    host = socket.inet_ntop(family, raw)
    return f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"


def _describe_net(name: str, op: int, payload: bytes) -> str:
    if op == 1:
        n = struct.unpack_from("<I", payload, 4)[0]
        (res,) = struct.unpack_from("<i", payload, 8 + n)
        return f"{name}({net_address(payload)}) -> {res}"
    if op == 6:
        n = struct.unpack_from("<I", payload, 4)[0]
        res, _resolved, lport = struct.unpack_from("<iII", payload, 8 + n)
        return f"{name}({net_address(payload)}) -> {res}, from port {lport}"
    if op == 7:
        fam, res, port = struct.unpack_from("<IiI", payload)
        return f"{name}({'IPv6' if fam == socket.AF_INET6 else 'IPv4'}) -> {res}, port {port}"
    if op == 8:
        port = struct.unpack_from("<I", payload)[0]
        host = payload[4:-4].decode("ascii", "replace")
        return f"{name}({host}:{port}) -> {'yes' if payload[-4:] != bytes(4) else 'no'}"
    if op == 5:
        timeout, _max, res, n = struct.unpack_from("<iiiI", payload)
        conns = sum(1 for i in range(n)
                    if struct.unpack_from("<I", payload, 16 + 16 * i)[0] != 0xFFFFFFFF)
        return f"{name}(timeout_ms={timeout}) -> {res} ({conns} of connections)"
    conn = struct.unpack_from("<I", payload)[0]
    if op == 2:
        asked, res, _digest, head = struct.unpack_from("<IiQI", payload, 4)
        text = payload[28:28 + head].decode("latin-1").encode("unicode_escape").decode()
        return f"{name}(connection #{conn}, {asked} bytes) -> {res} {text!r}"
    if op == 3:
        asked, res = struct.unpack_from("<Ii", payload, 4)
        return f"{name}(connection #{conn}, at most {asked}) -> {res}"
    kind, level, opt, rc = struct.unpack_from("<Iiii", payload, 4)
    kinds = {1: "getsockopt", 2: "getsockname", 3: "getpeername", 4: "setsockopt",
             5: "shutdown"}
    return f"{kinds.get(kind, name)}(connection #{conn}, {level}, {opt}) -> {rc}"


def _describe_meta(name: str, op: int, payload: bytes) -> str:
    hdr = 16 if op == 2 else 12
    cwd, flags = struct.unpack_from("<ii", payload)
    (pl,) = struct.unpack_from("<I", payload, hdr - 4)
    path = payload[hdr:hdr + pl].decode(errors="replace")
    fd, rc = struct.unpack_from("<ii", payload, hdr + pl)
    args = (f"fd={fd}, " if cwd != -100 else "") + f"path={path}" + (
        f", flags={flags}" if flags else "")
    if rc:
        return f"{name}({args}) -> errno {-rc}"
    st = payload[hdr + pl + 8:]
    if op == 1:  # struct stat: st_ino @8, st_size @48, st_mtim @88
        ino, size = struct.unpack_from("<Q", st, 8)[0], struct.unpack_from("<q", st, 48)[0]
        sec, nsec = struct.unpack_from("<qq", st, 88)
    else:  # struct statx: stx_ino @32, stx_size @40, stx_mtime @112
        ino, size = struct.unpack_from("<QQ", st, 32)
        sec, nsec = struct.unpack_from("<qI", st, 112)
    return f"{name}({args}) -> ino {ino}, size {size}, mtime {sec}.{nsec:09d}"


# ----------------------------------------------------------------------------- record


@dataclass
class SessionStats:
    chunks: int = 0
    bytes: int = 0
    barriers: int = 0
    procs: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)
    """Resume: requests the log knew, answered (or refused) rather than made again."""


@dataclass
class _Peer:
    """What one connection is: its process and (once announced) that process's arena."""

    proc: str
    arena: Arena | None = None


@dataclass(frozen=True)
class LiveReply:
    """A resume's answer to a process that reaches, live, a request the log knows
    (``recorder/answers.py`` decides it): ``redo`` (made again, as ``<call>@<epoch>``),
    ``ask`` (the policy and a person's approval decide), ``answer`` (a stand-in on
    127.0.0.1 answers it: ``open()`` starts it and gives its port), ``refuse``."""

    action: str
    open: Callable[[], int] | None = None


@dataclass(frozen=True)
class GivenOutput:
    """A command a person settled done with its output: where the output is, and the
    status its process ends with instead of running it."""

    path: str
    status: int


class RecordSession:
    """Take the tape of every process of a recorded tree and append it to ``store``.

    Each process's records are in its arena of shared rings (``rings.Arena``); its
    connection announces the arena, asks for drains (barriers, before exec and exit,
    and when a ring is full), nudges (a ring half full) and carries the rare record
    too big for a ring. Arenas are drained on those requests, every ``DRAIN_EVERY``
    seconds, when a connection ends (a process that dies, however it dies: nothing it
    taped is lost), and at ``close``.
    """

    DRAIN_EVERY = 0.05

    def __init__(self, store: Any, traj: str, sock_path: str | Path, *, epoch: int = 0,
                 authorize: Callable[[str, str, str], dict[str, Any]] | None = None) -> None:
        self.epoch = epoch
        """The worker's lease epoch, which the effects on taped connections carry."""
        self.authorize = authorize
        """``(call_id, target, channel) -> {"decision", ...}``: the run's policy and budget
        (``ExchangeServer.decide``), asked before an effect on a taped connection and
        before every exec."""
        self.commands = Commands()
        """Which command lines are effects (``recorder/commands.py``)."""
        self.settled: dict[str, str] = {}
        """Resume: a person's decision (``done``, ``not-done``) on effects left in doubt,
        or ``answered`` (the log holds its own result: a prefix replays it)."""
        self.known: set[str] = set()
        """Resume: the call ids whose intents the log holds (their execs are replayed)."""
        self.replies: dict[str, LiveReply] = {}
        """Resume: what a request the log knows is told when a process reaches it live,
        by the call id its shim computes."""
        self.outputs: dict[str, GivenOutput] = {}
        """Resume: by process, the command settled done with its output, not run: the
        first exec that process makes live is answered with it."""
        self.approvals: dict[str, dict[str, Any]] = {}
        """Resume: the held calls not yet used, with a person's decision when there is one
        (``resumes.ResumePlan.approvals``)."""
        self.after_intent: Callable[[], None] | None = None
        """Called once an effect's intent is durable, before the program is answered
        (``--db``: the intent into the warm tier too)."""
        self.on_hold: Callable[[str, str, str], None] | None = None
        """``(call_id, target, summary)``: the policy holds an effect for a person -- the
        request made durable and the recorded tree stopped (``LiveSession.hold``)."""
        self._pending: dict[str, str] = {}  # proc -> the exec effect it is running
        self._renamed: dict[str, str] = {}  # a redone effect's call id -> its new one
        self._commands: dict[str, str] = {}  # proc -> the command line it last exec'd
        self.redact: Redactor | None = None
        """The run's redaction of command lines, requests and send heads before they are
        appended (``recorder/tapesecrets.py``); None: appended as the shim sent them."""
        self.store = store
        self.traj = traj
        self.stats = SessionStats()
        self._lock = threading.Lock()
        self._peers: dict[socket.socket, _Peer] = {}
        self._arenas: dict[int, Arena] = {}
        self._live: dict[int, int] = {}  # arena id -> open connections naming it
        self._proc_of: dict[int, str] = {}  # arena id -> the process writing it
        self._stop = threading.Event()
        self._server = SeqpacketServer(sock_path, self._handle, name="steno-accept",
                                       max_message=MAX_MESSAGE, rcvbuf=4 << 20,
                                       fd_handler=self._handle_fds, on_close=self._closed,
                                       quick=self._quick, peek=HEADER.size + 600)
        self.sock_path = self._server.path
        self.stats.errors = self._server.errors
        self._drainer = threading.Thread(target=self._drain_loop, name="steno-drain",
                                         daemon=True)
        self._drainer.start()

    # -- messages

    def _quick(self, head: bytes) -> bool:
        """Handled on the server's loop (``SeqpacketServer``): what only drains a ring and
        queues appends -- an arena announced, a barrier, a nudge, the exit of a process
        that runs no exec effect (whose result waits for a sync)."""
        if len(head) < HEADER.size:
            return False
        magic, mtype, _zero, _thread, plen = HEADER.unpack_from(head)
        if magic != MAGIC:
            return False
        if mtype in (MSG_RING, MSG_BARRIER, MSG_NUDGE):
            return True
        if mtype != MSG_EXIT or len(head) < HEADER.size + plen:
            return False
        proc = head[HEADER.size:HEADER.size + plen].decode("ascii", "replace")
        with self._lock:
            return proc not in self._pending

    def _parse(self, msg: bytes) -> tuple[int, int, str, bytes]:
        if len(msg) < HEADER.size:
            raise ValueError(f"short message ({len(msg)} bytes)")
        magic, mtype, _zero, thread, plen = HEADER.unpack_from(msg)
        if magic != MAGIC:
            raise ValueError(f"bad magic {magic!r}")
        proc = check_proc(msg[HEADER.size:HEADER.size + plen].decode())
        return mtype, thread, proc, msg[HEADER.size + plen:]

    def _handle_fds(self, conn: socket.socket, msg: bytes, fds: list[int]) -> None:
        for extra in fds[1:]:
            os.close(extra)
        try:
            mtype, _thread, proc, body = self._parse(msg)
            if mtype != MSG_RING:
                raise ValueError(f"a descriptor came with message type {mtype}")
        except Exception:
            os.close(fds[0])
            raise
        arena_id = _ARENA_ID.unpack_from(body)[0] if len(body) >= _ARENA_ID.size else None
        with self._lock:
            known = self._arenas.get(arena_id) if arena_id is not None else None
        if known is not None:
            os.close(fds[0])
        else:
            known = Arena(fds[0])
            with self._lock:
                self._arenas[known.id] = known
        self._attach(conn, proc, known)

    def _attach(self, conn: socket.socket, proc: str, arena: Arena) -> None:
        with self._lock:
            peer = self._peers.setdefault(conn, _Peer(proc))
            if peer.arena is not arena:
                peer.arena = arena
                self._live[arena.id] = self._live.get(arena.id, 0) + 1
            self.stats.procs.add(proc)
            self._proc_of[arena.id] = proc

    def _handle(self, conn: socket.socket, msg: bytes) -> None:
        mtype, thread, proc, body = self._parse(msg)
        with self._lock:
            peer = self._peers.setdefault(conn, _Peer(proc))
            self.stats.procs.add(proc)
        if mtype == MSG_RING:  # a reconnect: the arena is named, not sent again
            arena_id = _ARENA_ID.unpack_from(body)[0] if len(body) >= _ARENA_ID.size else -1
            with self._lock:
                arena = self._arenas.get(arena_id)
            if arena is None:
                raise ValueError(f"process {proc} names arena {arena_id:#x}, never sent")
            self._attach(conn, proc, arena)
        elif mtype == MSG_NUDGE:
            self._drain(peer.arena)
        elif mtype in (MSG_BARRIER, MSG_EXIT, MSG_BIG, MSG_SYNC):
            # Ordering, not durability: everything the process taped before the request
            # is appended before the answer. Syncing here cost an fdatasync per exec and
            # per exit; durability comes from the recorder's periodic flush and from each
            # model or tool exchange, which is synced before the program sees its result,
            # and from MSG_SYNC: a process about to talk to a peer outside the tree (a
            # resume must find that connection on the tape, never open it again).
            big = [Drained(thread, body)] if mtype == MSG_BIG and body else []
            try:
                self._drain(peer.arena, then=big)
                if mtype == MSG_SYNC:
                    self._sync_cut(proc, thread)
                if mtype == MSG_EXIT and body.startswith(b"status "):
                    self._exited(proc, body[7:].decode("ascii", "replace"))
            except Exception as exc:  # the store refused it: noted, the program goes on
                with self._lock:
                    self.stats.errors.append(f"{type(exc).__name__}: {exc}")
            with self._lock:
                self.stats.barriers += 1
            conn.send(b"\x01")
        elif mtype in (MSG_INTENT, MSG_RESULT):
            self._effect(conn, mtype, proc, peer, body)
        elif mtype == MSG_EXEC:
            self._exec(conn, proc, peer, body)
        elif mtype == MSG_DATA:  # records sent as they are (an older shim's way)
            if body:
                self._append(proc, [Drained(thread, body)])
        else:
            raise ValueError(f"unknown message type {mtype}")

    def _effect(self, conn: socket.socket, mtype: int, proc: str, peer: _Peer,
                body: bytes) -> None:
        """An HTTP effect on a taped connection (``shim_c/neteffect.c``): its intent (with
        every ring drained first, so the tape is consistent there: a cut) or its result,
        durable before the process goes on."""
        call_id, _, rest = body.decode("utf-8", "replace").partition("\t")
        ack = b"\x01"
        reply = self.replies.get(call_id) if mtype == MSG_INTENT else None
        if reply is not None and reply.action in ("answer", "refuse"):  # made before
            port = 0
            if reply.action == "answer" and reply.open is not None:
                try:
                    port = reply.open()
                except Exception as exc:  # noted: refused, never made twice
                    with self._lock:
                        self.stats.errors.append(f"stand-in for {call_id}: {exc}")
            with self._lock:
                self.stats.answered.append(call_id)
            conn.send(bytes([ANS_ANSWERED]) + struct.pack("<H", port) if port
                      else bytes([ANS_REFUSED]))
            return
        if reply is not None and reply.action == "redo":  # an effect of its own
            self._renamed[call_id] = f"{call_id}@{self.epoch}"
        call_id = self._renamed.get(call_id, call_id)
        try:
            if mtype == MSG_INTENT:
                target, _, head = rest.partition("\t")
                if self.redact is not None:  # as the hooks redact their requests
                    target = self.redact.text(target)
                if target.startswith("connect ") and not self.commands.is_effect_connection(
                        target[8:]):
                    conn.send(b"\x02")  # a destination the policy says is read-only
                    return
                decision = self._gate(call_id, target, "net")
                if decision == "hold":  # the tree is stopped: no answer
                    return
                if decision != "allow":  # deny, stop: not sent
                    self.store.flush()
                    conn.send(b"\x00")
                    return
                self.drain_all()
                with self._lock:
                    by = self._commands.get(proc)
                head, _, key = head.partition("\t")  # (an Idempotency-Key it carries)
                if self.redact is not None and head:
                    head = self.redact.text(head)
                self.store.queue(self.traj, "ToolIntent",
                                  {"call_id": call_id, "target": target, "channel": "net",
                                   "proc": proc, "epoch": self.epoch,
                                   **({"arguments": head} if head else {}),
                                   **({"idempotency_key": key} if key else {}),
                                   **({"by": by} if by else {})})
            else:  # every ring drained: a cut, its whole answer before it
                self.drain_all()
                self.store.queue(self.traj, "ToolResult",
                                  {"call_id": call_id, "channel": "net", "status": rest})
            self.store.flush()
            if mtype == MSG_INTENT and self.after_intent is not None:
                self.after_intent()  # an intent: in the warm tier before the effect
        except Exception as exc:  # the store refused it: noted, the program goes on
            with self._lock:
                self.stats.errors.append(f"{type(exc).__name__}: {exc}")
        conn.send(ack)

    def _exec(self, conn: socket.socket, proc: str, peer: _Peer, body: bytes) -> None:
        """A process is about to exec ``L|R [W] call id \0 cwd \0 argv...`` (R: in a resumed
        or forked prefix, replayed, not run; W: a program the shim cannot see into, recorded
        whole -- an effect unless ``read_only`` names it): drain it (the barrier
        every exec takes), and decide. The answer: 1 run it, 0 refused (the policy:
        the exec fails with EACCES), 2 do not (resume: a person said it was done; the
        process ends with status 0). A command that is an effect gets its durable
        ``ToolIntent`` first, with every ring drained: a cut."""
        parts = body.split(b"\0")
        replayed, whole = parts[0][:1] == b"R", parts[0][1:2] == b"W"
        call_id = parts[0][1 + whole:].decode("utf-8", "replace")
        cwd = parts[1].decode("utf-8", "replace") if len(parts) > 1 else ""
        args = [p.decode("utf-8", "replace") for p in parts[2:] if p]
        line = command_line(self.redact.argv(args) if self.redact is not None else args)
        with self._lock:
            self._commands[proc] = line
        answer = 1
        try:
            self._drain(peer.arena)
            if not replayed:  # what the run did, for a person: ``harness/work.py``
                self.store.queue(self.traj, "ProcessStarted",
                                  {"proc": proc, "command": line, "cwd": cwd,
                                   "at": time.time()})
            with self._lock:
                given = self.outputs.pop(proc, None)
            if given is not None:  # settled done with its output: not run
                conn.send(bytes([ANS_ANSWERED]) + struct.pack("<i", given.status)
                          + given.path.encode())
                return
            how = self.settled.get(call_id)
            if how == "done":  # a person's or a probe's word: it happened
                answer = 2
            elif how == "not-done":
                self._renamed[call_id] = call_id = f"{call_id}@{self.epoch}"
            effect = self.commands.is_effect(line, whole=whole)
            if answer == 2:  # settled done: not run, however well the log knows its intent
                pass
            elif call_id in self.known or (replayed and call_id not in self.approvals
                                           and not effect):
                conn.send(b"\x01")  # a prefix replays it
                return
            # (an effect or a held call the prefix reaches without its intent was never
            # run: it is now)
            if answer == 1:
                decision = self._gate(call_id, f"exec {line}", "exec")
                if decision == "hold":  # the tree is stopped: no answer
                    return
                answer = 1 if decision == "allow" else 0
            if answer == 1 and effect:
                self.drain_all()
                self.store.queue(self.traj, "ToolIntent",
                                  {"call_id": call_id, "target": f"exec {line}",
                                   "channel": "exec", "proc": proc, "cwd": cwd,
                                   "epoch": self.epoch})
                with self._lock:
                    self._pending[proc] = call_id
                self.store.flush()  # (only an effect's exec waits for a sync)
                if self.after_intent is not None:
                    self.after_intent()  # in the warm tier before the command runs
        except Exception as exc:  # the store refused it: noted, the program goes on
            with self._lock:
                self.stats.errors.append(f"{type(exc).__name__}: {exc}")
        conn.send(bytes([answer]))

    def _gate(self, call_id: str, target: str, channel: str) -> str:
        """The policy's decision on an effect about to leave (``allow``, ``deny``, ``stop``
        or ``hold``). A held call a person has decided on (a resume) gets the decision, as
        an ``Authorized`` event marked ``approval``; one not decided yet is held again."""
        if self.authorize is None:
            return "allow"
        answer = self.authorize(call_id, target, channel)
        decision = str(answer.get("decision"))
        if decision != "hold":
            return decision
        known = self.approvals.get(call_id) or {}
        if known.get("decision") in ("approved", "denied"):
            allow = known["decision"] == "approved"
            by = f" by {known['by']}" if known.get("by") else ""
            self.store.queue(self.traj, "Authorized",
                              {"call_id": call_id, "target": target, "approval": True,
                               "decision": "allow" if allow else "deny",
                               "reason": f"{known['decision']}{by}"})
            return "allow" if allow else "deny"
        if self.on_hold is None:
            return "deny"  # nobody to ask and nothing to wait in
        self.on_hold(call_id, target, str(answer.get("summary") or target))
        return "hold"

    def cut(self) -> None:
        """Every ring drained and the log synced at a point a resume may cut at: the tree
        is about to be stopped (a hold)."""
        self._sync_cut("0", 0)

    def _exited(self, proc: str, status: str) -> None:
        """A process ended through exit: its ``ProcessEnded``, and the result of the exec
        effect it ran, if any."""
        with self._lock:
            call_id = self._pending.pop(proc, None)
        self.store.queue(self.traj, "ProcessEnded", {"proc": proc, "status": status,
                                                      "at": time.time()})
        if call_id is not None:  # every ring drained: a cut, the command over
            self.drain_all()
            self.store.queue(self.traj, "ToolResult",
                              {"call_id": call_id, "channel": "exec", "status": status})
            self.store.flush()

    def _sync_cut(self, proc: str, thread: int) -> None:
        """A process is about to use a connection outside the tree: every arena drained
        (its ancestors' spawn of it included), then an empty chunk marked ``cut`` -- a
        point the whole tree's tape is consistent at, where a resume may cut
        (``resumes.cut_seq``) -- and the log synced before the process goes on."""
        self.drain_all()
        self.store.queue(self.traj, "TapeChunk",
                          {"proc": proc, "thread": thread, "data": b"", "cut": True})
        self.store.flush()

    # -- draining

    def _drain(self, arena: Arena | None, then: list[Drained] | None = None) -> None:
        if arena is None:
            if then:
                raise ValueError("a record came before its process's arena")
            return
        with arena.lock:
            chunks = arena.drain() + (then or [])
            if chunks:
                self._append(self._proc_of[arena.id], chunks)

    def _append(self, proc: str, chunks: list[Drained]) -> None:
        for c in chunks:
            data = c.data if self.redact is None else masked_sends(c.data, self.redact.mask)
            self.store.queue(self.traj, "TapeChunk", chunks_mod.encode(proc, c.thread, data))
        with self._lock:
            self.stats.chunks += len(chunks)
            self.stats.bytes += sum(len(c.data) for c in chunks)

    def _closed(self, conn: socket.socket) -> None:
        """A connection ended: drain its arena; let it go once its process is gone."""
        with self._lock:
            peer = self._peers.pop(conn, None)
            arena = peer.arena if peer else None
            if arena is not None:
                self._live[arena.id] -= 1
        if arena is not None:
            self._drain(arena)
            self._retire_if_gone(arena)

    def _retire_if_gone(self, arena: Arena) -> None:
        with self._lock:
            if self._live.get(arena.id, 0) > 0 or not process_gone(arena.pid):
                return
            self._arenas.pop(arena.id, None)
            self._live.pop(arena.id, None)
        self._drain(arena)
        with arena.lock:
            arena.close()

    def _drain_loop(self) -> None:
        while not self._stop.wait(self.DRAIN_EVERY):
            self.drain_all()

    def drain_all(self) -> None:
        """Drain every arena now (also: retire those whose process has gone)."""
        with self._lock:
            arenas = list(self._arenas.values())
        for arena in arenas:
            try:
                self._drain(arena)
                self._retire_if_gone(arena)
            except Exception as exc:  # noted; the session goes on
                with self._lock:
                    self.stats.errors.append(f"{type(exc).__name__}: {exc}")

    def close(self, *, grace: float = 2.0) -> SessionStats:
        """Stop accepting; wait up to ``grace`` seconds for open connections to end;
        drain every arena a last time."""
        self._server.close(grace)
        self._stop.set()
        self._drainer.join()
        self.drain_all()
        with self._lock:
            arenas, self._arenas = list(self._arenas.values()), {}
            corrupt = sum(a.corrupt for a in arenas)
        for arena in arenas:
            with arena.lock:
                arena.close()
        if corrupt:
            self.stats.errors.append(f"{corrupt} ring(s) overwritten by the program: "
                                     "their records were dropped")
        self.store.flush()
        return self.stats


# ----------------------------------------------------------------------------- replay


@dataclass
class TapeSummary:
    streams: int = 0
    records: int = 0
    procs: list[str] = field(default_factory=list)


def stream_name(thread: int, channel: int) -> str:
    return f"{thread}.{CHANNELS[channel]}"


DROPPED_SINCE: dict[int, frozenset[tuple[int, int]]] = {2: frozenset({(4, 1)})}
"""Records an older protocol's tape has that this one neither makes nor serves, by the
protocol that made them: (channel, op). Protocol 2 taped every ``getpid``; since 3 a
process's pid is served from the procinfo record it starts with."""


def prepare_tape(events: Iterable[Event], tape_dir: str | Path, *,
                 killed: int | None = None, protocol: int | None = None) -> TapeSummary:
    """Write ``tape_dir/<proc>/<thread>.<channel>`` from the ``TapeChunk`` events, one
    chunk at a time: memory holds one chunk and at most ``_Streams.BUDGET`` bytes of
    records not yet written, whatever the tape's length.

    ``killed``: the signal that ended the recorded run from outside (its exit status was
    ``-killed``); written to ``tape_dir/killed``, where a process whose tape ends without
    an exit record finds it and ends the same way at that point (shim ``await_kill``).
    ``protocol``: the one the tape was recorded with, when older than this shim's: the
    records it no longer serves are left out (``DROPPED_SINCE``)."""
    dropped = DROPPED_SINCE.get(protocol, frozenset()) if protocol is not None else frozenset()
    root = Path(tape_dir)
    root.mkdir(parents=True, exist_ok=True)
    out = _Streams(root)
    exited: set[str] = set()
    summary = TapeSummary()
    for ev in events:
        if ev.kind != "TapeChunk":
            continue
        body = ev.body
        proc, thread = body.get("proc"), body.get("thread")
        if not isinstance(thread, int) or thread < 0:
            raise CorruptLog("TapeChunk without proc/thread/data", f"lsn {ev.lsn}", ev.seq)
        check_proc(proc)  # type: ignore[arg-type]
        assert isinstance(proc, str)
        try:
            data = chunks_mod.chunk_data(body)
        except ValueError as exc:
            raise CorruptLog(f"TapeChunk: {exc}", f"lsn {ev.lsn}", ev.seq) from None
        try:
            for ch, start, stop, ops in iter_runs(data):
                if ch not in CHANNELS:
                    raise ValueError(f"unknown channel {ch}")
                if ch == 4 and 13 in ops:  # the process ended through exit: TAPE/<proc>/exited
                    exited.add(proc)
                summary.records += len(ops)
                if not dropped or not any((ch, op) in dropped for op in set(ops)):
                    out.add(proc, thread, ch, data[start:stop])
                    continue
                off = start  # an older protocol's records this shim no longer serves
                for _ch, op, payload in iter_records(data[start:stop]):
                    n = RECORD.size + len(payload)
                    if (ch, op) not in dropped:
                        out.add(proc, thread, ch, data[off:off + n])
                    off += n
        except ValueError as exc:
            raise CorruptLog(f"bad tape chunk: {exc}", f"lsn {ev.lsn}", ev.seq) from None
    out.close()
    for proc in exited:
        (root / proc).mkdir(exist_ok=True)
        (root / proc / "exited").touch()
    if protocol is not None:  # what the shim may tape that this recording's shim did not
        (root / "protocol").write_text(str(protocol))
    if killed is not None:
        (root / "killed").write_text(str(killed))
    summary.streams = len(out.sizes)
    summary.procs = sorted(out.procs, key=lambda p: [int(x) for x in p.split(".")])
    return summary


class _Streams:
    """The stream files being written: records gathered per stream and appended to its
    file once the gathered bytes pass ``BUDGET`` (the largest first), so neither memory
    nor open files grow with the tape."""

    BUDGET = 16 << 20

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pending: dict[tuple[str, int, int], list[bytes]] = {}
        self.sizes: dict[tuple[str, int, int], int] = {}
        self.held = 0
        self.procs: set[str] = set()

    def add(self, proc: str, thread: int, ch: int, data: bytes) -> None:
        key = (proc, thread, ch)
        if key not in self.sizes:
            (self.root / proc).mkdir(exist_ok=True)
            self.procs.add(proc)
            self.sizes[key] = 0
            (self.root / proc / stream_name(thread, ch)).write_bytes(b"")
        self.pending.setdefault(key, []).append(data)
        self.sizes[key] += len(data)
        self.held += len(data)
        while self.held > self.BUDGET and self.pending:
            self._flush(max(self.pending, key=lambda k: sum(map(len, self.pending[k]))))

    def _flush(self, key: tuple[str, int, int]) -> None:
        parts = self.pending.pop(key)
        with open(self.root / key[0] / stream_name(key[1], key[2]), "ab") as f:
            f.writelines(parts)
        self.held -= sum(map(len, parts))

    def close(self) -> None:
        for key in list(self.pending):
            self._flush(key)


def stream_records(tape_dir: str | Path, proc: str, thread: int,
                   channel: str) -> list[tuple[int, int, bytes]]:
    """The records of one prepared stream (empty if it has none)."""
    path = Path(tape_dir) / check_proc(proc) / f"{thread}.{channel}"
    if not path.is_file():
        return []
    return list(iter_records(path.read_bytes()))


def recorded_listings(tape_dir: str | Path, under: Sequence[str]) -> dict[str, dict[str, bool]]:
    """The first listing on a prepared tape (dirents op 1) of each directory at or under
    one of ``under``: {path: {name: is a directory}} (the root process's streams first,
    each in the order it listed). A sealed replay gives back what was there then and has
    been removed since."""
    roots = [r.rstrip("/") for r in under]
    out: dict[str, dict[str, bool]] = {}
    for f in sorted(Path(tape_dir).glob("*/*.dirents"),
                    key=lambda f: ([int(x) for x in f.parent.name.split(".")
                                    if x.isdigit()], f.name)):
        try:
            records = list(iter_records(f.read_bytes()))
        except (OSError, ValueError):
            continue
        for ch, op, p in records:
            if (ch, op) != (3, 1) or len(p) < 2:
                continue
            try:
                (pl,) = struct.unpack_from("<H", p)
                path = p[2:2 + pl].decode()
                err, count = struct.unpack_from("<iI", p, 2 + pl)
                if err or path in out or not any(path == r or path.startswith(r + "/")
                                                 for r in roots):
                    continue
                names = out.setdefault(path, {})
                off = 2 + pl + 8
                for _ in range(count):
                    _ino, kind, nl = struct.unpack_from("<QBH", p, off)
                    name = p[off + 11:off + 11 + nl].decode()
                    off += 11 + nl
                    if name not in (".", "..") and "/" not in name:
                        names[name] = kind == 4
            except (struct.error, UnicodeDecodeError):
                continue
    return out


@dataclass(frozen=True)
class Divergence:
    """One line of ``TAPE/divergence`` written by the shim."""

    kind: str  # "divergence" or "drift"
    proc: str
    thread: int
    channel: str
    pos: int
    recorded: str
    asked: str
    detail: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "proc": self.proc, "thread": self.thread,
                "channel": self.channel, "position": self.pos,
                "recorded": self.recorded, "asked": self.asked, "detail": list(self.detail)}


def read_divergences(tape_dir: str | Path) -> list[Divergence]:
    """What the shim (``divergence``) and the Python hooks (``divergence-py.jsonl``) found."""
    out = _read_py_divergences(Path(tape_dir) / "divergence-py.jsonl")
    path = Path(tape_dir) / "divergence"
    if not path.is_file():
        return out
    for line in path.read_text(errors="replace").splitlines():
        kind, *fields = line.split("\t")
        kv = dict(f.split("=", 1) for f in fields if "=" in f)
        try:
            out.append(Divergence(kind, kv.get("proc", "?"), int(kv.get("thread", -1)),
                                  kv.get("channel", "?"), int(kv.get("pos", -1)),
                                  kv.get("recorded", "?"), kv.get("asked", "?")))
        except ValueError:
            continue
    return out


def python_stacks(tape_dir: str | Path) -> dict[str, list[str]]:
    """Per process, the Python stacks the shim wrote when a divergence stopped it.

    CPython's dumper writes ``Thread 0x... (most recent call first):`` blocks of
    ``  File "...", line N in f`` lines; kept as written, the current thread marked.
    """
    out: dict[str, list[str]] = {}
    root = Path(tape_dir)
    for where in sorted(root.glob("*/where")):
        lines = [ln.rstrip() for ln in where.read_text(errors="replace").splitlines()]
        if any(ln.strip() for ln in lines):
            out[where.parent.name] = [ln for ln in lines if ln.strip()]
    return out


def _read_py_divergences(path: Path) -> list[Divergence]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            d = json.loads(line)
            report = [str(x) for x in d["report"]]
            recorded = next((x for x in report if x.startswith("nearest recorded")), "nothing")
            asked = next((x for x in report if x.startswith("asked:")), "?")
            asked = asked.removeprefix("asked:").strip()
            out.append(Divergence("divergence", str(d["proc"]), -1, str(d["channel"]),
                                  int(d["position"]), recorded, asked, tuple(report)))
        except (ValueError, KeyError, TypeError):
            continue
    return out
