"""`trialbox local up`: serve the local twin until Ctrl-C."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from trialbox import constants as c
from trialbox.errors import MissingExtra
from trialbox.sdk.core import local_twin_class

local_app = typer.Typer(no_args_is_help=True, help="The local twin: the pipeline on this machine.")


@local_app.command("up")
def up(
    workers: Annotated[int, typer.Option(help="bwrap pool workers")] = 2,
    port: Annotated[int, typer.Option(help="moto's port (0: any free one)")] = 0,
) -> None:
    """Start the twin and print what an SDK user needs; Ctrl-C stops it."""
    try:
        twin_class = local_twin_class()
    except MissingExtra as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop as on Ctrl-C
    twin = twin_class(workers=workers, port=port).start()
    outputs = twin.outputs
    exports = twin.env | {
        c.ENV_ENDPOINT_URL: twin.endpoint_url,
        c.ENV_REQUESTS_QUEUE_URL: outputs[c.OUTPUT_REQUESTS_QUEUE_URL],
        c.ENV_EXECUTIONS_TABLE: outputs[c.OUTPUT_EXECUTIONS_TABLE],
        c.ENV_TRACES_BUCKET: outputs[c.OUTPUT_TRACES_BUCKET],
        c.ENV_TASKSETS_BUCKET: outputs[c.OUTPUT_TASKSETS_BUCKET],
        c.ENV_ROLLOUT_ARN: outputs[c.OUTPUT_ROLLOUT_ARN],
        c.ENV_POOL_CAPACITY: str(workers),
    }
    typer.echo(f"local twin at {twin.endpoint_url} with {workers} workers. For the SDK:")
    for name, value in exports.items():
        typer.echo(f"export {name}={value}")
    typer.echo("# serving until Ctrl-C")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        twin.stop()
