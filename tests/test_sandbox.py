"""The sandbox that executes candidates: what a hostile or broken program can do is contained, and
labelled not passed, within the limits. Each containment test also checks the effect it prevents
(a file outside the folder, a connection, a surviving process) is absent afterwards."""
from __future__ import annotations

import ast
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from latentsift._core.validation import LatentSiftError
from latentsift.rollout import sandbox
from latentsift.rollout.sandbox import SandboxLimits, run_program, run_programs

FAST = SandboxLimits(timeout_s=3.0, memory_mb=512, processes=32)


def _nobody_processes() -> set[int]:
    """Processes of the sandbox's unprivileged users (one per sandbox), read from /proc."""
    out = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                uid = next(line for line in (p / "status").read_text().splitlines() if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if sandbox.is_sandbox_uid(int(uid.split()[1])):
                out.add(int(p.name))
    return out


@pytest.fixture(scope="module")
def isolated():
    if sandbox.isolation() == "none":
        pytest.skip("no namespaces on this machine (needs root or unprivileged user namespaces)")
    return sandbox.isolation()


def test_a_program_that_runs_to_its_end_passes_and_its_output_is_kept():
    r = run_program("import math\nprint('root', math.isqrt(49))\n", FAST)
    assert (r.status, r.passed, r.stdout) == ("passed", True, "root 7\n")


def test_a_failed_assertion_is_failed_and_other_exceptions_are_errors():
    failed = run_program("assert 1 + 1 == 3, 'arithmetic'\n", FAST)
    assert (failed.status, failed.detail) == ("failed", "AssertionError: arithmetic")
    error = run_program("def f(:\n    pass\n", FAST)
    assert error.status == "error" and error.detail.startswith("SyntaxError")
    name = run_program("undefined_name()\n", FAST)
    assert name.status == "error" and "NameError" in name.detail


def test_an_early_exit_is_never_a_pass():
    """A program that leaves before its tests ran (``sys.exit(0)``, ``os._exit(0)``) is not passed."""
    assert run_program("import sys\nsys.exit(0)\nassert False\n", FAST).status == "failed"
    hard = run_program("import os\nos._exit(0)\n", FAST)
    assert hard.status == "crashed" and "before the harness could report" in hard.detail


def test_an_endless_loop_times_out_within_the_limit():
    t0 = time.perf_counter()
    r = run_program("while True:\n    pass\n", SandboxLimits(timeout_s=1.5))
    assert r.status == "timeout" and not r.passed
    assert time.perf_counter() - t0 < 1.5 + 3.0


def test_too_much_memory_is_labelled_memory():
    r = run_program("block = bytearray(2 << 30)\n", FAST)
    assert (r.status, r.passed) == ("memory", False)


def test_a_crash_is_labelled_crashed():
    r = run_program("import ctypes\nctypes.string_at(0)\n", FAST)
    assert r.status == "crashed" and "SIGSEGV" in r.detail


def test_output_is_bounded():
    r = run_program("print('x' * 1_000_000)\nprint('end')\n", SandboxLimits(timeout_s=5, output_chars=100))
    assert r.passed and len(r.stdout) == 100 and r.stdout.endswith("end\n")


def test_a_forked_sleeping_child_dies_with_the_program(isolated):
    """The child even leaves the session (``setsid``), so a process-group kill alone would miss it."""
    before = _nobody_processes()
    program = ("import os, time\n"
               "if os.fork() == 0:\n"
               "    os.setsid()\n"
               "    time.sleep(600)\n"
               "print('parent done')\n")
    r = run_program(program, FAST)
    assert r.passed and r.stdout == "parent done\n"
    assert _left_behind(before) == set()


def test_a_fork_bomb_is_stopped_and_leaves_nothing(isolated):
    before = _nobody_processes()
    t0 = time.perf_counter()
    r = run_program("import os\nwhile True:\n    os.fork()\n", FAST)
    assert not r.passed and r.status in ("error", "timeout", "crashed")
    assert time.perf_counter() - t0 < FAST.timeout_s + 3.0
    assert _left_behind(before) == set()


def test_writes_outside_the_folder_do_not_land(isolated, tmp_path):
    """Folders the caller owns are refused (or hidden); a world-writable one is a throwaway."""
    mine = tmp_path / "secret.txt"  # under /tmp: hidden behind the sandbox's own /tmp
    ours = Path(sys.prefix) / f"latentsift-escape-{os.getpid()}.txt"  # visible, owned by the caller
    public = Path("/tmp") / f"latentsift-escape-{os.getpid()}.txt"
    public.unlink(missing_ok=True)
    targets = [(mine, "FileNotFoundError")]
    if os.geteuid() == 0:  # as another user the program keeps that user's rights on its own files
        # the interpreter's folders are bound read-only into its root (also one under /tmp: a CI clone's)
        targets.append((ours, "Read-only file system"))
    for target, error in targets:
        r = run_program(f"open({str(target)!r}, 'w').write('x')\n", FAST)
        assert r.status == "error" and error in r.detail
        assert not target.exists()
    r = run_program(f"open({str(public)!r}, 'w').write('x')\nprint(open({str(public)!r}).read())\n", FAST)
    assert r.passed and r.stdout == "x\n"  # it wrote, and read back, its own /tmp
    assert not public.exists()
    inside = run_program("open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())\n", FAST)
    assert inside.passed and inside.stdout == "ok\n"


def _world_writable_folders(deadline_s: float = 30.0) -> list[str]:
    """Every folder anyone may write to on this machine (``o+w``), ``/proc`` and ``/sys`` left out,
    walked for at most ``deadline_s`` seconds (about 5 s for 40,000 folders here)."""
    found, stack, t0 = [], ["/"], time.perf_counter()
    while stack and time.perf_counter() - t0 < deadline_s:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False) and e.path not in ("/proc", "/sys"):
                    stack.append(e.path)
                    if e.stat(follow_symlinks=False).st_mode & stat.S_IWOTH:
                        found.append(e.path)
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def open_folders():
    """The machine's world-writable folders, and one more the test makes next to itself (outside the
    sandbox's private mounts, so that the check can fail on any machine)."""
    own = Path(__file__).resolve().parent / f".latentsift-open-{os.getpid()}"
    own.mkdir()
    own.chmod(0o1777)
    try:
        yield sorted(set(_world_writable_folders()) | {str(own)})
    finally:
        for f in own.iterdir():
            f.unlink()
        own.rmdir()


def _kinds() -> list[str]:
    """The isolations this machine gives: as root, both the uid drop and the user-namespace one."""
    kinds = [sandbox.isolation()] if sandbox.isolation() != "none" else []
    if sandbox.isolation() == "namespaces" and subprocess.run(
            sandbox._unshare_argv("user-namespaces") + ["true"], capture_output=True).returncode == 0:
        kinds.append("user-namespaces")
    return kinds


@pytest.mark.parametrize("kind", ["namespaces", "user-namespaces"])
def test_the_host_is_read_only_but_for_the_programs_own_folder(isolated, open_folders, kind, monkeypatch):
    """The rule, not a list: every world-writable folder on this machine refuses a new file (or is
    the program's private tmpfs, whose file is gone afterwards); the program cannot remount ``/``
    writable either. Under both isolations the machine gives (as root: the drop to ``nobody``, and
    the user namespace where the program keeps uid 0 but no capability)."""
    if kind not in _kinds():
        pytest.skip(f"this machine gives no {kind!r} isolation")
    monkeypatch.setattr(sandbox, "_ISOLATION", [kind])
    name = f"latentsift-escape-{os.getpid()}-{kind}"
    program = (f"import ctypes, os\nwrote = []\nfor d in {open_folders!r}:\n"
               f"    try:\n        open(os.path.join(d, {name!r}), 'w').write('x')\n        wrote.append(d)\n"
               "    except OSError:\n        pass\n"
               "print(wrote)\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n"
               "print(libc.mount(b'none', b'/', None, 32 | 4096, None), ctypes.get_errno())\n"  # MS_REMOUNT|MS_BIND, rw
               "open('mine.txt', 'w').write('ok')\n")
    try:
        r = run_program(program, FAST)
        landed = [d for d in open_folders if os.path.exists(os.path.join(d, name))]
    finally:  # what escaped (only with a broken sandbox) is removed again
        for d in open_folders:
            Path(d, name).unlink(missing_ok=True)
    assert r.status == "passed", r
    wrote, remount = r.stdout.splitlines()
    private = {os.path.realpath(p) for p in sandbox.WORLD_WRITABLE}
    assert set(ast.literal_eval(wrote)) <= private
    assert remount.split()[0] == "-1" and remount.split()[1] in ("1", "13")  # EPERM or EACCES
    assert landed == []


def test_proc_lists_only_the_sandboxs_processes(isolated):
    """Its own ``/proc``: the harness (PID 1) and the program (PID 2), not the host's command lines."""
    program = ("import os\n"
               "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
               "print(pids)\n"
               "print(open('/proc/1/cmdline', 'rb').read().split(b'\\0')[2].decode())\n")
    r = run_program(program.replace("print(open(", "if pids:\n    print(open("), FAST)
    assert r.passed, r
    if r.stdout == "[]\n":  # a kernel that refuses a fresh proc: an empty one (the module docstring)
        return
    pids, init = r.stdout.splitlines()
    assert (pids, init) == ("[1, 2]", str(sandbox.CHILD))


def test_secrets_a_thousand_forks_and_a_sleep_are_contained(isolated):
    """The issue's hostile programs not tested above: /etc/shadow (absent from its root), 1000 sleeping
    children (stopped at the process limit, none left behind), a sleep forever (a timeout)."""
    before = _nobody_processes()
    if os.geteuid() == 0 and Path("/etc/shadow").exists():
        r = run_program("print(open('/etc/shadow').read())\n", FAST)
        assert r.status == "error" and "FileNotFoundError" in r.detail and r.stdout == ""  # not in its root
    r = run_program("import os, time\nfor i in range(1000):\n    if os.fork() == 0:\n        time.sleep(600)\n"
                    "        os._exit(0)\nprint('forked all')\n", FAST)
    assert r.status == "error" and "BlockingIOError" in r.detail and "forked all" not in r.stdout
    t0 = time.perf_counter()
    r = run_program("import time\ntime.sleep(10 ** 6)\n", SandboxLimits(timeout_s=1.5))
    assert r.status == "timeout" and time.perf_counter() - t0 < 1.5 + 3.0
    assert _left_behind(before) == set()


def _left_behind(before: set[int], wait_s: float = 20.0) -> set[int]:
    """``nobody``'s processes that were not there ``before`` and are still alive after ``wait_s`` seconds.
    Under ``pytest -n`` another worker's sandboxed programs (also ``nobody``) may run at the same moment and
    end within their own limits (seconds); a process left behind here sleeps 600 s or more, so it stays."""
    deadline = time.monotonic() + wait_s
    while True:
        new = _nobody_processes() - before
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.3)


def test_the_program_runs_unprivileged_when_we_are_root(isolated):
    if os.geteuid() != 0:
        pytest.skip("the uid drop applies to a sandbox started as root")
    r = run_program("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n", FAST)
    uid, gid, groups = r.stdout.split(maxsplit=2)
    assert sandbox.is_sandbox_uid(int(uid)) and gid == uid and groups == "[]\n"


def test_no_network_even_to_a_listening_local_server(isolated):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(4)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    r = run_program(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                    "s.sendall(b'hello')\n", FAST)
    t.join()
    server.close()
    assert not r.passed and r.status == "error" and "OSError" in r.detail
    assert accepted == []


def test_without_namespaces_an_audit_hook_refuses_sockets(monkeypatch):
    monkeypatch.setattr(sandbox, "_ISOLATION", ["none"])
    r = run_program("import socket\nsocket.socket()\n", FAST)
    assert r.isolation == "none" and r.status == "error" and "network access is disabled" in r.detail
    with pytest.raises(LatentSiftError, match="cannot isolate"):
        run_program("pass\n", SandboxLimits(require=True))


def test_a_batch_keeps_the_input_order_and_is_deterministic():
    programs = [f"import time\ntime.sleep({0.2 if i % 3 == 0 else 0})\nprint({i})\nassert {i} % 2 == 0\n"
                for i in range(8)]
    seen = []
    results = run_programs(programs, FAST, workers=3, progress=lambda done, total: seen.append((done, total)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    assert [r.status for r in results] == ["passed" if i % 2 == 0 else "failed" for i in range(8)]
    assert seen[-1] == (8, 8) and len(seen) == 8
    again = run_programs(programs, FAST, workers=1)
    assert [(r.status, r.detail, r.stdout) for r in again] == [(r.status, r.detail, r.stdout) for r in results]


def test_a_sandbox_that_cannot_start_is_an_error_not_a_label(monkeypatch):
    """When ``unshare`` (or the confinement) fails, no candidate is labelled: the run stops with one line."""
    monkeypatch.setattr(sandbox, "_ISOLATION", ["namespaces"])
    monkeypatch.setattr(sandbox, "_unshare_argv", lambda kind: ["/bin/sh", "-c", "echo 'unshare: refused' >&2; exit 1",
                                                                "sh"])
    with pytest.raises(LatentSiftError, match="could not start a program: unshare: refused"):
        run_program("pass\n", FAST)


def test_limits_are_checked():
    with pytest.raises(LatentSiftError, match="The sandbox limit 'timeout_s' must be a positive number"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(LatentSiftError, match="'workers' parameter of run_programs"):
        run_programs(["pass"], workers=0)


def test_rollouts_judge_fails_a_candidate_that_writes_on_the_host(isolated, open_folders):
    """The issue's case through the judge ``rollout`` labels with: a hidden test (or a candidate) that
    passes only if it could leave a file in a world-writable folder of the host is labelled 0, and no
    file is left."""
    from latentsift.rollout.folder import sandbox_env
    from latentsift.rollout.tasks import Task

    name = f"latentsift-label-{os.getpid()}"
    test = (f"def check(candidate):\n    import os\n    for d in {open_folders!r}:\n"
            f"        if d not in ('/tmp', '/var/tmp', '/dev/shm'):\n"
            f"            open(os.path.join(d, {name!r}), 'w').write('x')\n    assert candidate(2) == 4\n")
    task = Task("T/escape", "def double(x):\n", "double", test)
    _, judge = sandbox_env(FAST)
    try:
        labels = judge(task, ["    return 2 * x\n", "    return x + x\n"])
        landed = [d for d in open_folders if os.path.exists(os.path.join(d, name))]
    finally:
        for d in open_folders:
            Path(d, name).unlink(missing_ok=True)
    assert labels == [False, False] and landed == []
    honest = Task("T/honest", "def double(x):\n", "double", "def check(candidate):\n    assert candidate(2) == 4\n")
    assert judge(honest, ["    return 2 * x\n"]) == [True]
