"""botocore's service models, parsed once per twin process tree instead of once per session.

Each botocore session makes its own loader, which parses the JSON of every service model its
clients need (S3's, DynamoDB's, their endpoint rule sets, the partitions): about 95 ms of CPU
for the four clients a Lambda handler makes, in each of a twin's function processes. The
twin's processes share the parsed models instead:
- `share()` makes every loader made after it, in this process and in the processes it forks,
  use one cache per kind of loader (its search paths, extras and file loader), so that what
  one session parsed the next finds;
- given services, it parses their models at once, for a boto3 session's loader (botocore's
  paths and boto3's data directory): the function processes' zygote does so before it forks
  them, and each handler's `boto3.client` finds them parsed.

Only the twin's processes call it (trialbox/local); the pipeline's code and its AWS calls are
the same. A loader's cache holds what it read from the files on its search paths, which no
process changes. Which cache a loader uses is decided at each lookup, from its paths then: a
loader whose paths differ (AWS_DATA_PATH), or change after it was made (boto3's session adds
its own data directory to its loader's), uses the cache of those paths.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import boto3
from botocore import loaders
from botocore.exceptions import DataNotFoundError

_CACHES: dict[tuple[Any, ...], dict[Any, Any]] = {}
BOTO3_DATA = os.path.join(os.path.dirname(boto3.__file__), "data")
_ORIGINAL_INIT = loaders.Loader.__init__
# What a client's creation reads besides its service's own models (botocore 1.x).
COMMON = ("endpoints", "partitions", "_retry", "sdk-default-configuration")


class _KindCache:
    """A loader's `_cache` (all botocore's `instance_cache` reads and writes): the shared
    cache of the loader's kind as it is at each lookup."""

    def __init__(self, loader: loaders.Loader) -> None:
        self._loader = loader

    def _cache(self) -> dict[Any, Any]:
        loader = self._loader
        kind = (tuple(loader.search_paths), tuple(loader.extras_types), type(loader.file_loader))
        return _CACHES.setdefault(kind, {})

    def __contains__(self, key: object) -> bool:
        return key in self._cache()

    def __getitem__(self, key: object) -> Any:
        return self._cache()[key]

    def __setitem__(self, key: object, value: Any) -> None:
        self._cache()[key] = value


def _init(self: loaders.Loader, *args: Any, **kwargs: Any) -> None:
    _ORIGINAL_INIT(self, *args, **kwargs)
    self._cache = _KindCache(self)


def share(services: tuple[str, ...] = ()) -> None:
    """Every loader made from now on shares its kind's cache; `services`' models (and what
    every client reads) are parsed now, for this process and those it forks."""
    loaders.Loader.__init__ = _init
    if not services:
        return
    loader = loaders.create_loader()
    loader.search_paths.append(BOTO3_DATA)  # as a boto3 session does: its clients' kind
    for name in COMMON:
        with contextlib.suppress(DataNotFoundError):
            loader.load_data(name)
    for service in services:
        for type_name in ("service-2", "endpoint-rule-set-1"):
            loader.load_service_model(service, type_name, api_version=None)
