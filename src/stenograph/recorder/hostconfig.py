"""Who may read and write a store: its owner, and whom its config names.

A store holds what its agents saw: prompts, tool output, the files of a workspace, their
secrets masked but their private notes not. It is private to its owner, as PostgreSQL
keeps its data directory and ssh its keys: the directory 0700, every file stenograph
writes 0600 (``PRIVATE_UMASK``), and the host recorder admits only its owner's processes.
``STORE/config.toml`` can widen that:

    [access]
    uids = [1001, 1002]   # other users whose processes may write (their trajectories)
    group = "agents"      # the store's group: directories 0750, files 0640, its members
                          # may read, and write their own trajectories
"""

from __future__ import annotations

import grp
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from stenograph.recorder.errors import BadInput

CONFIG = "config.toml"
PRIVATE_UMASK = 0o077
GROUP_UMASK = 0o027

UMASK_VAR = "STENO_USER_UMASK"
USER_UMASK: int | None = None
"""The umask this process started with: the one a recorded program is given back."""


def keep_private() -> None:
    """From now on every file and directory this process makes is its owner's alone
    (umask 077): the store, its segments, blobs and snapshots, an exported ``.steno``, a
    kept tape. A recorded program still runs with the umask it was started with
    (``user_umask``)."""
    global USER_UMASK
    if USER_UMASK is None:
        now = os.umask(PRIVATE_UMASK)
        given = os.environ.get(UMASK_VAR, "")  # a stenograph that started this one
        USER_UMASK = int(given, 8) & 0o777 if given.isdigit() else now
        os.environ[UMASK_VAR] = f"{USER_UMASK:o}"  # (hidden from recorded programs)
        os.umask(USER_UMASK | PRIVATE_UMASK)


def user_umask() -> int:
    """The umask a program stenograph runs for its user gets: the one it was started
    with (this process's own when it never made itself private)."""
    if USER_UMASK is not None:
        return USER_UMASK
    cur = os.umask(0)
    os.umask(cur)
    return cur


@dataclass(frozen=True)
class HostConfig:
    uids: frozenset[int] = frozenset()
    group: str | None = None

    @classmethod
    def of(cls, store: Path) -> HostConfig:
        path = Path(store) / CONFIG
        try:
            doc = tomllib.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise BadInput(f"the store's config is not valid TOML: {exc}", str(path)) from None
        access = doc.get("access") or {}
        uids = access.get("uids") or []
        group = access.get("group")
        if not isinstance(uids, list) or not all(isinstance(u, int) for u in uids):
            raise BadInput("[access] uids must be a list of numbers", str(path))
        if group is not None and not isinstance(group, str):
            raise BadInput("[access] group must be a group's name", str(path))
        return cls(frozenset(uids), group)

    @property
    def umask(self) -> int:
        return GROUP_UMASK if self.group else PRIVATE_UMASK

    def gid(self) -> int | None:
        if not self.group:
            return None
        try:
            return grp.getgrnam(self.group).gr_gid
        except KeyError:
            raise BadInput(f"no group {self.group!r} on this host", CONFIG) from None

    def admits(self, uid: int, store: Path) -> bool:
        """May a process of ``uid`` write into the store?"""
        if uid == os.stat(store).st_uid or uid in self.uids:
            return True
        gid = self.gid()
        if gid is None:
            return False
        import pwd

        try:
            user = pwd.getpwuid(uid)
        except KeyError:
            return False
        return user.pw_gid == gid or user.pw_name in grp.getgrgid(gid).gr_mem
