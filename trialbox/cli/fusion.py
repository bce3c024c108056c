"""`trialbox sandbox-fusion-proxy`: SandboxFusion's POST /run_code on the trainer node, backed
by a deployed stack; the SDK signs every call with the node's AWS credentials."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from trialbox.errors import TrialboxError
from trialbox.integrations import sandbox_fusion
from trialbox.sdk import Client


def proxy_command(
    stack: Annotated[str, typer.Option(help="the deployed Trialbox stack's name")],
    region: Annotated[str | None, typer.Option(help="its region (else AWS_REGION)")] = None,
    host: Annotated[str, typer.Option(help="the address to serve on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="the port (0: any free one)")] = 8080,
    max_pending: Annotated[
        int | None, typer.Option(help="calls at once before 504 (default: 4 per pool worker)")
    ] = None,
) -> None:
    """Serve POST /run_code for verl and the sandbox-fusion client until Ctrl-C."""
    try:
        client = Client.from_stack(stack, region=region)
    except TrialboxError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    endpoint = sandbox_fusion.Endpoint(client, max_pending)
    server = sandbox_fusion.serve(endpoint, host, port)
    url = sandbox_fusion.url(server)
    typer.echo(f"export {sandbox_fusion.ENDPOINT_ENV}={url}")
    typer.echo(f"# verl: reward.sandbox_fusion.url={url}/run_code")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        server.shutdown()
        client.close()
