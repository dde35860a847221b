"""The recorder's redaction of a live run: what the shim tells it (command lines, a
program's own requests, the first bytes of each send; ``recorder/tapesecrets.py``) is
redacted by the rules the run's hooks use, so a secret the hooks would remove is removed
there too.

The rules are made once per run from what the hooks start from: the program's
environment and argv, the key shapes of the run (the recording's own at a resume or a
fork: ``key-shapes.json`` where the hooks read it) and the values of the workspace's
secret files. Every secret learnt on the way (a key shape in one command line) is
scrubbed from all that follows, as in a process's hooks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from stenograph.interpose.redact import RedactionRules
from stenograph.recorder.keyshapes import KeyShapes, hook_path
from stenograph.recorder.secretfiles import read_values
from stenograph.runner.settings import Settings


class RunRedactor:
    """``recorder.tapesecrets.Redactor`` over one run's ``RedactionRules``: the recorder
    calls it from a thread per process, so one lock keeps what it learns whole."""

    def __init__(self, rules: RedactionRules) -> None:
        self.rules = rules
        self._lock = threading.Lock()

    @classmethod
    def for_run(cls, env: Mapping[str, str], argv: Sequence[str],
                settings: Settings) -> RunRedactor:
        """The rules a run's hooks start from (see the module docstring)."""
        where = hook_path(str(settings.tape) if settings.tape else None, settings.pysock)
        rules = RedactionRules.from_env(dict(env), [str(a) for a in argv],
                                        KeyShapes.read(where))
        rules.learn(*read_values(os.path.dirname(where) if where else None))
        return cls(rules)

    def argv(self, argv: list[str]) -> list[str]:
        with self._lock:
            return self.rules.argv(argv)

    def text(self, text: str) -> str:
        """A URL (``METHOD http://...`` too) as the hooks redact one; other text with its
        key shapes and known secrets scrubbed."""
        with self._lock:
            method, sp, url = text.partition(" ")
            if sp and _is_url(url):
                return f"{method} {self.rules.url(url)}"
            if _is_url(text):
                return self.rules.url(text)
            self.rules.learn_shapes(text)
            return str(self.rules.scrub(text))

    def mask(self, data: bytes) -> bytes:
        with self._lock:
            return self.rules.mask(data)


def _is_url(text: str) -> bool:
    try:
        return urlsplit(text).scheme in ("http", "https") and "\n" not in text
    except ValueError:
        return False
