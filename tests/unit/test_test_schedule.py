"""How `make test` orders and records the suite's groups (tests/support/schedule.py), and the
machine's seats every test takes (tests/support/seats.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.support import schedule, seats
from trialbox.sandbox.shared_files import try_exclusive

ROOT = Path(__file__).resolve().parents[2]


def held_elsewhere(seat: Path) -> bool:
    fd = try_exclusive(seat)
    if fd is not None:
        os.close(fd)
    return fd is None


def items(*nodeids: str, alone: tuple[str, ...] = ()) -> list[Any]:
    def item(nodeid: str) -> SimpleNamespace:
        marked = nodeid in alone
        return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: marked or None)

    return [item(n) for n in nodeids]


def test_a_group_is_a_module_except_the_shared_packages() -> None:
    assert (
        schedule.group_of("tests/e2e/test_pipeline.py::test_x[a-b]") == "tests/e2e/test_pipeline.py"
    )
    assert schedule.group_of("tests/fargate/test_jobs.py::test_y") == "tests/fargate/"
    assert schedule.group_of("tests/fargate/test_redteam.py") == "tests/fargate/"
    alone = "tests/fargate/test_grading_integrity.py"
    assert schedule.group_of(f"{alone}::test_z") == alone


def test_groups_run_longest_first_and_stay_whole_in_collection_order() -> None:
    collected = items(
        "tests/unit/test_a.py::one",
        "tests/unit/test_a.py::two",
        "tests/fargate/test_jobs.py::j",
        "tests/fargate/test_leftovers.py::l",
        "tests/e2e/test_b.py::b",
        "tests/e2e/test_new.py::n1",
        "tests/e2e/test_new.py::n2",
        "tests/e2e/test_new.py::n3",
    )
    known = schedule.Known(
        record={"tests/unit/test_a.py::one": 0.5, "tests/e2e/test_b.py::b": 4.0},
        seed={"tests/fargate/": 90.0, "tests/e2e/test_b.py": 1.0},  # the record wins
    )
    schedule.slowest_groups_first(collected, known)
    assert [i.nodeid for i in collected] == [
        "tests/fargate/test_jobs.py::j",
        "tests/fargate/test_leftovers.py::l",
        "tests/e2e/test_b.py::b",
        "tests/e2e/test_new.py::n1",  # unknown: 1 s a test, 3 s
        "tests/e2e/test_new.py::n2",
        "tests/e2e/test_new.py::n3",
        "tests/unit/test_a.py::one",  # 0.5 s known, 1 s for the other
        "tests/unit/test_a.py::two",
    ]


def test_a_module_s_tests_marked_alone_run_last_in_it_one_after_the_other() -> None:
    collected = items(
        "tests/fargate/test_jobs.py::a",
        "tests/fargate/test_jobs.py::b",
        "tests/fargate/test_jobs.py::c",
        "tests/fargate/test_leftovers.py::l",
        "tests/sandbox/test_rlimit.py::r1",
        "tests/sandbox/test_rlimit.py::r2",
        "tests/sandbox/test_rlimit.py::r3",
        "tests/sandbox/test_rlimit.py::r4",
        alone=("tests/fargate/test_jobs.py::a", "tests/sandbox/test_rlimit.py::r1",
               "tests/sandbox/test_rlimit.py::r3"),
    )  # fmt: skip
    known = schedule.Known(seed={"tests/fargate/": 90.0, "tests/sandbox/test_rlimit.py": 9.0})
    schedule.slowest_groups_first(collected, known)
    assert [i.nodeid.split("::")[1] for i in collected] == [
        "b", "c", "a",  # last in its module, not in its group: the module's fixtures stay built
        "l",
        "r2", "r4", "r1", "r3",  # as collected among themselves
    ]  # fmt: skip


def test_tests_alone_in_a_row_keep_every_seat_from_the_first_to_the_last(tmp_path: Path) -> None:
    row = seats.InARow(2, tmp_path)

    def held() -> list[bool]:
        return [held_elsewhere(tmp_path / str(n)) for n in range(2)]

    with row.alone(last=lambda: False):
        assert held() == [True, True]
    assert held() == [True, True]  # kept for the next
    with row.alone(last=lambda: True):
        pass
    assert held() == [False, False]
    with seats.seat(2, tmp_path) as taken:  # a single seat is free to others again
        assert len(taken) == 1
    # An interrupted test alone gives every seat back, whatever follows it.
    with contextlib.suppress(KeyboardInterrupt), row.alone(last=lambda: False):
        raise KeyboardInterrupt
    assert held() == [False, False]


def test_a_record_keeps_the_tests_a_run_did_not_touch(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/e2e/test_b.py::b": 7.0, "tests/unit/test_a.py::one": 9.0}))
    schedule.record({"tests/unit/test_a.py::one": 0.25, "tests/fargate/test_jobs.py::j": 3.0}, path)
    assert json.loads(path.read_text()) == {
        "tests/e2e/test_b.py::b": 7.0,
        "tests/fargate/test_jobs.py::j": 3.0,
        "tests/unit/test_a.py::one": 0.25,
    }
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["durations.json"]


def test_the_seed_sums_per_group() -> None:
    spent = {
        "tests/unit/test_a.py::one": 0.25,
        "tests/unit/test_a.py::two": 0.5,
        "tests/fargate/test_jobs.py::j": 3.0,
    }
    assert schedule.by_group(spent) == {"tests/fargate/": 3.0, "tests/unit/test_a.py": 0.8}


def test_a_broken_record_counts_as_none(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text("{not json")
    schedule.record({"tests/e2e/test_b.py::b": 1.0}, path)
    assert json.loads(path.read_text()) == {"tests/e2e/test_b.py::b": 1.0}


def test_a_test_waits_for_a_seat_and_a_dead_holder_frees_it(tmp_path: Path) -> None:
    taken = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def holder() -> None:
        with seats.seat(1, tmp_path):
            order.append("first holds")
            taken.set()
            release.wait(5)
            order.append("first leaves")

    thread = threading.Thread(target=holder)
    thread.start()
    assert taken.wait(5)
    threading.Timer(0.3, release.set).start()
    with seats.seat(1, tmp_path) as (number,):
        order.append("second holds")
    thread.join()
    assert (number, order) == (0, ["first holds", "first leaves", "second holds"])
    # A holder killed outright: the kernel drops its flock.
    code = (
        "import time\nfrom pathlib import Path\nfrom tests.support import seats\n"
        f"with seats.seat(1, Path({str(tmp_path)!r})):\n"
        "    print('in', flush=True)\n    time.sleep(60)\n"
    )
    held = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert held.stdout is not None and held.stdout.readline() == "in\n"
    held.kill()
    held.wait()
    with seats.seat(1, tmp_path) as numbers:
        assert numbers == [0]


def test_a_test_alone_waits_for_every_seat_and_holds_back_new_ones(tmp_path: Path) -> None:
    order: list[str] = []
    first = seats.seat(2, tmp_path)
    assert first.__enter__() == [0]

    def alone() -> None:
        with seats.seat(2, tmp_path, alone=True) as numbers:
            order.append(f"alone holds {numbers}")
            time.sleep(0.3)
            order.append("alone leaves")

    thread = threading.Thread(target=alone)
    thread.start()
    while not held_elsewhere(tmp_path / "1"):  # the alone test holds the gate, then seat 1
        time.sleep(0.01)
    threading.Timer(
        0.2, lambda: (order.append("first leaves"), first.__exit__(None, None, None))
    ).start()
    with seats.seat(2, tmp_path) as numbers:  # seat 1 is not free to it: the gate is held
        order.append(f"next holds {numbers}")
    thread.join()
    assert order == ["first leaves", "alone holds [0, 1]", "alone leaves", "next holds [0]"]


def test_a_test_alone_leaves_the_gate_free_while_a_long_test_holds_a_seat(tmp_path: Path) -> None:
    """Was the suite's largest idle: a test alone held the gate while a module's 4-minute
    fixture held a seat, and every other worker waited with it. Now it waits without the gate
    until every held seat is expected to be free soon."""
    order: list[str] = []
    long = seats.seat(3, tmp_path, expected_s=1000.0)
    assert long.__enter__() == [0]

    def alone() -> None:
        with seats.seat(3, tmp_path, alone=True) as numbers:
            order.append(f"alone holds {numbers}")

    thread = threading.Thread(target=alone)
    thread.start()
    time.sleep(1.5)  # the test alone has looked at the seats, and waits

    def short() -> None:
        with seats.seat(3, tmp_path) as numbers:  # the gate is free: a seat is taken at once
            order.append(f"short holds {numbers}")

    taker = threading.Thread(target=short)
    taker.start()
    taker.join(5)
    order.append("long leaves")
    long.__exit__(None, None, None)
    thread.join(10)
    assert order == ["short holds [1]", "long leaves", "alone holds [0, 1, 2]"]
