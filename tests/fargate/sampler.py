"""From the host (root, the host's pid namespace), sample /proc/<pid>/environ and cmdline of
every process owned by a uid in [LO, HI) until stdin closes; then print what held a canary.

  python sampler.py LO HI   (stdin: a JSON list of canaries, one line, then kept open)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def main() -> None:
    lo, hi = int(sys.argv[1]), int(sys.argv[2])
    canaries = [c.encode() for c in json.loads(sys.stdin.readline())]
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    found: dict[str, str] = {}
    seen = 0
    while not done.is_set():
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                uid = entry.stat().st_uid
                if not lo <= uid < hi:
                    continue
                seen += 1
                for name in ("environ", "cmdline"):
                    with open(f"{entry.path}/{name}", "rb") as handle:
                        data = handle.read()
                    # The file's owner is root unless the process is dumpable, i.e. unless
                    # its uid (a sandboxed process) could read it too.
                    owner = os.stat(f"{entry.path}/{name}").st_uid
                    how = "readable by the uid" if owner == uid else "undumpable, root-only"
                    for canary in canaries:
                        if canary in data:
                            found[canary.decode()] = f"pid {entry.name} uid {uid} {name} ({how})"
            except OSError:
                continue
        time.sleep(0.001)
    print(json.dumps({"found": found, "samples": seen}), flush=True)


if __name__ == "__main__":
    main()
