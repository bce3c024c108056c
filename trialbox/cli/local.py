"""`trialbox local up`: serve the local twin until Ctrl-C."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from trialbox.client import ENV

local_app = typer.Typer(no_args_is_help=True, help="The local twin: the pipeline on this machine.")


@local_app.command("up")
def up(
    workers: Annotated[int, typer.Option(help="bwrap pool workers")] = 2,
    port: Annotated[int, typer.Option(help="moto's port (0: any free one)")] = 0,
) -> None:
    """Start the twin and print what an SDK user needs; Ctrl-C stops it."""
    from trialbox import constants as c
    from trialbox.local.twin import LocalTwin

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop as on Ctrl-C
    twin = LocalTwin(workers=workers, port=port).start()
    outputs = twin.outputs
    exports = twin.env | {
        ENV["endpoint_url"]: twin.endpoint_url,
        ENV["requests_queue_url"]: outputs[c.OUTPUT_REQUESTS_QUEUE_URL],
        ENV["executions_table"]: outputs[c.OUTPUT_EXECUTIONS_TABLE],
        ENV["traces_bucket"]: outputs[c.OUTPUT_TRACES_BUCKET],
        ENV["tasksets_bucket"]: outputs[c.OUTPUT_TASKSETS_BUCKET],
        ENV["capacity"]: str(workers),
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
