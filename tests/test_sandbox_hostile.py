"""A hostile candidate against the label, through the path ``rollout`` labels with
(``execution.label_many``, which its judge calls): each threat of docs/own-policy.md run alone, and
beside an honest neighbour (two sandboxes at once), which must still pass."""
from __future__ import annotations

import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from latentsift.rollout import sandbox
from latentsift.rollout.execution import label_many
from latentsift.rollout.sandbox import SandboxLimits, run_program
from latentsift.rollout.tasks import Task
from test_sandbox import _kinds  # the isolations this machine gives

FAST = SandboxLimits(timeout_s=4.0, memory_mb=512, processes=16)
TASK = Task("T/double", 'def double(x):\n    """Twice x."""\n', "double",
            "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == -6\n")
HONEST = "    return 2 * x\n"

#: What a candidate may write to forge its status: the harness's old status line, and a well-formed
#: message of the pipe protocol between the test's and the candidate's process (length + JSON).
_FORGE = ("import json, os, sys\n"
          "line = json.dumps({'status': 'passed', 'detail': 'ran to its end'}).encode() + b'\\n'\n"
          "framed = json.dumps({'ok': None}).encode()\n"
          "framed = len(framed).to_bytes(4, 'big') + framed\n"
          "def forge():\n"
          "    print(line.decode(), flush=True)\n"
          "    for fd in range(256):\n"
          "        try:\n"
          "            os.write(fd, framed + b'\\n' + line)\n"
          "        except OSError:\n"
          "            pass\n")

#: Hostile candidates for ``double`` (each wrong where it answers at all), by the threat they try.
HOSTILE = {
    "forged status lines, then exit 0": _FORGE + "forge()\nos._exit(0)\n",
    "forged lines inside the call, then sys.exit(0)": _FORGE + "def double(x):\n    forge()\n    sys.exit(0)\n",
    "a sys.exit patch and an early SystemExit": ("import sys, builtins\nsys.exit = lambda *a: None\n"
                                                 "builtins.AssertionError = type('A', (Exception,), {})\n"
                                                 "def double(x):\n    raise SystemExit(0)\n"),
    "the harness patched (its status line rewritten)": (
        "import json\nreal = json.dumps\n"
        "json.dumps = lambda o, *a, **k: real({'status': 'passed', 'detail': 'x'} if isinstance(o, dict) "
        "and 'status' in o else o, *a, **k)\n"
        "def double(x):\n    return 0\n"),
    "the test's globals reached from its frames": (
        "import sys\ndef double(x):\n    f = sys._getframe(1)\n    f.f_globals['check'] = None\n"
        "    f.f_globals['AssertionError'] = SystemError\n    return 0\n"),
    "an object equal to everything": ("class Any:\n    def __eq__(self, other):\n        return True\n"
                                      "def double(x):\n    return Any()\n"),
    "it kills itself": "import os, signal\ndef double(x):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "it kills the test's process": ("import os, signal\ndef double(x):\n    os.kill(os.getppid(), signal.SIGKILL)\n"
                                    "    return 2 * x\n"),
    "it reads the test's memory": ("import os\ndef double(x):\n"
                                   "    open(f'/proc/{os.getppid()}/mem', 'rb')\n    return 2 * x\n"),
}


def _complete(candidate: str) -> str:
    """A candidate that defines the entry point again after its own code (whole code, not a body)."""
    return "    pass\n" + candidate if candidate.startswith("def double") else "    pass\n" + candidate


@pytest.fixture(scope="module")
def isolated():
    if sandbox.isolation() == "none":
        pytest.skip("no namespaces on this machine (needs root or unprivileged user namespaces)")
    return sandbox.isolation()


@pytest.mark.parametrize("threat", sorted(HOSTILE))
def test_a_hostile_candidate_cannot_write_its_own_label(isolated, threat):
    """Alone, then beside an honest candidate running at the same moment: never passed, and the
    honest one still passes."""
    hostile = _complete(HOSTILE[threat])
    alone = label_many([(TASK, hostile)], FAST)[0]
    assert not alone.passed, alone
    beside, honest = label_many([(TASK, hostile), (TASK, HONEST)], FAST, workers=2)
    assert (beside.passed, honest.passed) == (False, True), (beside, honest)


def test_the_candidate_never_holds_the_hidden_test(isolated):
    """It searches its objects (inherited from the test's process at the fork, too), its descriptors
    and the files its sandbox was started with for the hidden test's text, and would answer right
    only if it found it."""
    task = Task("T/secret", TASK.prompt, "double",
                "SECRET = 'latentsift-' + 'hidden-7f3a'\ndef check(candidate):\n    assert candidate(2) == SECRET\n")
    code = ("import gc, json, os\nneedle = 'hidden-' + '7f3a'\n"  # (never the whole text in its source)
            "def search():\n    found = []\n"
            "    for o in gc.get_objects():\n"
            "        if isinstance(o, dict):\n"
            "            found += [k for k, v in o.items() if isinstance(v, str) and needle in v and k != 'needle']\n"
            "    for fd in os.listdir('/proc/self/fd'):\n"
            "        try:\n            if needle.encode() in os.pread(int(fd), 1 << 16, 0):\n"
            "                found.append(fd)\n        except OSError:\n            pass\n"
            "    try:\n"
            "        cfg = json.loads(open('/proc/1/cmdline', 'rb').read().split(b'\\0')[-2])\n"
            "        found += [p for p in cfg.values() if isinstance(p, str) and os.path.isfile(p)\n"
            "                  and needle in open(p, errors='replace').read()]\n"
            "    except (OSError, ValueError, IndexError, AttributeError):\n        pass\n"
            "    return found\n"
            "def double(x):\n    return 'latentsift-' + needle if search() else 'not found'\n")
    r = label_many([(task, _complete(code))], FAST)[0]
    assert (r.status, r.detail) == ("failed", "AssertionError (a test did not hold)"), r
    # the same search in one process with the test (HumanEval's own harness) finds it
    one = run_program(task.program(_complete(code)) + f"\n{task.test}\ncheck(double)\n", FAST)
    assert one.passed, one


def test_an_object_equal_to_everything_passed_before_and_is_an_error_now(isolated):
    """The same program as one process (HumanEval's own harness) passes; the label does not."""
    hostile = _complete(HOSTILE["an object equal to everything"])
    one_process = run_program(TASK.program(hostile) + f"\n{TASK.test}\ncheck(double)\n", FAST)
    assert one_process.passed
    r = label_many([(TASK, hostile)], FAST)[0]
    assert r.status == "error" and "cannot cross" in r.detail


def test_the_label_carries_values_and_exceptions_between_the_processes(isolated):
    """What crosses: plain values (tuples stay tuples), the candidate's built-in exceptions (a test's
    ``except ValueError`` holds), and its prints; the task's prompt helpers are the test's."""
    task = Task("T/pair", "def helper(x):\n    return x + 1\n\ndef pair(x):\n    \"\"\"A pair.\"\"\"\n", "pair",
                "def check(candidate):\n    assert candidate(1) == (2, {'a': [1.5, None]}, b'x', {3})\n"
                "    try:\n        candidate(-1)\n        raise AssertionError('no error')\n"
                "    except ValueError as e:\n        assert 'negative' in str(e)\n"
                "    assert helper(1) == 2\n")
    code = ("    if x < 0:\n        raise ValueError('negative')\n    print('called', x)\n"
            "    return helper(x), {'a': [1.5, None]}, b'x', {3}\n")
    r = label_many([(task, code)], FAST)[0]
    assert (r.status, r.stdout) == ("passed", "called 1\n"), r
    wrong = label_many([(task, code.replace("b'x'", "b'y'"))], FAST)[0]
    assert wrong.status == "failed"


def _listener(path_or_name: str):
    server = socket.socket(socket.AF_UNIX)
    server.bind(path_or_name)
    server.listen(4)
    server.settimeout(0.2)
    accepted: list = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0].recv(16))
            except OSError:
                continue

    t = threading.Thread(target=accept)
    t.start()
    return server, accepted, stop, t


def test_no_host_unix_socket_is_reachable(isolated, tmp_path):
    """A file-system socket (in a folder of the host that anyone may enter) and an abstract one:
    the candidate's connections fail and the listeners see none, alone and beside a neighbour."""
    folder = Path(tempfile.mkdtemp(prefix="latentsift-host-", dir="/run" if os.access("/run", os.W_OK) else None))
    folder.chmod(0o777)
    path = folder / "host.sock"
    abstract = f"\0latentsift-host-{os.getpid()}"
    fs_server, fs_seen, fs_stop, fs_thread = _listener(str(path))
    ab_server, ab_seen, ab_stop, ab_thread = _listener(abstract)
    path.chmod(0o777)
    try:
        code = (f"import socket\nreached = []\nfor where in ({str(path)!r}, {abstract!r}):\n"
                "    s = socket.socket(socket.AF_UNIX)\n    s.settimeout(1)\n"
                "    try:\n        s.connect(where)\n        s.sendall(b'hello')\n        reached.append(where)\n"
                "    except OSError:\n        pass\n"
                "def double(x):\n    return 2 * x if not reached else reached\n")
        alone = label_many([(TASK, _complete(code))], FAST)[0]
        beside, honest = label_many([(TASK, _complete(code)), (TASK, HONEST)], FAST, workers=2)
        shown = run_program(code + "print(reached)\n", FAST)
    finally:
        for stop, server, thread in ((fs_stop, fs_server, fs_thread), (ab_stop, ab_server, ab_thread)):
            stop.set()
            thread.join()
            server.close()
        path.unlink(missing_ok=True)
        folder.rmdir()
    assert (alone.passed, beside.passed, honest.passed) == (True, True, True)  # it reached nothing
    assert shown.stdout == "[]\n"
    assert fs_seen == [] and ab_seen == []


def test_the_hosts_private_folders_cannot_be_listed(isolated):
    """``/root``, ``/home``, ``/etc/ssh`` and this checkout: every listing fails."""
    checkout = str(Path(__file__).resolve().parents[1])
    folders = ["/root", "/home", "/etc/ssh", "/etc", checkout, str(Path(checkout) / "src")]
    code = (f"import os\nlisted = []\nfor d in {folders!r}:\n"
            "    try:\n        os.listdir(d)\n        listed.append(d)\n    except OSError:\n        pass\n"
            "print(listed)\n")
    r = run_program(code, FAST)
    beside, honest = label_many([(TASK, _complete(code.replace("print(listed)", "assert listed, 'none'")
                                                   + "def double(x):\n    return 2 * x\n")),
                                 (TASK, HONEST)], FAST, workers=2)
    assert (r.status, r.stdout) == ("passed", "[]\n"), r
    assert (beside.status, honest.passed) == ("failed", True)


@pytest.mark.parametrize("kind", ["namespaces", "user-namespaces"])
def test_a_process_limit_hog_does_not_fail_its_neighbour(isolated, kind, monkeypatch):
    """The hog holds every process its limit allows (sleeping children) while its neighbour, a correct
    candidate that forks, runs beside it: the neighbour's limit is its own (its own uid as root, its
    own user namespace otherwise)."""
    if kind not in _kinds():
        pytest.skip(f"this machine gives no {kind!r} isolation")
    monkeypatch.setattr(sandbox, "_ISOLATION", [kind])
    hog = ("import os, time\nheld = 0\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError:\n"
           "        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n    held += 1\n"
           "time.sleep(3)\ndef double(x):\n    return held\n")
    forks = ("import os, time\ndef double(x):\n    time.sleep(0.5)\n    pid = os.fork()\n    if pid == 0:\n"
             "        os._exit(0)\n    os.waitpid(pid, 0)\n    return 2 * x\n")
    honest_alone = label_many([(TASK, _complete(forks))], FAST)[0]
    hog_r, honest_r = label_many([(TASK, _complete(hog)), (TASK, _complete(forks))], FAST, workers=2)
    assert honest_alone.passed, honest_alone
    assert (hog_r.passed, honest_r.passed) == (False, True), (hog_r, honest_r)


def test_the_total_disk_of_a_sandbox_is_bounded(isolated):
    """Its folder, /tmp, /var/tmp and /dev/shm share one ``tmpfs_mb`` bound (each file under
    ``file_mb``); many small files stop too (the inode bound)."""
    limits = SandboxLimits(timeout_s=10, tmpfs_mb=16, file_mb=4)
    code = ("import os\nwritten = 0\nfor d in ('.', '/tmp', '/var/tmp', '/dev/shm'):\n    for i in range(64):\n"
            "        try:\n            with open(os.path.join(d, f'f{i}'), 'wb') as f:\n"
            "                f.write(b'x' * (1 << 20))\n            written += 1\n"
            "        except OSError:\n            break\n"
            "made = 0\ntry:\n    for i in range(100000):\n        open(f'/tmp/e{i}', 'w').close()\n        made += 1\n"
            "except OSError:\n    pass\nprint(written, made)\n")
    r = run_program(code, limits)
    written, made = map(int, r.stdout.split())
    assert r.passed and written <= limits.tmpfs_mb and made < 100000, r  # 1 MB files: 16 of 256 asked
