"""Programs the jobs run as their agent command (each `python -c <program>`)."""

from __future__ import annotations

# Shared by the programs: libc, the syscall numbers and the IPC names they use.
PRELUDE = """
import ctypes, errno, fcntl, os, platform, signal, stat, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
USER_RING, SESSION_RING = -4, -3
IPC_KEY = 0x74726278
MQ_NAME = b"/trialbox-canary"
NAME = "trialbox-leftover"
IPC_CREAT = 0o1000
"""

# Leaves everything it can behind, then exits: a setsid daemon (SIGTERM ignored) holding a
# lock, files in every writable shared place and HOME, SysV shm/sem/msg, a POSIX queue, and
# keys in the user and session keyrings. Prints what it managed to leave.
LEAVE_BEHIND = (
    PRELUDE
    + r"""
left = []
for d in ("/tmp", "/var/tmp", "/dev/shm", os.environ["HOME"]):
    try:
        with open(os.path.join(d, NAME), "w") as f:
            f.write("x")
        left.append(f"file {d}")
    except OSError as e:
        left.append(f"file {d} refused ({errno.errorcode[e.errno]})")
for what, call in (
    ("shm", lambda: libc.shmget(IPC_KEY, 4096, IPC_CREAT | 0o666)),
    ("sem", lambda: libc.semget(IPC_KEY, 1, IPC_CREAT | 0o666)),
    ("msg", lambda: libc.msgget(IPC_KEY, IPC_CREAT | 0o666)),
    ("mq", lambda: libc.mq_open(MQ_NAME, os.O_CREAT | os.O_RDWR, 0o666, None)),
    ("user key", lambda: libc.syscall(ADD_KEY, b"user", b"trialbox-canary", b"x", 1, USER_RING)),
    ("session key",
     lambda: libc.syscall(ADD_KEY, b"user", b"trialbox-canary", b"x", 1, SESSION_RING)),
):
    ok = call() >= 0
    left.append(what if ok else f"{what} refused ({errno.errorcode.get(ctypes.get_errno())})")
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for d in ("/tmp", "/dev/shm", os.environ["HOME"]):
            try:
                lock = open(os.path.join(d, NAME + ".lock"), "w")
                fcntl.flock(lock, fcntl.LOCK_EX)
                break
            except OSError:
                continue
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.write(ready_w, b"1")
        time.sleep(120)
    os._exit(0)
os.read(ready_r, 1)
left.append("daemon")
print("left:", ", ".join(left))
"""
)

# Looks for anything a previous job could have left and prints it; exactly "nothing found"
# when there is none.
PROBE = (
    PRELUDE
    + r"""
found = []
me = os.getpid()
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == me:
        continue
    try:
        uid = os.stat(f"/proc/{entry}").st_uid
        cmd = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ")[:80]
    except OSError:
        continue
    if uid != 0:
        found.append(f"process {entry} uid {uid} {cmd!r}")
for d in ("/tmp", "/var/tmp", "/dev/shm"):
    try:
        names = os.listdir(d)
    except OSError:
        continue
    for name in names:
        try:
            owner = os.lstat(os.path.join(d, name)).st_uid
        except OSError:
            continue
        if owner != 0 or name.startswith(NAME):
            found.append(f"file {d}/{name} uid {owner}")
for name in os.listdir(os.environ["HOME"]):
    if name.startswith(NAME):
        found.append(f"file $HOME/{name}")
for d in ("/tmp", "/dev/shm", os.environ["HOME"]):
    path = os.path.join(d, NAME + ".lock")
    if os.path.exists(path):
        try:
            with open(path) as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            found.append(f"lock held on {path}")
        except OSError:
            pass
for kind in ("shm", "sem", "msg"):
    try:
        rows = open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]
    except OSError:
        rows = []
    found += [f"sysv {kind}: {' '.join(r.split()[:3])}" for r in rows]
for what, call in (
    ("shm", lambda: libc.shmget(IPC_KEY, 0, 0)),
    ("sem", lambda: libc.semget(IPC_KEY, 0, 0)),
    ("msg", lambda: libc.msgget(IPC_KEY, 0)),
):
    if call() >= 0:
        found.append(f"sysv {what} key {IPC_KEY:#x}")
try:
    found += [f"mqueue {n}" for n in os.listdir("/dev/mqueue")]
except OSError:
    pass
if libc.mq_open(MQ_NAME, os.O_RDONLY, 0, None) >= 0:
    found.append("mqueue /trialbox-canary opens")
for label, ring in (("user", USER_RING), ("session", SESSION_RING)):
    buf = ctypes.create_string_buffer(4096)
    size = libc.syscall(KEYCTL, 11, ring, buf, 4096)  # KEYCTL_READ: the keys it links
    for i in range(0, max(size, 0), 4):
        key = int.from_bytes(buf.raw[i:i + 4], sys.byteorder)
        desc = ctypes.create_string_buffer(256)
        libc.syscall(KEYCTL, 6, key, desc, 256)  # KEYCTL_DESCRIBE
        found.append(f"{label} keyring: {desc.value.decode(errors='replace')}")
print("\n".join(found) if found else "nothing found")
"""
)

# A setsid scanner that outlives the command: it reads every /proc/<pid>/environ and cmdline
# it can while the worker cleans up after the command, and prints any AWS credential it sees
# on the job's stdout (drained for a while after the command exits). The command itself
# exits as soon as the scanner runs.
SCAN = r"""
import os, re, time
# "[t]": the pattern never matches this program's own text in its parent's cmdline.
PATTERN = re.compile(
    rb"(AWS_[A-Z_]*(KEY|TOKEN|CREDENTIALS)[A-Z_]*=[^\0]*|/v2/creden[t]ials/[^\0]*)"
)
def scan(out):
    seen = set()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            for name in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{pid}/{name}", "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                for m in PATTERN.finditer(data):
                    if (pid, m.group(0)) not in seen:
                        seen.add((pid, m.group(0)))
                        what = f"LEAK pid {pid} {name}: ".encode() + m.group(0)
                        os.write(out, what + b"\n")
"""

SCAN_AFTER_EXIT = (
    SCAN
    + r"""
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(1, b"scanner running\n")
        os.write(ready_w, b"1")
        scan(1)
    os._exit(0)
os.read(ready_r, 1)
"""
)

# solution.py for the grading phase: correct, and on import it leaves the same scanner, which
# writes to whichever inherited pipe is the grading command's real stdout (pytest captures
# fd 1 at this point); it writes only when it finds something.
SOLUTION_WITH_SCANNER = (
    "def add(a, b):\n    return a + b\n\n"
    + SCAN
    + r"""
import stat
def _pipes():
    fds = []
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                fds.append(fd)
        except OSError:
            pass
    return fds
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        pipes = _pipes() + [1, 2]
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(w)
            data = os.read(r, 1 << 20)
            while data:
                for fd in pipes:
                    try:
                        os.write(fd, data)
                    except OSError:
                        pass
                data = os.read(r, 1 << 20)
            os._exit(0)
        os.close(r)
        scan(w)
    os._exit(0)
"""
)

# The explicit environment, the uid and the capabilities a command gets.
IDENTITY = (
    "import os\n"
    "print(os.getuid(), sorted(k for k in os.environ if k.startswith('AWS')))\n"
    "status = open('/proc/self/status').read()\n"
    "print(*(status.split(f'{k}:')[1].split()[0] for k in ('CapEff', 'CapPrm', 'NoNewPrivs')))\n"
)
