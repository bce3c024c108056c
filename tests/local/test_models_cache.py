"""The twin's processes parse each botocore service model once (trialbox.local.models_cache):
a session made after `share` finds them parsed, and a loader of other paths keeps its own."""

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
shared = botocore.loaders.create_loader()._cache
other = botocore.loaders.Loader(extra_search_paths=[sys.argv[1]])._cache
print(json.dumps({
    "parsed_by_share": before,
    "parsed_by_the_session": parsed[before:],
    "shared": shared is session._session.get_component("data_loader")._cache,
    "other_paths_share": other is shared,
}))
"""


def test_a_session_made_after_share_parses_no_model_and_other_paths_keep_their_own(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["parsed_by_share"] >= 4  # the two services' models and rule sets, at least
    assert seen["parsed_by_the_session"] == []
    assert seen["shared"] is True
    assert seen["other_paths_share"] is False
