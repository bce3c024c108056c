"""A worker's lease on the admission table: how many jobs it can take now. The dispatcher
admits requests only while fewer are in flight than the live leases' slots
(trialbox.pipeline.admission), so a job never waits in the work queue for a worker that is not
there. Renewed every RENEW_S for TERM_S; withdrawn when the worker stops taking work (a killed
worker's lapses within TERM_S)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from trialbox.pipeline.admission import Admission

log = logging.getLogger("trialbox.worker")
TERM_S = 30.0
RENEW_S = 10.0


def hold_lease(
    admission: Admission,
    name: str,
    slots: Callable[[], int],
    stop: threading.Event,
    changed: threading.Event,
) -> threading.Thread:
    """A daemon thread that keeps `name`'s lease at `slots()` until `stop`, then withdraws it;
    rewritten at once when `changed` is set (a session taking the worker, its stop). A failed
    renewal is retried at the next one (the lease outlives two of them)."""

    def run() -> None:
        while not stop.is_set():
            changed.clear()
            try:
                admission.lease(name, slots(), TERM_S)
            except Exception:
                log.exception("%s: renewing the admission lease failed; trying again", name)
            changed.wait(RENEW_S)
        try:
            admission.leave(name)
        except Exception:
            log.exception("%s: withdrawing the admission lease failed; it lapses", name)

    thread = threading.Thread(target=run, daemon=True, name="admission-lease")
    thread.start()
    return thread
