"""Which command lines are effects (``recorder/commands.py``): the globs are matched as
one compiled pattern, and that must say what ``fnmatch`` says of each glob alone."""

from __future__ import annotations

import fnmatch

from hypothesis import given, settings
from hypothesis import strategies as st

from scale import examples
from stenograph.recorder.commands import DEFAULT_EFFECTS, Commands

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
