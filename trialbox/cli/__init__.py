"""The `trialbox` command line."""

import typer

from trialbox.cli.fusion import proxy_command
from trialbox.cli.local import local_app
from trialbox.cli.run import demo_command, run_command
from trialbox.cli.sandbox import sandbox_app
from trialbox.cli.tasks import tasks_app

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Trialbox: sandboxes for agent RL on code."
)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(local_app, name="local")
app.add_typer(tasks_app, name="tasks")
app.command("run")(run_command)
app.command("demo")(demo_command)
app.command("sandbox-fusion-proxy")(proxy_command)


def main() -> None:
    app()
