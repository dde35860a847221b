"""The program's environment and command line as recorded, and as a replay gives them
back: whole, with every secret redacted (``interpose/redact.py``'s rules, the known key
shapes too), and a redacted value taking the replaying environment's value."""

from __future__ import annotations

from stenograph.interpose.redact import REDACTED, RedactionRules
from stenograph.recorder.keyshapes import KeyShapes
from stenograph.runner.settings import USER_SETTINGS


def recorded_env(environ: dict[str, str], shapes: KeyShapes | None = None) -> dict[str, str]:
    """The program's whole environment as recorded: the replay restores exactly this, so
    e.g. ``OPENAI_BASE_URL`` (part of every request fingerprint) is the recorded one. A
    secret-named variable's value, a URL's password, a value in a known key's shape and
    copies of any of them are redacted. The user's hook settings are kept (a replay in a
    shell without them must see the calls as the recording did); the harness's own
    variables are not."""
    rules = RedactionRules.from_env(environ, [], shapes)
    return {k: rules.env_value(k, v) for k, v in environ.items()
            if (not k.startswith("STENO_") or k.startswith(USER_SETTINGS))
            and k != "LD_PRELOAD"}


def recorded_argv(argv: list[str], environ: dict[str, str],
                  shapes: KeyShapes | None = None) -> list[str]:
    """The command as recorded: values of secret-named flags (``--api-key V``,
    ``--token=V``) and arguments equal to a secret of the environment redacted."""
    return RedactionRules.from_env(environ, [], shapes).argv(argv)


def replay_env(recorded: dict[str, str], environ: dict[str, str]) -> dict[str, str]:
    """The recorded environment; a redacted secret takes this environment's value if set."""
    return {k: environ.get(k, v) if v == REDACTED else v for k, v in recorded.items()}
