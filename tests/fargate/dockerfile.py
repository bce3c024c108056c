"""Just enough of Docker's build semantics to build the sandbox image without a daemon: the
Dockerfile's instructions (with `\\` continuations, `ENV K=V K2=V2`, shell and JSON forms) and
the build context filtered by `.dockerignore`, with the matching rules of moby's
patternmatcher (patterns in order, the last match wins, `!` re-includes, `**` spans
directories, and a pattern that matches a parent directory matches everything under it)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

# Docker's default PATH, which every image config starts from (debian's sets no other).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    args: str  # the rest of the logical line, continuations joined
    line: int  # where it starts (1-based)

    def json_or_shell(self) -> list[str]:
        """The exec form (a JSON array) as is; the shell form as Docker runs it."""
        text = self.args.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                pass
            else:
                if isinstance(value, list) and all(isinstance(v, str) for v in value):
                    return value
        return ["/bin/sh", "-c", text]


def instructions(text: str) -> list[Instruction]:
    """Logical lines: comments dropped, `\\` continuations joined (comment lines inside a
    continuation are skipped, as Docker does)."""
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        logical = " ".join(part.strip() for part in pending if part.strip())
        pending = []
        keyword, _, args = logical.partition(" ")
        found.append(Instruction(keyword.upper(), args.strip(), start))
    if pending:
        raise ValueError(f"Dockerfile ends inside a continuation (from line {start})")
    return found


def substitute(text: str, env: dict[str, str]) -> str:
    """`$VAR` and `${VAR}` from the build's environment so far (unset: empty)."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), text)


def parse_env(args: str, env: dict[str, str]) -> dict[str, str]:
    """`ENV K=V K2="V 2"` (and the legacy `ENV K V`): the pairs it sets, in order."""
    words = shlex.split(args, posix=True)
    if not words:
        raise ValueError("ENV needs at least one variable")
    if "=" not in words[0]:
        key, _, value = args.strip().partition(" ")
        return {key: substitute(value.strip(), env)}
    pairs: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not key:
            raise ValueError(f"ENV: {word!r} is not KEY=VALUE")
        pairs[key] = substitute(value, env | pairs)
    return pairs


@dataclass(frozen=True)
class Copy:
    sources: list[str]  # relative to the build context
    dest: str

    @classmethod
    def parse(cls, args: str, env: dict[str, str]) -> Copy:
        text = args.strip()
        words = json.loads(text) if text.startswith("[") else shlex.split(text)
        flags = [w for w in words if w.startswith("--")]
        if flags:
            raise ValueError(f"COPY flags are not supported here: {flags}")
        if len(words) < 2:
            raise ValueError(f"COPY needs a source and a destination: {args!r}")
        *sources, dest = (substitute(w, env) for w in words)
        if len(sources) > 1 and not dest.endswith("/"):
            raise ValueError("COPY with several sources needs a destination ending in /")
        return cls([s.lstrip("/") for s in sources], dest)


# .dockerignore -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    text: str
    exclusion: bool  # a `!` pattern: re-includes
    regex: re.Pattern[str]


def _compile(pattern: str) -> re.Pattern[str]:
    """moby's patternmatcher: `*` and `?` stay within one path element, `**/` spans any
    number of directories (none included) and a trailing `**` matches everything below."""
    out = "^"
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            if pattern[i + 1 : i + 2] == "*":
                i += 2
                if pattern[i : i + 1] == "/":
                    i += 1
                    out += "(.*/)?" if i < len(pattern) else ".*"
                else:
                    out += ".*"
                continue
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                raise ValueError(f"unterminated [ in .dockerignore pattern {pattern!r}")
            out += pattern[i : end + 1]
            i = end
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out + "$")


def _clean(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/".join(parts)


def parse_dockerignore(text: str) -> list[Pattern]:
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        if exclusion:
            line = line[1:].strip()
            if not line:
                raise ValueError("illegal exclusion pattern: '!'")
        cleaned = _clean(line)
        if cleaned:
            patterns.append(Pattern(cleaned, exclusion, _compile(cleaned)))
    return patterns


def ignored(path: str, patterns: list[Pattern]) -> bool:
    """Whether the context path (relative, `/`-separated) is left out of the build context."""
    path = _clean(path)
    parents = path.split("/")
    candidates = ["/".join(parents[: i + 1]) for i in range(len(parents))]
    excluded = False
    for pattern in patterns:
        if any(pattern.regex.match(candidate) for candidate in candidates):
            excluded = not pattern.exclusion
    return excluded


class Context:
    """The build context (a directory) as the builder sees it after `.dockerignore`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        ignore = root / ".dockerignore"
        self.patterns = parse_dockerignore(ignore.read_text()) if ignore.exists() else []

    def included(self, relative: str) -> bool:
        return not ignored(relative, self.patterns)

    def files(self, source: str) -> list[str]:
        """Every file (or symlink) a COPY of `source` takes, relative to the context; raises
        like `docker build` when nothing of it is left."""
        path = self.root / source
        if not path.exists() and not path.is_symlink():
            raise FileNotFoundError(f"COPY source {source!r} is not in the build context")
        if path.is_dir() and not path.is_symlink():
            taken = sorted(
                str(p.relative_to(self.root))
                for p in path.rglob("*")
                if (p.is_file() or p.is_symlink()) and self.included(str(p.relative_to(self.root)))
            )
        else:
            taken = [source] if self.included(source) else []
        if not taken:
            raise FileNotFoundError(
                f"COPY source {source!r} is excluded by .dockerignore (nothing of it is left)"
            )
        return taken
