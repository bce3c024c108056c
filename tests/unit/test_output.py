"""HeadTail: capped capture keeping the head and the tail of a stream."""

from __future__ import annotations

from trialbox.sandbox.output import Collector, HeadTail


def test_under_the_limit_keeps_everything_without_marker() -> None:
    capture = HeadTail(10)
    capture.feed(b"abc")
    capture.feed(b"defg")
    assert (capture.total, capture.dropped, capture.truncated) == (7, 0, False)
    assert capture.text() == "abcdefg"


def test_exactly_the_limit_is_not_truncated() -> None:
    capture = HeadTail(10)
    capture.feed(b"0123456789")
    assert (bytes(capture.head), bytes(capture.tail)) == (b"01234", b"56789")
    assert capture.text() == "0123456789"


def test_keeps_head_and_tail_and_counts_dropped_bytes() -> None:
    capture = HeadTail(10)
    capture.feed(b"HEAD-")
    capture.feed(b"x" * 100)
    capture.feed(b"-TAIL")
    assert bytes(capture.head) == b"HEAD-"
    assert bytes(capture.tail) == b"x-TAIL"[-5:]
    assert (capture.total, capture.dropped, capture.truncated) == (110, 100, True)
    assert capture.text() == "HEAD-\n[... 100 bytes omitted ...]\n-TAIL"


def test_odd_limit_gives_the_extra_byte_to_the_tail() -> None:
    capture = HeadTail(5)
    capture.feed(b"abcdefghij")
    assert (bytes(capture.head), bytes(capture.tail), capture.dropped) == (b"ab", b"hij", 5)


def test_invalid_utf8_becomes_replacement_character() -> None:
    capture = HeadTail(100)
    capture.feed(b"ok \xff\xfe end")
    assert capture.text() == "ok \ufffd\ufffd end"


def test_multibyte_character_split_by_the_cut_is_replaced() -> None:
    capture = HeadTail(4)
    capture.feed("aé".encode() + b"zzzz" + "éb".encode())
    assert capture.text() == "a\ufffd\n[... 6 bytes omitted ...]\n\ufffdb"


def test_100_mib_in_64_kib_chunks_stays_within_the_limit() -> None:
    limit = 65_536
    capture = HeadTail(limit)
    chunk = bytes(range(256)) * 256  # 64 KiB
    for _ in range(1600):  # 100 MiB
        capture.feed(chunk)
        assert len(capture.head) + len(capture.tail) <= limit
    assert capture.total == 100 * 1024 * 1024
    assert capture.dropped == 100 * 1024 * 1024 - limit
    assert capture.text().count("[... 104792064 bytes omitted ...]") == 1


def test_collector_caps_and_flags_overflow() -> None:
    collector = Collector(8)
    collector.feed(b"12345")
    assert (bytes(collector.data), collector.overflowed) == (b"12345", False)
    collector.feed(b"6789")
    collector.feed(b"more")
    assert (bytes(collector.data), collector.overflowed) == (b"12345678", True)
