"""`trialbox local up`: serve the local twin until Ctrl-C."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from trialbox import constants as c
from trialbox.errors import MissingExtra
from trialbox.integrations import sandbox_fusion
from trialbox.sdk.core import local_twin_class

local_app = typer.Typer(no_args_is_help=True, help="The local twin: the pipeline on this machine.")


@local_app.command("up")
def up(
    workers: Annotated[int, typer.Option(help="bwrap pool workers")] = 2,
    port: Annotated[int, typer.Option(help="moto's port (0: any free one)")] = 0,
) -> None:
    """Start the twin and print what an SDK user (and a SandboxFusion client) needs; Ctrl-C
    stops it."""
    try:
        twin_class = local_twin_class()
    except MissingExtra as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop as on Ctrl-C
    twin = twin_class(workers=workers, port=port).start()
    outputs = twin.outputs
    exports = twin.sdk_env()
    typer.echo(f"local twin at {twin.endpoint_url} with {workers} workers. For the SDK:")
    for name, value in exports.items():
        typer.echo(f"export {name}={value}")
    url = outputs[c.OUTPUT_RUN_CODE_URL].rstrip("/")
    typer.echo("# SandboxFusion's POST /run_code (the sandbox-fusion client reads this):")
    typer.echo(f"export {sandbox_fusion.ENDPOINT_ENV}={url}")
    typer.echo(f"# verl: reward.sandbox_fusion.url={url}/run_code")
    typer.echo("# serving until Ctrl-C")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        twin.stop()
