"""The blocking SDK and the asyncio SDK are one API: every public method of each async class
has a blocking twin with the same parameters (names, kinds, defaults, annotations) and the
matching return type, so the two faces cannot drift apart."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Any

import pytest

from trialbox.sdk import AsyncClient, AsyncHandle, AsyncSession, Client, Handle, Session

# The async face's names for what the blocking face calls otherwise.
SYNC_NAMES = {
    "AsyncClient": "Client",
    "AsyncSession": "Session",
    "AsyncHandle": "Handle",
    "SessionOpening": "Session",
    "AsyncIterator": "Iterator",
}
RENAMED = {"aclose": "close", "__aenter__": "__enter__", "__aexit__": "__exit__"}
# Async members with no blocking twin, each with its reason. A stale entry fails the test.
ASYNC_ONLY = {
    AsyncClient: {
        "sessions": "what its sessions share with it (a SessionContext); a blocking Client's "
        "sessions run on its AsyncClient's",
    },
    AsyncSession: {
        "open": "a blocking Session is open when it is made (Client.session opens it)",
        "context": "what it shares with its client's other sessions (a SessionContext)",
        "io": "the client's session I/O executor, shared by its sessions",
        "on_close": "the client's hook that forgets a closed session",
    },
    AsyncHandle: {
        "resolve": "the client's pump resolves a handle; the blocking Handle reads the outcome",
        "future": "the asyncio future `await handle.result()` waits on",
        "shared": "the same outcome for other threads: what the blocking Handle waits on",
    },
}
PAIRS = [(AsyncClient, Client), (AsyncSession, Session), (AsyncHandle, Handle)]
# Made by the Client around the async object (never by a user): constructors differ by design.
WRAPPED = {AsyncSession, AsyncHandle}


def public(cls: type) -> dict[str, Any]:
    """The class's public callables and properties (dunder context managers and __init__
    included), by name."""
    names = {n for n in dir(cls) if not n.startswith("_")}
    names |= {n for n in ("__init__", "__aenter__", "__aexit__", "__enter__", "__exit__")
              if n in vars(cls)}  # fmt: skip
    members = {}
    for name in names:
        member = inspect.getattr_static(cls, name)
        if isinstance(member, classmethod | staticmethod):
            member = member.__func__
        if callable(member) or isinstance(member, property):
            members[name] = member
    return members


def instance_attributes(cls: type) -> set[str]:
    """The public attributes its `__init__` assigns (`self.name = ...`), read from its source."""
    source = textwrap.dedent(inspect.getsource(cls.__init__))  # type: ignore[misc]
    names = set()
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                if (
                    isinstance(each, ast.Attribute)
                    and isinstance(each.value, ast.Name)
                    and each.value.id == "self"
                    and not each.attr.startswith("_")
                ):
                    names.add(each.attr)
    return names


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: f"{pair[0].__name__}")
def test_every_public_attribute_of_the_async_face_is_on_the_blocking_face(
    pair: tuple[type, type],
) -> None:
    """Was a break: the faces test compared methods and properties only, and the blocking
    Handle lacked `request` (docs/sdk.md's example used it), Client lacked `resources` and
    `endpoint_url`, Session lacked `task`, `tags`, `closed`..."""
    aio, sync = pair
    only = ASYNC_ONLY.get(aio, {})
    sync_names = set(public(sync)) | instance_attributes(sync)
    missing = sorted(instance_attributes(aio) - sync_names - set(only))
    assert missing == [], f"{sync.__name__} lacks the attributes {missing}"


def synced(annotation: object) -> str:
    text = str(annotation)
    for name, sync in SYNC_NAMES.items():
        text = re.sub(rf"\b{name}\b", sync, text)
    return text


def shape(member: Any) -> list[tuple[str, str, str, str]] | str:
    """Parameters as (name, kind, default, annotation), then the return annotation; for a
    property, its type."""
    if isinstance(member, property):
        assert member.fget is not None
        return synced(inspect.signature(member.fget).return_annotation)
    signature = inspect.signature(member)
    params = [
        (p.name, p.kind.name, repr(p.default), synced(p.annotation))
        for p in signature.parameters.values()
    ]
    return [*params, ("->", "", "", synced(signature.return_annotation))]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: f"{pair[0].__name__}")
def test_every_async_method_has_a_blocking_twin_with_the_same_signature(
    pair: tuple[type, type],
) -> None:
    aio, sync = pair
    async_members, sync_members = public(aio), public(sync)
    only = ASYNC_ONLY.get(aio, {})
    missing = sorted(
        name for name in async_members
        if RENAMED.get(name, name) not in sync_members and name not in only
    )  # fmt: skip
    assert missing == [], f"{sync.__name__} lacks {missing}"
    stale = sorted(name for name in only if RENAMED.get(name, name) in sync_members)
    assert stale == [], f"{stale} have a blocking twin now: drop them from ASYNC_ONLY"
    drifted = {
        name: (shape(member), shape(sync_members[RENAMED.get(name, name)]))
        for name, member in async_members.items()
        if name not in only
        and name not in ("__aenter__", "__aexit__")  # async vs sync protocols: checked apart
        and not (name == "__init__" and aio in WRAPPED)
        and shape(member) != shape(sync_members[RENAMED.get(name, name)])
    }
    assert drifted == {}, "\n".join(
        f"{n}:\n  async {a}\n  sync  {s}" for n, (a, s) in drifted.items()
    )


def test_no_public_signature_names_a_private_type() -> None:
    private: list[str] = []
    for aio, sync in PAIRS:
        for cls in (aio, sync):
            for name, member in public(cls).items():
                if re.search(r"(?<![\w.])_[A-Za-z]", str(shape(member))):
                    private.append(f"{cls.__name__}.{name}: {shape(member)}")
    assert private == []
