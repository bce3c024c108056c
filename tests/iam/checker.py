"""The IAM conformance checker, pure: the (action, resource) pairs each principal's calls need,
against the statements of that principal's policies.

Two findings, both failures:
- a call its principal is not allowed (no Allow matches, or a Deny does);
- a grant, one (action pattern, resource pattern) pair of an Allow statement, that no call
  used and no allow-list entry excuses. An allow-list entry that excuses nothing is stale, and a
  failure too, so the list stays true.

Matching follows IAM: `*` is any run of characters (`:` and `/` included), `?` one character;
actions match case-insensitively, resources case-sensitively.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache


@lru_cache(maxsize=4096)
def _pattern(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    parts = ("." * (c == "?") + ".*" * (c == "*") or re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def matches_action(pattern: str, action: str) -> bool:
    return _pattern(pattern, True).fullmatch(action) is not None


def matches_resource(pattern: str, resource: str) -> bool:
    return _pattern(pattern, False).fullmatch(resource) is not None


@dataclass(frozen=True)
class Need:
    """One (action, resource) that one recorded call needs."""

    action: str
    resource: str
    call: str  # the call, for the message: "SendMessageBatch on <queue url>"


@dataclass(frozen=True)
class Statement:
    effect: str  # "Allow" or "Deny"
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    source: str  # the policy's logical id

    def covers(self, need: Need) -> bool:
        return any(matches_action(a, need.action) for a in self.actions) and any(
            matches_resource(r, need.resource) for r in self.resources
        )


@dataclass(frozen=True)
class Grant:
    """One (action pattern, resource pattern) pair of an Allow statement."""

    principal: str
    action: str
    resource: str
    source: str

    def used_by(self, need: Need) -> bool:
        return matches_action(self.action, need.action) and matches_resource(
            self.resource, need.resource
        )


@dataclass
class Principal:
    name: str  # "function DispatcherFunction..", "pool worker", ...
    statements: list[Statement] = field(default_factory=list)

    def allows(self, need: Need) -> bool:
        if any(s.effect == "Deny" and s.covers(need) for s in self.statements):
            return False
        return any(s.effect == "Allow" and s.covers(need) for s in self.statements)

    def grants(self) -> list[Grant]:
        return [
            Grant(self.name, action, resource, s.source)
            for s in self.statements
            if s.effect == "Allow"
            for action in s.actions
            for resource in s.resources
        ]


@dataclass(frozen=True)
class Unused:
    """An allow-list entry: grants (principal, action, resource, each a glob over the grant's
    text) that no twin call can use, and why."""

    principal: str
    action: str
    resource: str
    reason: str

    def excuses(self, grant: Grant) -> bool:
        return (
            matches_resource(self.principal, grant.principal)
            and matches_action(self.action, grant.action)
            and matches_resource(self.resource, grant.resource)
        )


def denied(principal: Principal, needs: list[Need]) -> list[str]:
    """What `principal` called without a grant, one line each."""
    return sorted(
        {
            f"{principal.name}: {n.action} on {n.resource} (for {n.call}) is not allowed"
            for n in needs
            if not principal.allows(n)
        }
    )


def unused(
    principals: dict[str, Principal], needs: dict[str, list[Need]], allow: list[Unused]
) -> tuple[list[str], list[Unused]]:
    """Grants no call used and no entry of `allow` excuses (one line each), and the entries
    of `allow` that excused nothing."""
    findings: list[str] = []
    excusing: set[Unused] = set()
    for name, principal in principals.items():
        for grant in principal.grants():
            if any(grant.used_by(n) for n in needs.get(name, [])):
                continue
            reasons = [entry for entry in allow if entry.excuses(grant)]
            excusing.update(reasons)
            if not reasons:
                findings.append(
                    f"{name}: {grant.action} on {grant.resource} ({grant.source}) is granted "
                    "but no recorded call used it"
                )
    return sorted(set(findings)), [entry for entry in allow if entry not in excusing]
