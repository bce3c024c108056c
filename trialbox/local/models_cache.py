"""botocore's service models, parsed once per twin process tree instead of once per session.

Each botocore session makes its own loader, which parses the JSON of every service model its
clients need (S3's, DynamoDB's, their endpoint rule sets, the partitions): about 95 ms of CPU
for the four clients a Lambda handler makes, in each of a twin's function processes. The
twin's processes share the parsed models instead:
- `share()` makes every loader made after it, in this process and in the processes it forks,
  use one cache per kind of loader (its search paths, extras and file loader), so that what
  one session parsed the next finds;
- given services, it parses their models at once: the function processes' zygote does so
  before it forks them, and each handler's clients find them parsed.

Only the twin's processes call it (trialbox/local); the pipeline's code and its AWS calls are
the same. A loader's cache holds what it read from the files on its search paths, which no
process changes; a loader whose paths differ (AWS_DATA_PATH) gets a cache of its own.
"""

from __future__ import annotations

import contextlib
from typing import Any

from botocore import loaders
from botocore.exceptions import DataNotFoundError

_CACHES: dict[tuple[Any, ...], dict[Any, Any]] = {}
_ORIGINAL_INIT = loaders.Loader.__init__
# What a client's creation reads besides its service's own models (botocore 1.x).
COMMON = ("endpoints", "partitions", "_retry", "sdk-default-configuration")


def _kind(loader: loaders.Loader) -> tuple[Any, ...]:
    return (tuple(loader.search_paths), tuple(loader.extras_types), type(loader.file_loader))


def _init(self: loaders.Loader, *args: Any, **kwargs: Any) -> None:
    _ORIGINAL_INIT(self, *args, **kwargs)
    self._cache = _CACHES.setdefault(_kind(self), self._cache)


def share(services: tuple[str, ...] = ()) -> None:
    """Every loader made from now on shares its kind's cache; `services`' models (and what
    every client reads) are parsed now, for this process and those it forks."""
    loaders.Loader.__init__ = _init
    if not services:
        return
    loader = loaders.create_loader()
    for name in COMMON:
        with contextlib.suppress(DataNotFoundError):
            loader.load_data(name)
    for service in services:
        for type_name in ("service-2", "endpoint-rule-set-1"):
            loader.load_service_model(service, type_name, api_version=None)
