"""Hostile programs the sandbox backends are tested against, as `python -c` sources."""

from __future__ import annotations

# Hostile programs both backends are tested against.
FORK_BOMB = (
    "import os, time\n"
    "n = 0\n"
    "try:\n"
    "    while True:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(60)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print(n, e.errno)\n"
)
SETSID_DAEMON = (
    "import os, signal, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "        time.sleep(120)\n"
    "    os._exit(0)\n"
    "time.sleep(0.2)\n"
    "print('parent done')\n"
)


# Leaves something in every place a uid can reach outside its workspace on an rlimit worker:
# a setsid daemon holding a lock, files in /tmp, /var/tmp and /dev/shm, SysV shared memory,
# a semaphore set and a message queue (keyed by its uid), and a key in its user and persistent
# keyrings. Prints what it managed.
LEFTOVERS = r"""
import ctypes, fcntl, os, platform, time
libc = ctypes.CDLL(None, use_errno=True)
made = []
for place in ("/tmp", "/var/tmp", "/dev/shm"):
    try:
        with open(f"{place}/trialbox-leftover-{os.getuid()}", "w") as f:
            f.write("secret")
        made.append(place)
    except OSError:
        pass
key = os.getuid() << 4  # its own keys: another run's objects are not its to find
if libc.shmget(key | 1, 4096, 0o1666) >= 0: made.append("shm")
if libc.semget(key | 2, 1, 0o1666) >= 0: made.append("sem")
if libc.msgget(key | 3, 0o1666) >= 0: made.append("msg")
add_key = {"x86_64": 248, "aarch64": 217}[platform.machine()]
if libc.syscall(add_key, b"user", b"trialbox-leftover", b"secret", 6, -4) > 0: made.append("key")
keyctl = {"x86_64": 250, "aarch64": 219}[platform.machine()]
ring = libc.syscall(keyctl, 22, -1, -2)  # KEYCTL_GET_PERSISTENT into the process keyring
if ring > 0 and libc.syscall(add_key, b"user", b"trialbox-p", b"secret", 6, ring) > 0:
    made.append("persistent-key")
if libc.syscall(add_key, b"user", b"trialbox-s", b"secret", 6, -3) > 0:  # the session keyring
    made.append("session-key")
if os.fork() == 0:
    os.setsid()
    lock = open(f"/tmp/trialbox-leftover-{os.getuid()}.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    time.sleep(120)
    os._exit(0)
print(" ".join(made))
"""


SABOTAGE = "def add(a, b):\n    return 0\n"

# A setsid daemon of the job's uid that hides (its leader exits alone) and hunts the worker's
# clean-up children: a new process of its uid whose cmdline is the worker's and that still
# ignores SIGPIPE (a Popen child about to exec a command has it back to default) is a fork that
# will call kill(-1) as the uid. __ACTION__ "kill": SIGKILL each one, stay alive, and tamper
# with the next job's workspace (a marker file, a wrong solution.py). "stop": SIGSTOP the first
# one and exit: the worker's waitpid never returns. It fetches a fresh RLIMIT_CPU budget by
# handing over to a new process every few seconds, and gives up after __LIFE__ s.
HUNTER = r"""
import ctypes, os, platform, signal, threading, time
ACTION = "__ACTION__"
HUNTERS = 1
END = time.monotonic() + __LIFE__
SABOTAGE = __SABOTAGE__
SYS_EXIT = {"x86_64": 60, "aarch64": 93}[platform.machine()]
libc = ctypes.CDLL(None)
WORK = os.getcwd()
FIRST = os.stat(WORK).st_ino
RUNNER = os.getppid()  # the worker itself: prlimit and setpriv exec'd in place
RUNNER_CMD = open(f"/proc/{RUNNER}/cmdline", "rb").read()

def last_pid():
    return int(open("/proc/loadavg").read().split()[-1])

def is_cleanup_child(pid):
    try:
        if open(f"/proc/{pid}/cmdline", "rb").read() != RUNNER_CMD:
            return False
        ignored = int(open(f"/proc/{pid}/status").read().split("SigIgn:")[1].split()[0], 16)
    except (OSError, IndexError):
        return False
    return bool(ignored & (1 << (signal.SIGPIPE - 1)))

def tamper():
    if os.stat(WORK).st_ino == FIRST:  # still this job's workspace (or none yet)
        return
    marker = os.path.join(WORK, "lurker.txt")
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write("a process of an earlier job was here\n")
    solution = os.path.join(WORK, "solution.py")
    if os.path.exists(solution) and open(solution).read() != SABOTAGE:
        with open(solution, "w") as f:
            f.write(SABOTAGE)

def hunt(born):
    mine = {os.getpid(), threading.get_native_id()}
    ckill = libc.kill  # no exception per miss: a tight loop
    while True:
        if ACTION == "kill":
            try:
                tamper()
            except OSError:
                pass
        if time.monotonic() > END:
            os._exit(0)
        if time.monotonic() - born > 6:  # a fresh CPU budget: the next generation
            if os.fork() == 0:
                start()
            os._exit(0)
        last = last_pid()
        # the last pids and the next: SIGSTOP whichever is ours (forked, then switched)
        candidates = [p for p in range(last - 2, last + 4) if p not in mine]
        hit = 0
        for _ in range(1000):
            for p in candidates:
                if ckill(p, 19) == 0:
                    hit = p
                    break
            if hit:
                break
        if not hit:
            continue
        mine.add(hit)
        if not is_cleanup_child(hit):
            os.kill(hit, signal.SIGCONT)  # a command, a hunter: let it be
        elif ACTION == "kill":
            os.kill(hit, signal.SIGKILL)
        else:
            os._exit(0)  # it stays stopped: the worker waits for it forever

def start():
    threading.Thread(target=hunt, args=(time.monotonic(),)).start()
    libc.syscall(SYS_EXIT, 0)  # the leader alone exits: /proc/<pid>/stat now says Z

if os.fork() == 0:
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for _ in range(HUNTERS):
        if os.fork() == 0:
            start()
    os._exit(0)
time.sleep(0.3)
print("hunter started")
"""


def hunter(action: str, life_s: int = 40) -> str:
    return (
        HUNTER.replace("__ACTION__", action)
        .replace("__LIFE__", str(life_s))
        .replace("__SABOTAGE__", repr(SABOTAGE))
    )


# A parent in an uninterruptible (killable) wait on a stopped child: the vfork child stops
# itself before it execs, so the parent sleeps in D until the child execs or exits, which it
# never does. Neither can be stopped further: a kill that waits for every process of the
# sandbox to stop before SIGKILL never kills. It prints, then hangs until killed.
STOPPED_VFORK_PAIR = r"""
import ctypes, signal
libc = ctypes.CDLL(None, use_errno=True)
print("pair", flush=True)
if libc.vfork() == 0:
    libc.kill(libc.getpid(), signal.SIGSTOP)
    libc._exit(0)
print("the parent went on")
"""


def memory_spread(processes: int, mib_each: int, kind: str = "anon", hold_s: float = 2.0) -> str:
    """`processes` children each hold `mib_each` MiB at once, each under any per-process cap,
    then the parent prints "held N". `kind`: where the memory is: "anon" (the heap), "tmpfs"
    (a file on /dev/shm, then unlinked but held open), "memfd" (written, never mapped), or
    "leaderless" (the heap of a thread whose thread-group leader exited: /proc/<pid>/status,
    the leader's, shows no memory at all), "hidden_memfd" (memfds of an undumpable process,
    whose descriptors only CAP_SYS_PTRACE may look at), or "unshared_memfd" (memfds of a
    thread with a table of descriptors of its own: /proc/<pid>/fd, the leader's, shows none)."""
    return f"""
import ctypes, os, platform, threading, time
KIND, N, SIZE, HOLD = {kind!r}, {processes}, {mib_each} * 1024 * 1024, {hold_s}
SYS_EXIT = {{"x86_64": 60, "aarch64": 93}}[platform.machine()]
kids = []
for i in range(N):
    pid = os.fork()
    if pid == 0:
        chunk = b"\\1" * (1 << 20)
        if KIND == "leaderless":
            def hold():
                time.sleep(0.3)  # the leader is gone first
                held = b"\\1" * SIZE
                time.sleep(HOLD)
                os._exit(0)
            threading.Thread(target=hold).start()
            ctypes.CDLL(None).syscall(SYS_EXIT, 0)
        if KIND == "unshared_memfd":
            def hold():
                ctypes.CDLL(None).unshare(0x400)  # CLONE_FILES: a table of its own
                fds = [os.memfd_create("spread") for _ in range(0, SIZE >> 20, 32)]
                for mib in range(SIZE >> 20):
                    os.write(fds[mib // 32], chunk)
                time.sleep(HOLD)
                os._exit(0)
            threading.Thread(target=hold).start()
            time.sleep(HOLD + 30)  # hold() ends the process
        if KIND == "anon":
            held = b"\\1" * SIZE
        else:
            if KIND == "hidden_memfd":
                ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
            fds = []
            for mib in range(SIZE >> 20):
                if mib % 32 == 0:  # files of 32 MiB: under any RLIMIT_FSIZE (disk_mb)
                    if KIND.endswith("memfd"):
                        fds.append(os.memfd_create("spread"))
                    else:
                        path = f"/dev/shm/spread-{{os.getpid()}}-{{mib}}"
                        fds.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
                        os.unlink(path)
                os.write(fds[-1], chunk)
        time.sleep(HOLD)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("held", N)
"""


def socket_buffers(processes: int, pairs_each: int, hold_s: float = 2.0) -> str:
    """Kernel memory no process's RSS shows: `processes` children each fill `pairs_each`
    AF_UNIX datagram socketpairs (the seccomp filter allows AF_UNIX) and hold them; the
    parent prints "held N". About 360 KiB a pair."""
    return f"""
import os, socket, time
kids = []
for i in range({processes}):
    pid = os.fork()
    if pid == 0:
        held = []
        for _ in range({pairs_each}):
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            a.setblocking(False)
            try:
                while True:
                    a.send(b"x" * 60000)
            except BlockingIOError:
                pass
            held.append((a, b))
        time.sleep({hold_s})
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("held", len(kids))
"""
