"""RunCode: SandboxFusion's POST /run_code behind a Lambda function URL (IAM auth), run as an
ungraded execution request on the pool (trialbox.integrations.sandbox_fusion)."""

import base64
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver, Response
from aws_lambda_powertools.utilities.typing import LambdaContext

from trialbox.integrations.sandbox_fusion import Endpoint
from trialbox.sdk import Client

logger = Logger()
tracer = Tracer()
app = LambdaFunctionUrlResolver()
endpoint = Endpoint(Client())  # the TRIALBOX_* resources of the function's environment


@app.post("/run_code")
@app.post("/run_code/")  # SandboxFusion's server takes it (FastAPI redirects it)
def run_code() -> Response[str]:
    time_left_s = app.lambda_context.get_remaining_time_in_millis() / 1000
    event = app.current_event  # the body's bytes as sent: JSON that is not UTF-8 is a 422
    raw = event.body or ""
    body = (
        base64.b64decode(raw) if event.is_base64_encoded else raw.encode(errors="surrogateescape")
    )
    status, answer = endpoint.answer(body, time_left_s)
    return Response(status_code=status, content_type="application/json", body=answer)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
