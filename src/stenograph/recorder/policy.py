"""Authorization and budgets: what the recorder decides before every model call and
effect, when a run is given ``--policy FILE`` or a budget.

A policy file (TOML or JSON) is a list of rules, first match wins::

    default = "allow"            # what no rule matches gets (allow | deny | hold)
    [[rule]]
    match = "^POST .*/payments"  # a regex searched in the call's target
    action = "hold"              # allow | deny | hold (for a person: stenograph.approval)
    summary = "a payment"        # what the person is shown (hold)
    [[probe]]                    # how a resume settles an effect in doubt by itself
    match = "^exec git push"
    command = "git fetch -q origin && git merge-base --is-ancestor HEAD origin/main"

A target is what the log calls it elsewhere: ``METHOD URL`` for HTTP (model calls
too, and a program's own HTTP/1 requests), ``tool NAME`` for a declared tool, ``exec
COMMAND LINE`` for every command a process runs, ``connect tcp HOST:PORT`` for a
connection that does not speak HTTP/1. A ``[commands]`` table lists more commands that
are effects, a ``[connections]`` table's ``read_only`` the destinations that are not
(``recorder/commands.py``). The policy's version is the sha256 of the
file's bytes. Budgets: ``tokens`` (input + output, summed over the run's model
replies) and ``usd`` (the same tokens priced per model: ``--prices FILE``, a JSON map
``{model: [usd per 1M input tokens, usd per 1M output tokens]}``, over the built-in
``PRICES``). A call is stopped once the budget is spent (a call may overshoot it: the
check is before the call, the spending known after).

Every decision becomes an ``Authorized`` event: ``{call_id, target, decision, reason,
policy, tokens_used, tokens_left, usd_used, usd_left}``, appended before the answer.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.commands import DEFAULT_EFFECTS, DEFAULT_READ_ONLY_CONNECTIONS, Commands
from stenograph.recorder.errors import BadInput

ACTIONS = ("allow", "deny", "hold")

PRICES: dict[str, tuple[float, float]] = {
    # usd per 1M input, output tokens; list prices of late 2026, override with --prices
    "gpt-4o": (2.5, 10.0),
    "gpt-4o-mini": (0.15, 0.6),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4.1-mini": (0.4, 1.6),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-5-haiku": (0.8, 4.0),
}


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    action: str
    summary: str | None = None


@dataclass(frozen=True)
class Probe:
    """A command that says whether an effect in doubt happened: exit 0 it did, 1 it did
    not, anything else it cannot tell (a person is asked)."""

    pattern: re.Pattern[str]
    command: str


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...] = ()
    default: str = "allow"
    version: str | None = None
    commands: Commands = field(default_factory=Commands)
    """Which commands are effects: the defaults plus the file's ``[commands]``."""
    probes: tuple[Probe, ...] = ()
    """How a resume finds out whether an effect in doubt happened (``[[probe]]``)."""

    def probe_for(self, target: str) -> Probe | None:
        return next((pr for pr in self.probes if pr.pattern.search(target)), None)

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        """The policy in ``path``; ``BadInput`` naming what is wrong with it."""
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise BadInput(f"--policy: {exc.strerror}", str(p)) from None
        try:
            doc = json.loads(data) if p.suffix == ".json" else tomllib.loads(data.decode())
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadInput(f"--policy: not {'JSON' if p.suffix == '.json' else 'TOML'}: "
                           f"{exc}", str(p)) from None
        if not isinstance(doc, dict):
            raise BadInput("--policy: the file is not a table of rules", str(p))
        default = doc.get("default", "allow")
        if default not in ACTIONS:
            raise BadInput(f"--policy: default must be one of {', '.join(ACTIONS)}", str(p))
        rules = []
        for i, r in enumerate(doc.get("rule") or doc.get("rules") or []):
            if not isinstance(r, dict) or not isinstance(r.get("match"), str):
                raise BadInput(f"--policy: rule {i + 1} has no match pattern", str(p))
            if r.get("action") not in ACTIONS:
                raise BadInput(f"--policy: rule {i + 1}: action must be one of "
                               f"{', '.join(ACTIONS)}", str(p))
            try:
                pat = re.compile(r["match"])
            except re.error as exc:
                raise BadInput(f"--policy: rule {i + 1}: bad regex: {exc}", str(p)) from None
            rules.append(Rule(pat, r["action"], r.get("summary")))
        lists: dict[str, tuple[str, ...]] = {}
        for table, key in (("commands", "effect"), ("commands", "read_only"),
                           ("connections", "read_only")):
            t = doc.get(table) or {}
            globs = t.get(key, []) if isinstance(t, dict) else None
            if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
                raise BadInput(f"--policy: [{table}] {key} must be a list of globs", str(p))
            lists[f"{table}.{key}"] = tuple(globs)
        commands = Commands(DEFAULT_EFFECTS + lists["commands.effect"],
                            lists["commands.read_only"],
                            DEFAULT_READ_ONLY_CONNECTIONS + lists["connections.read_only"])
        probes = []
        for i, r in enumerate(doc.get("probe") or []):
            if not (isinstance(r, dict) and isinstance(r.get("match"), str)
                    and isinstance(r.get("command"), str) and r["command"].strip()):
                raise BadInput(f"--policy: probe {i + 1} needs a match pattern and a command",
                               str(p))
            try:
                probes.append(Probe(re.compile(r["match"]), r["command"]))
            except re.error as exc:
                raise BadInput(f"--policy: probe {i + 1}: bad regex: {exc}", str(p)) from None
        return cls(tuple(rules), default, hashlib.sha256(data).hexdigest(), commands,
                   tuple(probes))

    def decide(self, target: str) -> tuple[str, str | None]:
        """(action, summary) for a call to ``target``."""
        for r in self.rules:
            if r.pattern.search(target):
                return r.action, r.summary
        return self.default, None


def load_prices(path: str | Path | None) -> dict[str, tuple[float, float]]:
    prices = dict(PRICES)
    if path is None:
        return prices
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"--prices: {exc}", str(path)) from None
    if not isinstance(doc, dict):
        raise BadInput("--prices: not a JSON map of model -> [input, output]", str(path))
    for model, pair in doc.items():
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(x, (int, float)) for x in pair)):
            raise BadInput(f"--prices: {model}: want [usd per 1M input, output tokens]",
                           str(path))
        prices[str(model)] = (float(pair[0]), float(pair[1]))
    return prices


def price_of(prices: dict[str, tuple[float, float]], model: str) -> tuple[float, float] | None:
    """The price of ``model``: an exact entry, else the longest entry it starts with
    (``gpt-4o-2024-08-06`` is priced as ``gpt-4o``)."""
    if model in prices:
        return prices[model]
    best = max((k for k in prices if model.startswith(k)), key=len, default=None)
    return prices[best] if best else None


# ------------------------------------------------------------------------------- usage


def json_objects(body: bytes) -> Iterable[dict[str, Any]]:
    """The JSON objects of a response body: the body itself, or each SSE ``data:`` line."""
    text = body.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return
        if isinstance(doc, dict):
            yield doc
        return
    for line in text.splitlines():
        if line.startswith("data:"):
            try:
                doc = json.loads(line[5:].strip())
            except ValueError:
                continue
            if isinstance(doc, dict):
                yield doc


def usage_of(body: bytes) -> tuple[str | None, int, int]:
    """(served model, input tokens, output tokens) of a model reply: OpenAI chat
    completions and Responses, Anthropic messages; streamed or not."""
    model, tin, tout = None, 0, 0
    for doc in json_objects(body):
        for holder in (doc, doc.get("response"), doc.get("message")):
            if not isinstance(holder, dict):
                continue
            if isinstance(holder.get("model"), str):
                model = holder["model"]
            u = holder.get("usage")
            if isinstance(u, dict):
                i = u.get("prompt_tokens", u.get("input_tokens"))
                o = u.get("completion_tokens", u.get("output_tokens"))
                if isinstance(i, int) and i:
                    tin = i
                if isinstance(o, int) and o:
                    tout = o
        if isinstance(doc.get("usage"), dict) and doc.get("type") == "message_delta":
            o = doc["usage"].get("output_tokens")
            if isinstance(o, int):
                tout = o
    return model, tin, tout


@dataclass
class Budget:
    tokens: int | None = None
    usd: float | None = None
    prices: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(PRICES))
    tokens_used: int = 0
    usd_used: float = 0.0
    unpriced: set[str] = field(default_factory=set)

    def spend(self, model: str | None, tin: int, tout: int) -> None:
        self.tokens_used += tin + tout
        price = price_of(self.prices, model or "")
        if price is None:
            if model:
                self.unpriced.add(model)
            return
        self.usd_used += (tin * price[0] + tout * price[1]) / 1e6

    def exhausted(self) -> str | None:
        if self.tokens is not None and self.tokens_used >= self.tokens:
            return f"the token budget ({self.tokens}) is spent: {self.tokens_used} used"
        if self.usd is not None and self.usd_used >= self.usd:
            return f"the budget of ${self.usd:g} is spent: ${self.usd_used:.4f} used"
        return None

    def left(self) -> dict[str, Any]:
        return {"tokens_used": self.tokens_used,
                "tokens_left": None if self.tokens is None else self.tokens - self.tokens_used,
                "usd_used": round(self.usd_used, 6),
                "usd_left": None if self.usd is None else round(self.usd - self.usd_used, 6)}


@dataclass
class Authorizer:
    """The recorder's side: decides, and keeps the spending."""

    policy: Policy = field(default_factory=Policy)
    budget: Budget = field(default_factory=Budget)

    def decide(self, target: str, channel: str) -> dict[str, Any]:
        """The ``Authorized`` body for a call to ``target`` (without the call id)."""
        spent = self.budget.exhausted()
        if spent is not None:
            decision, reason, summary = "stop", spent, None
        else:
            decision, summary = self.policy.decide(target)
            reason = "policy" if self.policy.rules or self.policy.default != "allow" else None
        return {"target": target, "channel": channel, "decision": decision,
                "reason": reason, "summary": summary, "policy": self.policy.version,
                **self.budget.left()}


def authorizer_for(policy_file: str | None, budget_tokens: int | None,
                   budget_usd: float | None, prices_file: str | None) -> Authorizer | None:
    """The ``Authorizer`` for a worker's options, or None (no checks, no cost)."""
    if policy_file is None and budget_tokens is None and budget_usd is None:
        if prices_file is not None:
            raise BadInput("--prices needs --budget-usd")
        return None
    policy = Policy.load(policy_file) if policy_file else Policy()
    return Authorizer(policy, Budget(budget_tokens, budget_usd, load_prices(prices_file)))
