"""What the commands that serve until Ctrl-C share (`local up`, `sandbox-fusion-proxy`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import typer

from trialbox.integrations.sandbox_fusion import ENDPOINT_ENV


def stop_on_sigterm() -> None:
    """SIGTERM stops the command as Ctrl-C does."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def echo_run_code_url(url: str) -> None:
    """Where the sandbox-fusion client (its variable) and verl (its config key) find /run_code."""
    typer.echo(f"export {ENDPOINT_ENV}={url}")
    typer.echo(f"# verl: reward.sandbox_fusion.url={url}/run_code")


def serve_until_interrupted(stop: Callable[[], None]) -> None:
    """Block until Ctrl-C (or SIGTERM), then `stop`."""
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        stop()
