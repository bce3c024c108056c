"""The twin's processes parse each botocore service model once (trialbox.local.models_cache):
a session made after `share` finds them parsed, and a loader of other paths, or whose paths
changed after it was made (boto3's), uses a cache of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
import boto3, botocore.loaders
from trialbox.local import models_cache

parsed = []
load = botocore.loaders.JSONFileLoader.load_file


def counted(self, path):
    parsed.append(path)
    return load(self, path)


botocore.loaders.JSONFileLoader.load_file = counted
models_cache.share(("dynamodb", "s3"))
before = len(parsed)
session = boto3.session.Session(
    region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
)
for service in ("dynamodb", "s3"):
    session.client(service, endpoint_url="http://127.0.0.1:1")
by_the_session = parsed[before:]
# A plain loader's answer for resources (none on botocore's paths) is not boto3's (its session
# adds its own data directory to its loader's paths after making it).
assert botocore.loaders.create_loader().list_available_services("resources-1") == []
session.resource("dynamodb", endpoint_url="http://127.0.0.1:1")
other = botocore.loaders.Loader(extra_search_paths=[sys.argv[1]])
other.list_available_services("service-2")
print(json.dumps({
    "parsed_by_share": before,
    "parsed_by_the_session": by_the_session,
    "kinds": len(models_cache._CACHES),
}))
"""


def test_a_session_made_after_share_parses_no_model_and_other_paths_use_their_own(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["parsed_by_share"] >= 4  # the two services' models and rule sets, at least
    assert seen["parsed_by_the_session"] == []
    # botocore's paths, boto3's session's (its data directory added), and the other paths'.
    assert seen["kinds"] == 3
