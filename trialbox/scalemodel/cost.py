"""What calls cost: each call the twin's request log recorded (trialbox.local.requestlog),
priced by its service's billing unit (quotas.PRICES), and each sample's Fargate time.

Billing units, per call: SQS, one request (a message batch is one, under 64 KB); S3, a PUT
class (PUT, COPY, POST, LIST) or a GET class request; DynamoDB on demand, read units (1 an
item consistent, 0.5 eventually) and write units (1 KB of item, twice in a transaction);
Step Functions, billed transitions (counted from the histories: trialbox.metering, not here).
Not counted: Lambda's GB-seconds (invocations are), CloudWatch and X-Ray."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from trialbox.local.requestlog import Call
from trialbox.scalemodel.quotas import PRICES

S3_PUT_CLASS = {"PutObject", "CopyObject", "ListObjects", "ListObjectsV2", "UploadPart",
                "CreateMultipartUpload", "CompleteMultipartUpload"}  # fmt: skip
S3_FREE = {"DeleteObject", "AbortMultipartUpload"}
DDB_WRITES = {"PutItem", "UpdateItem", "DeleteItem"}
_PRICE = {name: quota.value for name, quota in PRICES.items()}  # $ a unit, by name


def _write_units(item: Any) -> int:
    """An item's write units: a unit a KB of its attributes (their JSON, near enough)."""
    return max(1, math.ceil(len(json.dumps(item or {})) / 1024))


def _dynamodb_units(call: Call) -> tuple[float, float]:
    """(read units, write units) of one call."""
    params, op = call.params, call.operation
    read = 1.0 if params.get("ConsistentRead") else 0.5
    if op == "GetItem":
        return read, 0.0
    if op == "Query":
        return read, 0.0  # small pages (leases, markers): one unit; a lower bound
    if op == "BatchGetItem":
        tables = params.get("RequestItems", {}).values()
        return sum(len(t["Keys"]) * (1.0 if t.get("ConsistentRead") else 0.5) for t in tables), 0
    if op in DDB_WRITES:
        return 0.0, float(_write_units(params.get("Item") or params.get("Key")))
    if op == "TransactWriteItems":
        units = 0
        for entry in params.get("TransactItems", []):
            (body,) = entry.values()
            units += 2 * _write_units(body.get("Item") or body.get("Key"))
        return 0.0, float(units)
    return 0.0, 0.0


def dollars(call: Call) -> float:
    """What one call costs, by its service's billing unit."""
    if call.service == "sqs":
        return _PRICE["sqs_request"]
    if call.service == "s3":
        if call.operation in S3_FREE:
            return 0.0
        return _PRICE["s3_put" if call.operation in S3_PUT_CLASS else "s3_get"]
    if call.service == "dynamodb":
        read, write = _dynamodb_units(call)
        return read * _PRICE["ddb_read_unit"] + write * _PRICE["ddb_write_unit"]
    if call.service == "lambda" and call.operation == "Invoke":
        return _PRICE["lambda_request"]
    return 0.0  # Step Functions' calls are free: its transitions are billed (counted apart)


def itemize(calls: list[Call]) -> tuple[dict[str, float], Counter[tuple[str, str]]]:
    """Dollars by service, and the calls by (service, operation)."""
    by_service: dict[str, float] = {}
    counted: Counter[tuple[str, str]] = Counter()
    for call in calls:
        by_service[call.service] = by_service.get(call.service, 0.0) + dollars(call)
        counted[(call.service, call.operation)] += 1
    return by_service, counted


def fargate_dollars(seconds: float, spot: bool = True) -> float:
    """One 1 vCPU / 2 GB ARM task for `seconds`."""
    hour = PRICES["fargate_arm_vcpu_hour"].value + 2 * PRICES["fargate_arm_gb_hour"].value
    off = PRICES["fargate_spot_discount"].value if spot else 0.0
    return seconds / 3600 * hour * (1 - off)
