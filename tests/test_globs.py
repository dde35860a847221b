"""Globs compiled once (commands that are effects, ``recorder/commands.py``; the workspace's
ignore rules, ``recorder/snapshots.py``) must say what ``fnmatch`` says of each alone."""

from __future__ import annotations

import fnmatch

from hypothesis import given, settings
from hypothesis import strategies as st
from scale import examples

from stenograph.recorder.commands import DEFAULT_EFFECTS, Commands
from stenograph.recorder.snapshots import IgnoreRules

ALPHABET = st.sampled_from(list("ab -*?[]!.|()\\^$+{}\n"))
GLOB = st.text(ALPHABET, max_size=8)
LINE = st.text(st.sampled_from(list("ab -.|()\\^$+{}\n[]")), max_size=12)


@settings(max_examples=examples(300), deadline=None)
@given(effect=st.lists(GLOB, max_size=6), read_only=st.lists(GLOB, max_size=3), line=LINE)
def test_one_pattern_says_what_each_glob_says(effect: list[str], read_only: list[str],
                                              line: str) -> None:
    c = Commands(effect=tuple(effect), read_only=tuple(read_only))
    want = (not any(fnmatch.fnmatchcase(line, g) for g in read_only)
            and any(fnmatch.fnmatchcase(line, g) for g in effect))
    assert c.is_effect(line) == want


def test_the_defaults() -> None:
    c = Commands(read_only=("git push --dry-run*",))
    assert c.is_effect("git push origin main")
    assert c.is_effect("kubectl -n x apply -f y") is False  # (the glob wants "apply" first)
    assert c.is_effect("kubectl apply -f y")
    assert not c.is_effect("git push --dry-run origin")
    assert not c.is_effect("git status")
    assert c.is_effect("ls", whole=True)  # nothing says what a static program does
    assert not c.is_effect_connection("tcp 10.0.0.1:53")
    assert c.is_effect_connection("tcp 10.0.0.1:5432")
    assert len(DEFAULT_EFFECTS) > 50


@settings(max_examples=examples(300), deadline=None)
@given(patterns=st.lists(st.text(st.sampled_from(list("ab/*?.[]!")), min_size=1, max_size=6),
                         max_size=6),
       rel=st.text(st.sampled_from(list("ab/.")), min_size=1, max_size=8), is_dir=st.booleans())
def test_ignore_rules_compiled_say_what_each_pattern_says(patterns: list[str], rel: str,
                                                          is_dir: bool) -> None:
    """The workspace's ignore rules (``snapshots.IgnoreRules``), compiled into one pattern
    per kind, against the rule as written: a pattern with a ``/`` inside matches the
    path from the root, one without any name; a trailing ``/`` only directories."""
    name = rel.rsplit("/", 1)[-1]
    want = False
    for pat in patterns:
        p = pat.rstrip("/")
        if pat.endswith("/") and not is_dir:
            continue
        if ("/" in p and fnmatch.fnmatchcase(rel, p.lstrip("/"))) or (
                "/" not in p and fnmatch.fnmatchcase(name, p)):
            want = True
    assert IgnoreRules(tuple(patterns)).ignored(rel, is_dir) == want
