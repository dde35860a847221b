"""How golden_logs/v1 was made (run once with format version 1; never re-run to "fix" a test).

The files it wrote are frozen: tests read them to prove that this build still
reads what version 1 wrote. A new format version gets its own folder and script.
"""

import json
import shutil
from pathlib import Path

from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store, StoreSettings
from stenograph.recorder.trajfile import export_trajectory

root = Path("golden_logs/v1")
st_path = root / "store"
shutil.rmtree(st_path, ignore_errors=True)
with Store(st_path, settings=StoreSettings(segment_bytes=512)) as st:
    ref = st.blobs.put(b"large tool output\n" * 40)
    st.append("run-a", "TaskStarted", {
        "task": "summarise", "model": "scripted-1", "sampling": {"temperature": 0.0, "seed": 7}})
    st.append("run-b", "Note", {"text": "interleaved", "n": -(2**40)})
    st.append("run-a", "ModelReplied", {
        "text": "calling tool", "tool_calls": [{"id": "c1", "name": "cat", "args": {"path": "x"}}],
        "tokens": {"in": 12, "out": 5}})
    st.append("run-a", "ToolIntent", {
        "tool": "cat", "args": {"path": "x"}, "idempotency_key": "run-a/c1"})
    st.append("run-a", "ToolResult", {
        "call": "c1", "status": "ok", "output": ref.to_body(), "duration_ms": 3.5})
    for i in range(12):
        st.append("run-b", "TapeChunk", {"proc": "0", "thread": 0, "data": bytes(range(i, i + 40))})
    st.append("run-a", "Settled", {"call": "c1", "how": "result"})
export_trajectory(st_path, "run-a", root / "run-a.steno")
exp = [e.to_json() for e in StoreReader(st_path).events()]
(root / "expected-events.json").write_text(json.dumps(exp, indent=1) + "\n")
(st_path / "LOCK").unlink()
(st_path / "wal" / "spare.tmp").unlink(missing_ok=True)
print(len(exp), sorted(p.name for p in (st_path / "wal").iterdir()))
