"""Executing untrusted Python programs (a policy's candidate solutions, and the tests that label them).

One subprocess per run, under limits (:class:`SandboxLimits`); docs/own-policy.md lists the threats,
what stops each and what is out of scope:

- **a label only the hidden test writes** (:func:`run_test`): the candidate's program runs in one
  process, the task's prompt, hidden test and ``check(entry_point)`` in another (the test's), whose
  entry point is a stub that sends each call's arguments to the candidate's process and returns the
  plain value that comes back (or raises the built-in exception of the name that comes back). The
  verdict is the test process's: ``passed`` when ``check`` returned. It reaches the caller on a
  status descriptor that the candidate's process closes before any of its code runs; the test's
  process is non-dumpable (the candidate cannot read or trace it), and the hidden test is read by
  it after the fork (the candidate never holds it). :func:`run_program` (the agent's tool) runs a
  program with its harness in one process: its status is the program's own run, not a label;
- **a minimal root of its own**: a fresh tmpfs as ``/`` (``pivot_root``; the host's tree detached),
  with the system's ``/usr``, the loader's cache, a few devices and the interpreter's folders bound
  read-only (:data:`SYSTEM`, :func:`_exposed`); the folders above them execute-only. No host file
  beyond those is readable, no host Unix socket reachable (abstract ones: its network namespace);
- **one size-bounded tmpfs for all it writes**: its folder (:data:`WORK`), ``/tmp``, ``/var/tmp``
  and ``/dev/shm`` share ``tmpfs_mb`` and an inode bound; ``RLIMIT_FSIZE`` bounds each file;
- **limits of its own**: as root, a user id of its own per sandbox (:class:`_Uids`; ``RLIMIT_NPROC``
  counts per user, so a neighbour's fork bomb is not its failure); in user namespaces, a user
  namespace of its own (counted apart since Linux 5.14). ``RLIMIT_AS`` (``memory``), ``RLIMIT_CPU``
  backing the wall clock (``timeout``: the whole tree killed, learnt from a pidfd the moment it ends),
  ``RLIMIT_NOFILE``; no cgroup (this kernel's are v1 and the machine supervisor's);
- **its own PID, network and IPC namespaces**: every process it started dies with it (it runs under
  PID 1 of its namespace, in its own session, with ``PR_SET_PDEATHSIG``), its ``/proc`` lists its
  own processes only, no interface but a down loopback;
- **output**: stdout and stderr go to files (bounded by ``RLIMIT_FSIZE``), of which the last
  ``output_chars`` characters are kept.

The program runs as the module ``candidate``, not ``__main__``: a candidate's own ``if __name__ ==
"__main__":`` demo does not run (as in HumanEval's harness), so its demo cannot fail its label.

The namespaces come from util-linux's ``unshare`` (``--net --ipc --pid --fork --kill-child
--mount``), which needs root (as here and in CI) or unprivileged user namespaces (then ``--user
--map-root-user`` is added: the program keeps the caller's uid and loses every capability, so it
cannot undo the read-only mounts). :func:`isolation` probes once which one works. The confinement
itself (``_sandbox_child.py``) needs ``pivot_root`` and makes mounts read-only with
``mount_setattr`` (Linux 5.12) or a remount of each; a kernel that refuses a fresh ``/proc`` (some
containers) gets an empty one instead; a confinement step that fails stops the run
(``LatentSiftError``), it never runs the program half confined.
Without either (no ``unshare``, or a kernel that refuses), programs still run in a fresh folder
under the same limits and process-group kill, and a label still runs the test in its own process,
but with **no** network namespace (an audit hook refuses Python's socket calls, which a program
could get around through ``ctypes`` or a child process), no PID namespace (a child that leaves the
session survives until its CPU limit), the host's files and ``/proc``, no bound on total disk, and as
the caller (shared process limits; and a candidate could write the status file by its path, so a
label without namespaces holds against mistakes, not against a hostile candidate);
``SandboxLimits.require`` turns that case into an error, and every result records its ``isolation``.

What it does not guarantee: it is not a defence against a program written to escape a Linux
container (kernel exploits). Results are deterministic for deterministic programs (``seconds`` is
the only measured field; a program near its time limit may land on either side).
"""
from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from .._core.validation import LatentSiftError, check_positive_int

#: The statuses a run can end with; only ``passed`` is a pass.
STATUSES = ("passed", "failed", "timeout", "memory", "crashed", "error")
#: The first user id of the sandboxes' programs when the sandbox starts as root: each sandbox its own
#: (``UID_BASE`` + 256 x the caller's process id + a slot; no such user exists on the host).
UID_BASE = 1 << 30
#: The program's folder (its working directory and ``HOME``) inside its new root.
WORK = "/sandbox"
#: The program's private temporary folders; with its folder, all on one size-bounded tmpfs of its own.
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")
#: What of the host's system is bound read-only into the program's new root (besides the interpreter).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache", "/dev/null",
          "/dev/zero", "/dev/urandom")
TASK_FILE, TEST_FILE = "task.json", "test.py"
CHILD = Path(__file__).with_name("_sandbox_child.py")
PROGRAM_FILE = "program.py"
#: Environment of the program: nothing of the caller's (no tokens, no proxies), one thread per library.
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class SandboxLimits:
    """The limits of one run. ``timeout_s``: wall clock; ``memory_mb``: address space (per process);
    ``processes``: processes and threads of its user (its own); ``file_mb``: the largest file it may
    write (its output included); ``open_files``: descriptors; ``tmpfs_mb``: all it may write in its
    folder, ``/tmp``, ``/var/tmp`` and ``/dev/shm`` together (and ``tmpfs_mb`` x 256 files);
    ``output_chars``: kept of stdout and of stderr (the end); ``require``: refuse to run
    (``LatentSiftError``) unless the network, PID and mount namespaces are available."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    processes: int = 64
    file_mb: int = 16
    open_files: int = 256
    tmpfs_mb: int = 16
    output_chars: int = 4000
    require: bool = False

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "processes", "file_mb", "open_files", "tmpfs_mb", "output_chars"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise LatentSiftError(f"The sandbox limit {name!r} must be a positive number. "
                                      f"Got {value!r} instead.")


@dataclass(frozen=True)
class SandboxResult:
    """How one program's run ended.

    ``status``: one of :data:`STATUSES`: ``passed`` (a label: the test's ``check`` returned; a
    program: it ran to its end), ``failed`` (an ``AssertionError``, i.e. a test that did not hold, or
    an early exit), ``timeout`` (killed at the wall-clock limit), ``memory`` (over the memory limit),
    ``crashed`` (killed by a signal, or ended without a verdict, e.g. ``os._exit``; for a label, the
    candidate's process ended before the test did), ``error`` (any other exception: a syntax error, a
    ``NameError``, ...). ``detail``: one line saying why. ``stdout`` / ``stderr``: their last
    ``output_chars`` characters. ``seconds``: wall time. ``isolation``: ``"namespaces"`` (root),
    ``"user-namespaces"`` (unprivileged) or ``"none"`` (see the module docstring).
    """

    status: str
    detail: str
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    isolation: str = "namespaces"

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)


_ISOLATION: list[str] = []
_ISOLATION_LOCK = threading.Lock()


def _unshare_argv(kind: str) -> list[str]:
    exe = shutil.which("unshare") or "unshare"
    argv = [exe, "--net", "--ipc", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private"]
    return argv + ["--user", "--map-root-user"] if kind == "user-namespaces" else argv


def isolation() -> str:
    """Which isolation this machine gives (probed once per process, a few milliseconds):
    ``"namespaces"`` (root: network, PID and mount namespaces, and the drop to a user of its own),
    ``"user-namespaces"`` (the same namespaces inside a user namespace, without the uid drop), or
    ``"none"``."""
    with _ISOLATION_LOCK:
        if not _ISOLATION:
            kinds = (["namespaces"] if os.geteuid() == 0 else []) + ["user-namespaces"]
            found = "none"
            if shutil.which("unshare"):
                for kind in kinds:
                    try:
                        ok = subprocess.run(_unshare_argv(kind) + ["true"], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            timeout=10).returncode == 0
                    except (OSError, subprocess.TimeoutExpired):
                        ok = False
                    if ok:
                        found = kind
                        break
            _ISOLATION.append(found)
        return _ISOLATION[0]


def _exposed() -> list[str]:
    """What the program may read of the host (each bound read-only into its new root): the system's
    programs and shared libraries, the loader's cache, a few devices, and the interpreter's folders
    (its standard library and packages), outermost first, nested ones left out."""
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix)}
    paths = sorted(prefixes | {p for p in SYSTEM if os.path.lexists(p)})
    return [p for p in paths if not any(p != q and p.startswith(q + os.sep) for q in paths)]


class _Uids:
    """A user id of its own for each sandbox running at once in this process (``UID_BASE`` + this
    process's id x 256 + a free slot), so that no two share a process count (``RLIMIT_NPROC`` is
    counted per user)."""

    def __init__(self) -> None:
        self.busy: set[int] = set()
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            slot = next((i for i in range(256) if i not in self.busy), None)
            if slot is None:
                raise LatentSiftError("More than 256 sandboxes at once in one process; use fewer workers.")
            self.busy.add(slot)
        return slot

    def give(self, slot: int) -> None:
        with self.lock:
            self.busy.discard(slot)

    @staticmethod
    def uid(slot: int) -> int:
        return UID_BASE + ((os.getpid() & 0x3FFFFF) << 8) + slot


_UIDS = _Uids()


def is_sandbox_uid(uid: int) -> bool:
    """Whether ``uid`` is one the sandbox gives its programs when it starts as root."""
    return UID_BASE <= uid < UID_BASE + (1 << 30)


def _tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of a file, reading at most 4 x ``chars`` bytes of it."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 4 * chars))
        text = f.read().decode("utf-8", errors="replace")
    return text[-chars:]


def _exited(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether ``proc`` exits within ``timeout_s``, learnt the moment it does (a pidfd, Linux 5.3;
    ``Popen.wait``'s timeout polls with sleeps growing to 50 ms, which a run would wait out)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # an older kernel or Python
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(program: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run the Python source ``program`` in the sandbox (see the module docstring); its status is the
    program's own run as a harness in its process sees it (the agent's tool, not a label: for a label
    see :func:`run_test`). Never raises for anything the program does; raises ``LatentSiftError``
    when the machine cannot run it as asked: ``limits.require`` without namespaces, or a sandbox
    that failed before the program started (``unshare`` or the confinement refused), so that no
    candidate is labelled by a broken sandbox."""
    return _run(program, None, limits or SandboxLimits())


def run_test(program: str, prompt: str, test: str, entry_point: str,
             limits: SandboxLimits | None = None) -> SandboxResult:
    """The label of a candidate: its ``program`` in one process, the task's ``prompt`` (its helpers),
    hidden ``test`` and ``check(entry_point)`` in another, the test's, which alone writes the verdict
    (the module docstring): ``passed`` only when ``check`` returned."""
    return _run(program, {"prompt": prompt, "test": test, "entry_point": entry_point}, limits or SandboxLimits())


def _run(program: str, task: dict | None, limits: SandboxLimits) -> SandboxResult:
    """One run: ``task`` (the prompt, hidden test and entry point) makes it a label."""
    kind = isolation()
    if limits.require and kind == "none":
        raise LatentSiftError("The sandbox cannot isolate programs on this machine (util-linux 'unshare' "
                              "is missing or the kernel refuses new namespaces); run as root or allow "
                              "unprivileged user namespaces.")
    drop = kind == "namespaces"
    root = Path(tempfile.mkdtemp(prefix="latentsift-sandbox-"))  # mode 0700: only we may enter
    slot = _UIDS.take()
    try:
        (root / PROGRAM_FILE).write_text(program, encoding="utf-8")
        (root / "work").mkdir(mode=0o700)  # the program's folder without namespaces
        if task is not None:
            (root / TASK_FILE).write_text(json.dumps({k: task[k] for k in ("prompt", "entry_point")}), encoding="utf-8")
            (root / TEST_FILE).write_text(task["test"], encoding="utf-8")  # read by the test's process only
        uid = _UIDS.uid(slot) if drop else os.getuid()
        gid = uid if drop else os.getgid()
        cfg = {"program": str(root / PROGRAM_FILE), "task": str(root / TASK_FILE) if task is not None else None,
               "test": str(root / TEST_FILE) if task is not None else None,
               "root": str(root), "work": WORK if kind != "none" else str(root / "work"), "uid": uid, "gid": gid,
               "drop": drop, "namespaces": kind != "none", "world_writable": list(WORLD_WRITABLE),
               "expose": _exposed() if kind != "none" else [], "tmpfs_bytes": limits.tmpfs_mb << 20,
               "inodes": max(1024, limits.tmpfs_mb << 8), "memory_bytes": int(limits.memory_mb) << 20,
               "cpu_seconds": math.ceil(limits.timeout_s) + 1, "file_bytes": int(limits.file_mb) << 20,
               "open_files": int(limits.open_files), "processes": int(limits.processes)}
        env = dict(_ENV, HOME=cfg["work"], TMPDIR="/tmp")
        with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err, \
                open(root / "status", "wb") as status:
            cfg["status_fd"] = status.fileno()
            argv = [sys.executable, "-I", str(CHILD), json.dumps(cfg)]
            if kind != "none":
                argv = _unshare_argv(kind) + ["--"] + argv
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, cwd=root / "work", env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    pass_fds=(status.fileno(),), start_new_session=True)
            try:
                timed_out = not _exited(proc, limits.timeout_s)
            finally:
                _kill_group(proc.pid)  # also what it left behind in its session
                proc.wait()
            seconds = time.perf_counter() - t0
        stdout, stderr = _tail(root / "stdout", limits.output_chars), _tail(root / "stderr", limits.output_chars)
        status, detail = _verdict(root / "status", proc.returncode, timed_out, limits, stderr)
        return SandboxResult(status, detail, stdout, stderr, round(seconds, 3), kind)
    finally:
        _UIDS.give(slot)
        shutil.rmtree(root, ignore_errors=True)


def _verdict(status_file: Path, returncode: int, timed_out: bool, limits: SandboxLimits,
             stderr: str) -> tuple[str, str]:
    """The status and detail of a finished run. A run that never reached the program (``unshare`` or
    the confinement failed) is the machine's fault, not the candidate's: ``LatentSiftError``."""
    lines = []
    for line in status_file.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            lines.append(None)
    if not lines or lines[0] != {"started": True}:
        if timed_out:
            return "timeout", f"killed after the {limits.timeout_s:g} s wall-clock limit, before the program started"
        why = lines[0].get("setup") if lines and isinstance(lines[0], dict) else None
        last = (stderr.strip().splitlines() or [f"exit code {returncode}"])[-1]
        raise LatentSiftError(f"The sandbox could not start a program: {why or last}")
    if timed_out:
        return "timeout", f"killed after the {limits.timeout_s:g} s wall-clock limit"
    report = lines[-1] if len(lines) > 1 else None
    if isinstance(report, dict) and report.get("status") in STATUSES and returncode == 0:
        return str(report["status"]), str(report.get("detail", ""))
    if returncode < 0 or returncode > 128:  # a signal (``unshare`` passes its child's on as 128 + n)
        sig = -returncode if returncode < 0 else returncode - 128
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return "crashed", f"killed by {name}" + (" (the CPU-time limit)" if sig == signal.SIGXCPU else "")
    return "crashed", f"exited with code {returncode} before the harness could report"


def run_programs(programs: Sequence[str], limits: SandboxLimits | None = None, *, workers: int = 2,
                 progress: Callable[[int, int], None] | None = None) -> list[SandboxResult]:
    """:func:`run_program` for each program, ``workers`` at a time (a thread each, waiting on its
    subprocess), results in the order of ``programs``; ``progress(done, total)`` after each."""
    return _many(lambda program, lim: _run(program, None, lim), programs, limits, workers, progress, "run_programs")


def run_tests(items: Sequence[tuple[str, str, str, str]], limits: SandboxLimits | None = None, *, workers: int = 2,
              progress: Callable[[int, int], None] | None = None) -> list[SandboxResult]:
    """:func:`run_test` for each ``(program, prompt, test, entry_point)``, as :func:`run_programs` does."""
    return _many(lambda item, lim: run_test(*item, limits=lim), items, limits, workers, progress, "run_tests")


def _many(run: Callable, items: Sequence, limits: SandboxLimits | None, workers: int,
          progress: Callable[[int, int], None] | None, caller: str) -> list[SandboxResult]:
    workers = check_positive_int(workers, "workers", caller)
    limits = limits or SandboxLimits()
    isolation()  # probed once, before the threads
    done = 0
    lock = threading.Lock()

    def one(item) -> SandboxResult:
        nonlocal done
        result = run(item, limits)
        with lock:
            done += 1
            if progress is not None:
                progress(done, len(items))
        return result

    with ThreadPoolExecutor(max_workers=min(workers, max(1, len(items)))) as pool:
        return list(pool.map(one, items))  # map keeps the order of ``items``
