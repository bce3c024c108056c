"""The deterministic environment every sandboxed command gets (docs/sandbox.md, "The
environment inside"). Nothing of the host's environment is inherited: no AWS_* variable, no
credentials, no proxy."""

from __future__ import annotations

import math

from trialbox.models.limits import Limits
from trialbox.sandbox.runtime import Runtime


def sandbox_env(runtime: Runtime, home: str, limits: Limits) -> dict[str, str]:
    threads = str(max(1, math.ceil(limits.cpus)))
    return {
        "PATH": f"{runtime.bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "TMPDIR": "/tmp",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }
