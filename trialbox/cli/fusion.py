"""`trialbox sandbox-fusion-proxy`: SandboxFusion's POST /run_code on the trainer node, each
call signed (SigV4) and sent to the deployed stack's RunCode function URL."""

from __future__ import annotations

from typing import Annotated

import typer

from trialbox import constants as c
from trialbox.cli.serving import echo_run_code_url, serve_until_interrupted, stop_on_sigterm
from trialbox.errors import TrialboxError
from trialbox.integrations import sandbox_fusion
from trialbox.sdk.core import stack_resources


def proxy_command(
    stack: Annotated[str, typer.Option(help="the deployed Trialbox stack's name")],
    region: Annotated[str | None, typer.Option(help="its region (else AWS_REGION)")] = None,
    host: Annotated[str, typer.Option(help="the address to serve on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="the port (0: any free one)")] = 8080,
) -> None:
    """Serve POST /run_code for verl and the sandbox-fusion client until Ctrl-C: each call
    signed with this node's AWS credentials and sent to the stack's RunCode function URL."""
    try:
        resources, session = stack_resources(stack, region, None)
    except TrialboxError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if not resources.run_code_url:
        typer.echo(f"error: stack {stack!r} has no {c.OUTPUT_RUN_CODE_URL} output: deploy this "
                   "version's stack", err=True)  # fmt: skip
        raise typer.Exit(2)
    stop_on_sigterm()
    proxy = sandbox_fusion.Proxy(
        resources.run_code_url, session, sandbox_fusion.FUNCTION_TIMEOUT_S + 5
    )
    server = sandbox_fusion.serve(proxy, host, port)
    echo_run_code_url(sandbox_fusion.url(server))
    serve_until_interrupted(server.shutdown)
