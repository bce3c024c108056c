"""Capped capture of a stream: keep the head and the tail, count what was dropped between.

Tracebacks are at the end of stderr, so the tail matters as much as the head. Memory stays at
`limit` bytes per stream however much the sandbox writes.
"""

from __future__ import annotations


class HeadTail:
    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            excess = len(self.tail) - self.tail_limit
            if excess > 0:
                del self.tail[:excess]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        """UTF-8 with replacement characters; a marker stands where bytes were dropped."""
        head = self.head.decode("utf-8", errors="replace")
        if not self.truncated:
            return head + self.tail.decode("utf-8", errors="replace")
        marker = f"\n[... {self.dropped} bytes omitted ...]\n"
        return head + marker + self.tail.decode("utf-8", errors="replace")


class Collector:
    """Keeps everything up to a hard cap (the trusted plugin's report channel)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.overflowed = False

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if len(chunk) > room:
            self.overflowed = True
        self.data += chunk[: max(room, 0)]
