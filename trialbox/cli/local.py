"""`trialbox local up`: serve the local twin until Ctrl-C."""

from __future__ import annotations

from typing import Annotated

import typer

from trialbox import constants as c
from trialbox.cli.serving import echo_run_code_url, serve_until_interrupted, stop_on_sigterm
from trialbox.errors import MissingExtra, TrialboxError
from trialbox.integrations import sandbox_fusion
from trialbox.sdk.core import local_session, local_twin_class

local_app = typer.Typer(no_args_is_help=True, help="The local twin: the pipeline on this machine.")


@local_app.command("up")
def up(
    workers: Annotated[int, typer.Option(help="bwrap pool workers")] = 2,
    port: Annotated[int, typer.Option(help="moto's port (0: any free one)")] = 0,
    faults: Annotated[
        float,
        typer.Option(
            help="the share of AWS calls (0..1) answered with a throttle or a 5xx, as AWS "
            "answers them: try a trainer against a flaky platform"
        ),
    ] = 0.0,
) -> None:
    """Start the twin and print what an SDK user (and a SandboxFusion client) needs; Ctrl-C
    stops it."""
    try:
        twin_class = local_twin_class()
    except MissingExtra as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        twin = twin_class(workers=workers, port=port, faults=faults)
    except TrialboxError as exc:  # a share outside 0..1
        typer.echo(f"error: --faults: {exc}", err=True)
        raise typer.Exit(2) from None
    stop_on_sigterm()
    twin.start()
    exports = twin.sdk_env()
    injected = f", faulting {faults:.0%} of AWS calls" if faults else ""
    typer.echo(f"local twin at {twin.endpoint_url} with {workers} workers{injected}. For the SDK:")
    for name, value in exports.items():
        typer.echo(f"export {name}={value}")
    # verl reaches /run_code as on AWS: through the proxy, which answers the function URL's
    # throttle (429) with the 504 verl retries.
    proxy = sandbox_fusion.Proxy(
        twin.outputs[c.OUTPUT_RUN_CODE_URL], local_session(), sandbox_fusion.FUNCTION_TIMEOUT_S + 5
    )
    server = sandbox_fusion.serve(proxy)
    typer.echo("# SandboxFusion's POST /run_code (the sandbox-fusion client reads this):")
    echo_run_code_url(sandbox_fusion.url(server))
    typer.echo("# serving until Ctrl-C")

    def stop() -> None:
        server.shutdown()
        twin.stop()

    serve_until_interrupted(stop)
