"""Adapters over S3 and DynamoDB: the only places the pipeline touches AWS data."""

from __future__ import annotations

import json
import time
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel

from trialbox.constants import CONTENT_ATTRIBUTE, TABLE_KEY, TABLE_TTL_ATTRIBUTE

# An object that is not there, or not ours: without s3:ListBucket S3 answers a missing key
# AccessDenied. A read that failed so fails again; any other error may pass.
UNREADABLE = frozenset({"NoSuchKey", "NoSuchBucket", "AccessDenied", "404", "403"})


def unreadable(exc: Exception) -> str | None:
    """The S3 error code when `exc` says the object cannot be read, ever; else None."""
    if not isinstance(exc, ClientError):
        return None
    code = str(exc.response.get("Error", {}).get("Code"))
    return code if code in UNREADABLE else None


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise ValueError(f"{uri!r} is not an s3://bucket/key URI")
    bucket, key = uri[5:].split("/", 1)
    return bucket, key


class ObjectStore:
    def __init__(self, s3: Any, bucket: str) -> None:
        self.s3 = s3
        self.bucket = bucket

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put_json(self, key: str, value: BaseModel | dict[str, Any]) -> str:
        body = value.model_dump_json() if isinstance(value, BaseModel) else json.dumps(value)
        self.s3.put_object(
            Bucket=self.bucket, Key=key, Body=body.encode(), ContentType="application/json"
        )
        return self.uri(key)

    def put_bytes(self, key: str, body: bytes, content_type: str) -> str:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type)
        return self.uri(key)

    def get_bytes(self, uri: str) -> bytes:
        bucket, key = parse_s3_uri(uri)
        return bytes(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())


class ResultTable:
    """Exactly one terminal result per request id: a conditional put, first writer wins."""

    def __init__(self, dynamodb: Any, table: str, ttl_days: int) -> None:
        self.dynamodb = dynamodb
        self.table = table
        self.ttl_days = ttl_days

    def terminal(self, request_id: str) -> tuple[bool, str | None]:
        """Whether the request already ended (recorded, or cancelled by its client), and the
        content hash its result was recorded for (None: not known)."""
        answer = self.dynamodb.get_item(
            TableName=self.table,
            Key={TABLE_KEY: {"S": request_id}},
            ConsistentRead=True,
            ProjectionExpression="#c",
            ExpressionAttributeNames={"#c": CONTENT_ATTRIBUTE},
        )
        if "Item" not in answer:
            return False, None
        return True, answer["Item"].get(CONTENT_ATTRIBUTE, {}).get("S")

    def put_terminal(self, request_id: str, attributes: dict[str, Any]) -> bool:
        item: dict[str, dict[str, Any]] = {TABLE_KEY: {"S": request_id}}
        for name, value in attributes.items():
            if value is None:
                continue
            if isinstance(value, bool):
                item[name] = {"BOOL": value}
            elif isinstance(value, int | float):
                item[name] = {"N": repr(value)}
            else:
                item[name] = {"S": str(value)}
        item[TABLE_TTL_ATTRIBUTE] = {"N": str(int(time.time()) + self.ttl_days * 86400)}
        try:
            self.dynamodb.put_item(
                TableName=self.table,
                Item=item,
                ConditionExpression=f"attribute_not_exists({TABLE_KEY})",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True
