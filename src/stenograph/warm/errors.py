"""How the warm tier and the object store fail: their errors (exit 7: what was shipped
stays, the cursor says how far) and the one line a person reads, without a password."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from stenograph.recorder.errors import StenographError


class WarmTierError(StenographError):
    """PostgreSQL refused the shipment, or cannot be reached (exit 7: what was shipped
    stays, the cursor says how far; the next ``ship`` goes on from there)."""

    exit_code = 7


class ObjectStoreError(StenographError):
    """The object store refused a write or a read, or cannot be reached (exit 7)."""

    exit_code = 7


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        p = urlsplit(url)
    except ValueError:
        return "the warm tier"
    if p.password:
        netloc = p.netloc.replace(f":{p.password}@", ":***@")
        return urlunsplit(p._replace(netloc=netloc))
    return url
