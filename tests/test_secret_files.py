"""A recording carries no secret from the workspace: files with keys and passwords are
snapshotted masked, and a replay serves the live file where there is one.

The project directory a coding agent works in, recorded as users record it (the default
workspace: the working directory): a ``.env``, a ``creds.json`` with an AWS secret key, a
nested config with a password and a token, a PEM private key, a kubeconfig. None of the
values is in the environment. Every value is searched for, in every encoding ``log scan``
knows, in the ``.steno``, the store and every blob; a program that reads ``.env`` replays
bit for bit against the same live file and says which file when it differs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stenograph.recorder.keyshapes import KeyShapes, maintained
from stenograph.recorder.secretfiles import SecretRules, mask_file, mask_values

CLI = [sys.executable, "-m", "stenograph"]

VALUES = {
    "stripe": "sk_live_51HxYzAbCdEfGhIjKlMnOpQrStUv",
    "db": "Tr0ub4dor&3-horse-battery",
    "aws": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "yaml password": "qZ8#mL2!vR9xT4pW",
    "token": "ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
    "pem": "MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0",
    "kube": "eyJhbGciOiJSUzI1NiIsImtpZCI6IkRJZCJ9.eyJpc3MiOiJrdWJlcm5ldGVzIn0."
            "c2lnbmF0dXJlc2lnbmF0dXJl",
    "netrc": "n3trcPa55w0rd-Zx9",
}


def _project(root: Path) -> None:
    (root / ".env").write_text(f"STRIPE_SECRET_KEY={VALUES['stripe']}\n"
                               f"DB_PASSWORD={VALUES['db']}\nDEBUG=1\n")
    (root / "creds.json").write_text(
        '{"aws_access_key_id": "AKIAIOSFODNN7EXAMPLE", '
        f'"aws_secret_access_key": "{VALUES["aws"]}"}}\n')
    (root / "config").mkdir()
    (root / "config" / "app.yaml").write_text(
        f'service:\n  db:\n    password: "{VALUES["yaml password"]}"\n'
        f"  upstream_token: {VALUES['token']}\n  replicas: 3\n")
    (root / "deploy").mkdir()
    (root / "deploy" / "id_rsa").write_text(
        "-----BEGIN RSA PRIVATE KEY-----\n" + VALUES["pem"] + "\n"
        + "-----END RSA PRIVATE KEY-----\n")
    (root / "deploy" / "cluster.kubeconfig").write_text(
        "apiVersion: v1\nusers:\n- name: ci\n  user:\n"
        f"    token: {VALUES['kube']}\n")
    (root / ".netrc").write_text(f"machine api.example.com login ci password {VALUES['netrc']}\n")
    (root / "README.md").write_text("the project\n")
    (root / "prog.py").write_text(
        "import hashlib\n"
        "print('env', hashlib.sha256(open('.env', 'rb').read()).hexdigest()[:16])\n")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    root = tmp_path_factory.mktemp("project")
    _project(root)
    rec = _cli("record", "--store", str(root.parent / "store"), "-o",
               str(root.parent / "e.steno"), "--", sys.executable, "prog.py", cwd=root)
    assert rec.returncode == 0, rec.stderr
    return root, rec


@pytest.mark.parametrize("name", list(VALUES))
def test_no_value_reaches_the_recording_or_the_store(
        recorded: tuple[Path, subprocess.CompletedProcess[str]], name: str) -> None:
    root, _ = recorded
    for where in (root.parent / "e.steno", root.parent / "store"):
        p = _cli("log", "scan", str(where), "--secret", VALUES[name], cwd=root)
        assert p.returncode == 0, f"{name} found in {where}: {p.stdout}"


def test_no_key_shape_is_left_in_the_recording(
        recorded: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, _ = recorded
    p = _cli("log", "scan", str(root.parent / "e.steno"), "--shapes", cwd=root)
    assert p.returncode == 0, p.stdout


def test_the_summary_counts_what_was_masked(
        recorded: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    _, rec = recorded
    line = next(ln for ln in rec.stderr.splitlines() if "workspace:" in ln)
    assert "4 secret file(s) masked" in line, line  # .env, .netrc, id_rsa, the kubeconfig
    assert "in 2 other file(s)" in line, line       # creds.json, config/app.yaml


def test_the_masked_files_keep_their_names_and_lengths(
        recorded: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    root, _ = recorded
    out = tmp_path / "restored"
    p = _cli("checkpoint", "restore", str(root.parent / "e.steno"), "--at", "start",
             "-o", str(out), cwd=root)
    assert p.returncode == 0, p.stderr
    env = (out / ".env").read_text()
    assert env.splitlines()[0] == "STRIPE_SECRET_KEY=" + "*" * len(VALUES["stripe"])
    assert (out / ".env").stat().st_size == (root / ".env").stat().st_size
    app = (out / "config" / "app.yaml").read_text()
    assert "replicas: 3" in app and "upstream_token: " in app
    assert (out / "README.md").read_text() == "the project\n"  # nothing else touched


def test_a_replay_serves_the_live_file_and_names_it_when_it_differs(
        recorded: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, rec = recorded
    steno = str(root.parent / "e.steno")
    same = _cli("replay", steno, cwd=root)
    assert same.returncode == 0, same.stderr
    assert same.stdout == rec.stdout  # the live .env is the recorded one: bit for bit
    env = (root / ".env").read_text()
    try:
        (root / ".env").write_text(env.replace("DEBUG=1", "DEBUG=0"))
        changed = _cli("replay", steno, cwd=root)
        assert changed.returncode == 1
        notes = [ln for ln in changed.stderr.splitlines() if "note:" in ln]
        assert len(notes) == 1 and ".env" in notes[0] and "live" in notes[0], changed.stderr
        (root / ".env").unlink()
        gone = _cli("replay", steno, cwd=root)
        assert gone.returncode == 1
        assert any(".env" in ln and "masked copy" in ln for ln in gone.stderr.splitlines())
    finally:
        (root / ".env").write_text(env)


def test_stenoignore_and_flags_choose_the_secret_files(tmp_path: Path) -> None:
    (tmp_path / ".env.test").write_text("FIXTURE=abc\n")
    (tmp_path / "custom.cfg").write_text("opaque stuff 123\n")
    (tmp_path / "flagged.txt").write_text("also opaque 456\n")
    (tmp_path / ".stenoignore").write_text("!secret: .env.test\nsecret: custom.cfg\n")
    rec = _cli("record", "-o", str(tmp_path / "r.steno"), "--workspace-secret", "flagged.txt",
               "--", "true", cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    out = tmp_path / "restored"
    assert _cli("checkpoint", "restore", str(tmp_path / "r.steno"), "--at", "start", "-o",
                str(out), cwd=tmp_path).returncode == 0
    assert (out / ".env.test").read_text() == "FIXTURE=abc\n"
    assert "123" not in (out / "custom.cfg").read_text()
    assert "456" not in (out / "flagged.txt").read_text()


# -- the masking itself, property-tested ---------------------------------------------------

_name = st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True)
_value = st.text(st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="#"),
                 min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_name, _value), min_size=1, max_size=8))
def test_a_secret_file_keeps_names_and_length_and_loses_every_value(
        pairs: list[tuple[str, str]]) -> None:
    text = "".join(f"{k}={v}\n" for k, v in pairs).encode()
    m = mask_file(text)
    masked, hits = m.data, m.hits
    assert len(masked) == len(text) and hits == len(pairs)
    worth = [v.strip("\"' ,") for _k, v in pairs]  # what a masked value can be
    learnt = " ".join(m.values)
    assert all(w in learnt for w in worth if any(c.isalnum() for c in w)), (worth, m.values)
    for (k, v), line in zip(pairs, masked.splitlines(), strict=True):
        assert line.startswith(f"{k}=".encode())
        assert len(line) == len(k) + 1 + len(v)
        kept = line[len(k) + 1:]
        assert all(c == 0x2A or chr(c) in " \"',:;=[]{}()" for c in kept), line


_key = st.from_regex(r"ghp_[A-Za-z0-9]{36}", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=200), _key,
       st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=200))
def test_a_key_anywhere_in_a_text_file_is_masked_and_nothing_else_moves(
        before: str, key: str, after: str) -> None:
    data = f"{before} {key} {after}".encode()
    shapes = KeyShapes(maintained())
    m = mask_values(data, shapes)
    masked, hits = m.data, m.hits
    assert key in m.values
    assert hits >= 1 and key.encode() not in masked and len(masked) == len(data)
    assert masked[:len(before)] == before.encode()


def test_binary_and_clean_files_are_stored_as_they_are() -> None:
    rules = SecretRules(shapes=KeyShapes(maintained()))
    assert rules.redact("a.bin", b"\0\1ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5") is None
    assert rules.redact("a.py", b"token_count = 5\nmax_tokens = 100000\n") is None
    red = rules.redact("id_ed25519.pub", b"ssh-ed25519 AAAAC3Nza... me@host\n")
    assert red is None  # a public key is not a secret file


def test_a_tool_that_sends_a_secret_file_to_a_server_leaves_no_value_in_the_log(
        tmp_path: Path) -> None:
    """What the snapshot masked, the hooks learn: a tool that reads .env and creds.json
    and posts them (to a server that echoes them back) leaves none of their values in the
    recording, request or response, and the replay -- which learns the live files'
    values the same way, so its request matches -- is bit for bit. (The echoed response
    is served scrubbed: a program printing it would print ``<redacted>``, as with any
    secret a server echoes.)"""
    from stenograph.testing.model_server import ModelServer

    root = tmp_path / "project"
    root.mkdir()
    _project(root)
    (root / "tool.py").write_text(
        "import sys, requests\n"
        "body = open('.env').read() + open('creds.json').read()\n"
        "r = requests.post(sys.argv[1] + '/echo', data=body.encode())\n"
        "print(r.status_code)\n")
    with ModelServer() as srv:
        rec = _cli("record", "--store", str(tmp_path / "s"), "-o", str(tmp_path / "t.steno"),
                   "--", sys.executable, "tool.py", srv.url, cwd=root)
        assert rec.returncode == 0, rec.stderr
    for name in ("stripe", "db", "aws"):
        for where in (tmp_path / "t.steno", tmp_path / "s"):
            p = _cli("log", "scan", str(where), "--secret", VALUES[name], cwd=root)
            assert p.returncode == 0, f"{name} in {where}: {p.stdout}"
    rep = _cli("replay", str(tmp_path / "t.steno"), cwd=root)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout == rec.stdout


def test_a_python_environment_in_the_workspace_is_not_snapshotted_and_stays_usable(
        tmp_path: Path) -> None:
    """A venv under any name (found by its ``pyvenv.cfg``) is an environment, not the
    workspace's content: not copied, not scanned for keys (a real one holds thousands of
    key-shaped test strings, and every recorded process learnt them all), and seen live by
    the sealed replay, as ``.venv/`` is."""
    root = tmp_path / "project"
    lib = root / "env-py" / "lib"
    lib.mkdir(parents=True)
    (root / "env-py" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (lib / "vendored.py").write_text(f"KEY = {VALUES['aws']!r}\n")
    (root / "prog.py").write_text(
        "import sys\nsys.path.insert(0, 'env-py/lib')\nimport vendored\n"
        "print('key', len(vendored.KEY))\n")
    steno = tmp_path / "v.steno"
    rec = _cli("record", "-o", str(steno), "--", sys.executable, "-B", "prog.py", cwd=root)
    assert rec.returncode == 0, rec.stderr
    assert "workspace: 1 files" in rec.stderr, rec.stderr
    assert VALUES["aws"].encode() not in steno.read_bytes()
    rep = _cli("replay", str(steno), cwd=root)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout == rec.stdout
