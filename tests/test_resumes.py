"""The view of a resumed trajectory and its cut (recorder/resumes.py), as properties
over generated logs: crashes, resumes at any earlier point, decisions in between."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from stenograph.recorder.codec import Event
from stenograph.recorder.resumes import CUT_KINDS, DROPPED_AFTER_CUT, cut_seq, plan, view

KINDS = ["TapeChunk", "TapeChunk", "Exchange", "ToolIntent", "Checkpoint", "Settled",
         "LeaseAcquired"]
EXAMPLES = int(os.environ.get("STENO_SNAPSHOT_EXAMPLES", "150"))


@st.composite
def logs(draw: st.DrawFn) -> list[Event]:
    n = draw(st.integers(min_value=1, max_value=40))
    out = [Event(0, "t", 0, None, "RunStarted", {"argv": ["x"]})]
    for seq in range(1, n):
        kind = draw(st.sampled_from(KINDS))
        body: dict = {}
        if kind == "LeaseAcquired":
            body = {"epoch": seq, "resumed_at": draw(st.integers(0, seq - 1))}
        elif kind in ("Exchange", "ToolIntent"):
            body = {"proc": "0", "channel": "http", "pos": seq, "call_id": f"0/http/{seq}"}
        elif kind == "Checkpoint":
            body = {"at": draw(st.sampled_from(["start", "turn", "effect"]))}
        out.append(Event(seq, "t", seq, seq - 1, kind, body))
    return out


@settings(max_examples=EXAMPLES, deadline=None)
@given(logs())
def test_the_view_keeps_order_decisions_and_is_idempotent(events: list[Event]) -> None:
    v = view(events)
    seqs = [e.seq for e in v]
    assert seqs == sorted(seqs) and set(seqs) <= {e.seq for e in events}
    assert {e.seq for e in events if e.kind not in DROPPED_AFTER_CUT} <= set(seqs)
    assert view(v) == v
    for i, ev in enumerate(v):  # nothing dropped survives: no tape past a later lease's cut
        if ev.kind == "LeaseAcquired":
            cut = ev.body["resumed_at"]
            assert not any(e.kind in DROPPED_AFTER_CUT and cut < e.seq for e in v[:i])


@settings(max_examples=EXAMPLES, deadline=None)
@given(logs())
def test_the_cut_is_the_last_consistent_point_and_the_plan_keeps_nothing_past_it(
        events: list[Event]) -> None:
    v = view(events)
    cut = cut_seq(v)
    last = [e.seq for e in v if e.kind in CUT_KINDS]
    starts = [e.seq for e in v if e.kind == "Checkpoint" and e.body.get("at") == "start"]
    assert cut == (last[-1] if last else starts[0] if starts else v[0].seq)
    p = plan("t", events)
    assert p.cut == cut
    assert all(e.seq <= cut for e in p.events if e.kind in DROPPED_AFTER_CUT)


def test_a_probe_says_not_done_only_by_a_clean_exit_1(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A probe is a real ``sh -c``: exit 0 is done (its stdout the answer), a quiet exit 1
    not done; a probe that dies complaining (a Python probe's traceback when the service
    timed out: exit 1 too) cannot tell, and the effect is left to a person instead of
    being made again."""
    from types import SimpleNamespace

    from stenograph.runner.resume import ProbeSaid, run_probe

    doubt = {"call_id": "0/mcp/2", "target": "mcp ledger/provision", "channel": "mcp"}

    def said(command: str) -> ProbeSaid | None:
        return run_probe(SimpleNamespace(command=command), doubt, str(tmp_path))

    assert said("exit 0") == ProbeSaid("done")
    assert said('echo \'{"id": "srv_1"}\'') == ProbeSaid("done", result={"id": "srv_1"})
    assert said("exit 1") == ProbeSaid("not-done")
    assert said("echo 'urllib.error.URLError: timed out' >&2; exit 1") is None
    assert said("python3 -c 'raise TimeoutError(\"the service\")'") is None
    assert said("exit 2") is None


def test_a_call_settled_done_is_served_even_once_its_process_went_live(
        tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A resumed process goes live as soon as one of its threads runs out of tape, which
    can be before it reaches the call a person settled as done (the cut is at that call's
    intent; another thread's records end earlier). Reached live, the call must still be
    answered from the settlement, never sent: a CI run once provisioned a second server
    this way. Both tapes (MCP and HTTP) are asked as the hooks ask them."""
    import json
    from types import SimpleNamespace

    from stenograph.interpose import mcp_client, seam
    from stenograph.interpose.fingerprint import fingerprint
    from stenograph.interpose.pytape import PyTape
    from stenograph.recorder.exchanges import prepare_py_tape
    from stenograph.recorder.resumes import settled_entry

    args = json.dumps({"name": "web1"}, sort_keys=True).encode()
    mcp = {"proc": "0", "channel": "mcp", "pos": 0, "target": "mcp ledger/provision",
           "fingerprint": fingerprint("CALL", "mcp:ledger/provision", args)}
    probe = PyTape("record", "0")
    http_fp = seam.Call(probe, "POST", "http://127.0.0.1:9/pay", [], b"{}").fp
    http = {"proc": "0", "channel": "http", "pos": 0, "target": "POST http://127.0.0.1:9/pay",
            "fingerprint": http_fp}
    prepare_py_tape([Event(0, "t", 1, None, "Exchange", settled_entry(mcp, None)),
                     Event(1, "t", 2, None, "Exchange", settled_entry(http, {"ok": 1}))],
                    tmp_path)
    monkeypatch.setenv("STENO_RESUME", "1")
    tape = PyTape("record", "0", tape_dir=str(tmp_path))  # live: the mode a resume went to
    session = SimpleNamespace(_stenograph_mcp=mcp_client._Known(
        "ledger", {"provision": mcp_client.Hints()}))
    answer = mcp_client.McpCall(tape, session, "provision", {"name": "web1"}).before()
    assert answer is not None and answer.content[0].text == mcp_client.NO_ANSWER
    call = seam.Call(tape, "POST", "http://127.0.0.1:9/pay", [], b"{}")
    assert call.replaying and call.served is not None
    assert call.replayed(RuntimeError, RuntimeError).status == 200
