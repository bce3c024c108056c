"""The local twin end to end, with real bwrap sandboxes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trialbox.sdk import Client


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with Client.local(workers=2) as local:
        yield local
