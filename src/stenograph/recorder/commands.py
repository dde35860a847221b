"""Which commands a program runs are effects: ``git push``, ``gh pr merge``, ``kubectl
apply``, ``terraform apply``... An exec of one gets a durable ``ToolIntent`` before the
new image starts and a ``ToolResult`` (its exit status) when it ends (the shim asks at
every exec of a recorded process, ``MSG_EXEC``; ``recorder/tape.py`` answers).

A command is matched as one line, ``basename(argv[0])`` and the arguments joined by
spaces, against shell-style globs (``fnmatch``). The defaults below are what a person
would list for the tools of coding and ops agents: commands that change something
outside the machine. A policy file (``--policy``) adds its own::

    [commands]
    effect = ["./deploy.sh*", "psql * -c *INSERT*"]
    read_only = ["git push --dry-run*"]      # checked first: never an effect

and its ``[[rule]]`` regexes decide (allow, deny) on the target ``exec <command line>``.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_EFFECTS: tuple[str, ...] = (
    "git push*", "git -C * push*",
    "gh pr create*", "gh pr merge*", "gh pr close*", "gh pr comment*", "gh pr review*",
    "gh issue create*", "gh issue close*", "gh issue comment*", "gh release create*",
    "gh repo create*", "gh repo delete*", "gh api * -X *", "gh api * --method *",
    "kubectl apply*", "kubectl create*", "kubectl delete*", "kubectl patch*",
    "kubectl replace*", "kubectl scale*", "kubectl rollout*", "kubectl set*",
    "kubectl label*", "kubectl annotate*", "kubectl drain*", "kubectl cordon*",
    "helm install*", "helm upgrade*", "helm uninstall*", "helm rollback*",
    "terraform apply*", "terraform destroy*", "terraform import*", "tofu apply*",
    "tofu destroy*", "pulumi up*", "pulumi destroy*",
    "docker push*", "podman push*", "npm publish*", "pnpm publish*", "yarn publish*",
    "twine upload*", "cargo publish*", "gem push*",
    "aws * create-*", "aws * delete-*", "aws * put-*", "aws * update-*", "aws s3 cp*",
    "aws s3 rm*", "aws s3 sync*", "aws s3 mv*",
    "gcloud * create*", "gcloud * delete*", "gcloud * deploy*", "gcloud * update*",
    "az * create*", "az * delete*", "az * update*",
)
"""Commands that are effects unless a policy says otherwise."""

DEFAULT_READ_ONLY_CONNECTIONS: tuple[str, ...] = (
    "tcp *:53", "tcp * port 53", "unix /run/nscd/*", "unix /var/run/nscd/*",
)
"""Connections that are not effects though what they say cannot be read: name lookups.
Every other connection whose first bytes are not an HTTP/1 request (a database's wire
protocol, TLS) is an effect by its destination, ``tcp HOST:PORT`` or ``unix PATH``."""


@functools.lru_cache(maxsize=64)
def _globs(globs: tuple[str, ...]) -> re.Pattern[str] | None:
    """Shell-style globs as one compiled pattern: asked at every exec, and 60 globs
    matched one by one cost more than the rest of the recorder's answer."""
    if not globs:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs), re.DOTALL)


def _any(globs: tuple[str, ...], text: str) -> bool:
    pattern = _globs(globs)
    return pattern is not None and pattern.match(text) is not None


def command_line(argv: Sequence[str]) -> str:
    """How a command is matched and shown: ``git push origin main``."""
    if not argv:
        return ""
    return " ".join([os.path.basename(argv[0]), *argv[1:]])


@dataclass(frozen=True)
class Commands:
    """Which command lines are effects."""

    effect: tuple[str, ...] = DEFAULT_EFFECTS
    read_only: tuple[str, ...] = ()
    read_only_connections: tuple[str, ...] = DEFAULT_READ_ONLY_CONNECTIONS

    def is_effect(self, line: str, *, whole: bool = False) -> bool:
        """Is the command ``line`` an effect? A program the shim cannot see into (``whole``:
        static, Go) is one unless ``read_only`` names it: nothing says what it does."""
        if _any(tuple(self.read_only), line):
            return False
        return whole or _any(tuple(self.effect), line)

    def is_effect_connection(self, name: str) -> bool:
        """Is a connection to ``name`` (``tcp 127.0.0.1:5432``) that does not speak
        HTTP/1 an effect?"""
        return not _any(tuple(self.read_only_connections), name)
