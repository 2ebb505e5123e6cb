"""The sandbox's child: run by ``sandbox.run_program`` / ``run_test`` as a script (``python -I
_sandbox_child.py CONFIG``), never imported. It reads the program (and, for a label, the task's
prompt and entry point; the hidden test's file only opened), then, inside the namespaces ``unshare``
made (network, IPC, PID, mount), confines itself:

1. (mount namespace) a new root: a fresh tmpfs with the system's and the interpreter's folders
   bound read-only (``nosuid``; ``mount_setattr``, or a remount of each mount on kernels before
   5.12), the folders above them execute-only (``0111``); one size- and inode-bounded tmpfs whose
   folders are bound as the program's folder, ``/tmp``, ``/var/tmp`` and ``/dev/shm``; a proc of its
   PID namespace (an empty read-only tmpfs where the kernel refuses one); then ``pivot_root`` into it
   and the old root detached: nothing else of the host is in its mount namespace;
2. resource limits (address space, CPU seconds, file size, processes, open files, no core dumps);
3. no new privileges (``PR_SET_NO_NEW_PRIVS``: a set-uid program gains nothing); as root it drops to
   its own unprivileged ``uid``/``gid`` with no supplementary groups; in a user namespace (the
   program keeps the caller's uid) it drops every capability, bounding set included, so that it
   cannot undo the read-only mounts; then it asks the kernel to kill it when its parent (``unshare``)
   dies (``PR_SET_PDEATHSIG``, set after the uid change that clears it);
4. (without a network namespace) an audit hook that refuses Python's socket calls.

Then (in namespaces) it forks, so that the program is not the PID namespace's init, and writes a
"started" line to the status descriptor. A program (:func:`_run_program`) runs here as the module
``candidate``; a label (:func:`_run_test`) runs the candidate's program in a further child that
closes the status descriptor and the hidden test's before any of its code, and the test here. One
JSON status line follows: ``passed``, ``failed`` (an ``AssertionError`` or an early
``SystemExit``), ``memory`` (``MemoryError``), ``crashed`` (the candidate's process ended before the
test did) or ``error`` (any other exception), with a one-line detail. A process that dies without
writing one is judged by the parent (timeout, crash).
"""
import builtins
import ctypes
import errno
import json
import os
import resource
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (a syscall added after 5.1)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
PR_SET_DUMPABLE = 4
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2
#: mount options of /proc/self/mountinfo kept by a read-only remount (a user namespace may not drop them)
_KEPT = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
         "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
_LIBC = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter links


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _fail(what):
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    if _LIBC.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        _fail(f"mount {target}")


def _umount(target):
    _LIBC.umount2(target.encode(), MNT_DETACH)


def _set_read_only(path):
    """``mount_setattr``: the mount at ``path`` and those below it read-only and ``nosuid``, its other
    attributes kept; False where the kernel has no such call (before 5.12)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    if _LIBC.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_long(AT_FDCWD), ctypes.c_char_p(path.encode()),
                     ctypes.c_long(AT_RECURSIVE), ctypes.byref(attr), ctypes.c_long(ctypes.sizeof(attr))) == 0:
        return True
    if ctypes.get_errno() == errno.ENOSYS:
        return False
    _fail(f"make {path} read-only")


def _remount_read_only(path, options):
    """The pre-5.12 way: remount one mount read-only, keeping the options it has (``options`` as in
    mountinfo; a user namespace may not drop them)."""
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
    for option in options.split(","):
        flags |= _KEPT.get(option, 0)
    _mount("none", path, None, flags)


def _mountinfo():
    """(mount point, options) of each mount this process sees, in mount order."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 for a space
            out.append((point, fields[5]))
    return out


def _read_only(point):
    """The mount at ``point`` and every mount below it read-only and ``nosuid`` (``mount_setattr``, or a
    remount of each one on kernels before 5.12, keeping the options a user namespace may not drop)."""
    if _set_read_only(point):
        return
    for mount_point, options in _mountinfo():
        if mount_point == point or mount_point.startswith(point.rstrip("/") + "/"):
            try:
                _remount_read_only(mount_point, options)
            except OSError:
                if os.path.ismount(mount_point):
                    raise


def _own_proc(target):
    """A proc of this PID namespace at ``target``; an empty one where the kernel refuses it."""
    try:
        _mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0555")


def _skeleton(new, path, is_dir=True):
    """``path`` made inside the new root ``new``: its missing parents execute-only (``0111``: passed
    through, never listed), the path itself a folder or an empty file to mount onto."""
    parts = path.strip("/").split("/")
    here = new
    for part in parts[:-1]:
        here = os.path.join(here, part)
        if not os.path.lexists(here):
            os.mkdir(here, 0o111)
    target = os.path.join(here, parts[-1])
    if is_dir:
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o444))
    return target


def _new_root(cfg):
    """Step 1 of the module docstring: a minimal root in a fresh tmpfs, then ``pivot_root`` into it
    (the host's tree is detached from this mount namespace, file-system sockets included)."""
    new = os.path.join(cfg["root"], "newroot")
    os.mkdir(new, 0o755)
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    # one size-bounded tmpfs for all the program may write: its folder, /tmp, /var/tmp, /dev/shm
    disk = os.path.join(cfg["root"], "disk")
    os.mkdir(disk, 0o700)
    _mount("tmpfs", disk, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={cfg['tmpfs_bytes']},nr_inodes={cfg['inodes']},mode=0755")
    for i, folder in enumerate([cfg["work"]] + cfg["world_writable"]):
        inside = os.path.join(disk, str(i))
        os.mkdir(inside, 0o700 if i == 0 else 0o1777)
        os.chmod(inside, 0o700 if i == 0 else 0o1777)  # past the umask
        if i == 0:
            os.chown(inside, cfg["uid"], cfg["gid"])
        _mount(inside, _skeleton(new, folder), None, MS_BIND)
    _umount(disk)
    # then what it may read (after: an interpreter under /tmp, a CI clone's, shows through its /tmp)
    for path in cfg["expose"]:
        if os.path.islink(path) and os.path.dirname(path) == "/":  # /lib -> usr/lib on merged-/usr systems
            os.symlink(os.readlink(path), os.path.join(new, path.lstrip("/")))
        elif os.path.exists(path):
            target = _skeleton(new, os.path.realpath(path), os.path.isdir(path))
            _mount(os.path.realpath(path), target, None, MS_BIND | MS_REC)
            _read_only(target)
    _own_proc(_skeleton(new, "/proc"))
    _mount("none", new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(new)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: no syscall number known for {os.uname().machine}")
    if _LIBC.syscall(ctypes.c_long(number), b".", b".") != 0:
        _fail("pivot_root")
    _LIBC.umount2(b".", MNT_DETACH)  # the old root, stacked under the new one
    os.chdir(cfg["work"])


def _limits(cfg):
    """Step 2: soft = hard, so the program cannot raise them again (CPU: SIGXCPU at the soft limit,
    SIGKILL a second later)."""
    for name, value in (("RLIMIT_AS", cfg["memory_bytes"]), ("RLIMIT_FSIZE", cfg["file_bytes"]),
                        ("RLIMIT_NOFILE", cfg["open_files"]), ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", cfg["processes"])):
        resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file-size limit fails, not kills


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _no_capabilities():
    """Every capability gone, now and after any ``execve`` (bounding set emptied first)."""
    cap = 0
    while _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if ctypes.get_errno() != errno.EINVAL:  # EINVAL: past the last capability
        _fail("drop the capability bounding set")
    data = (_CapData * 2)()  # version 3: two 32-bit words of each set, all zero
    if _LIBC.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data) != 0:
        _fail("drop capabilities")


def _drop(cfg):
    """Step 3."""
    if _LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail("set no_new_privs")
    if cfg["drop"]:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    elif cfg["namespaces"]:
        _no_capabilities()
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _no_network(event, args):
    """Step 4: the audit hook (it cannot be removed once added)."""
    if event.startswith("socket.") and event != "socket.gethostname":
        raise PermissionError(f"network access is disabled in the sandbox ({event})")


def _one_line(exc):
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


def _outcome(exc):
    """The status and detail of a program or test that raised ``exc`` (None: it ran to its end)."""
    if exc is None:
        return "passed", "ran to its end"
    if isinstance(exc, _Ended):
        return "crashed", str(exc)
    if isinstance(exc, AssertionError):
        return "failed", _one_line(exc) if str(exc) else "AssertionError (a test did not hold)"
    if isinstance(exc, SystemExit):
        return "failed", f"exited before its end (SystemExit {exc.code!r})"
    if isinstance(exc, MemoryError):
        return "memory", _one_line(exc) if str(exc) else "MemoryError (over the memory limit)"
    return "error", _one_line(exc)


def _run_program(source, cfg):
    """The program's own run (``run_program``: the agent's tool): its outcome as the harness in its
    own process sees it."""
    # not "__main__": a candidate's ``if __name__ == "__main__":`` demo does not run (as in HumanEval's harness)
    ns = {"__name__": "candidate", "__file__": cfg["program"], "__builtins__": __builtins__}
    try:
        exec(compile(source, cfg["program"], "exec"), ns)
        exc = None
    except BaseException as e:  # noqa: BLE001 - every exception is the program's outcome
        exc = e
    _flush()
    return _outcome(exc)


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or full stream: the status still counts
            pass


# --- the label: the hidden test in this process, the candidate in another one --------------------
#: The largest message the candidate's process may send (a value it returns).
MAX_MESSAGE = 64 << 20
#: Plain values cross between the two processes as tagged JSON (no code, no object of the candidate's).
_TAGS = {tuple: "t", set: "s", frozenset: "fs"}


class _Ended(Exception):
    """The candidate's process ended (or broke the protocol) before the test's end."""


class _Uncarried(TypeError):
    pass


def _encode(value):
    """A plain value as JSON-able data: None, bool, int, float, str as themselves, containers tagged;
    numbers of other types (numpy's) as the plain number they equal, arrays as lists (``tolist``)."""
    t = type(value)
    if value is None or t in (bool, int, float, str):
        return value
    if t is list:
        return [_encode(v) for v in value]
    if t in _TAGS:
        return {_TAGS[t]: [_encode(v) for v in value]}
    if t is dict:
        return {"d": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [value.real, value.imag]}
    for plain in (bool, int, float, str, complex):  # subclasses (numpy's float64 is a float)
        if isinstance(value, plain):
            return _encode(plain(value))
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalars and arrays
        converted = value.tolist()
        if type(converted) is not t:
            return _encode(converted)
    raise _Uncarried(f"a value of type {t.__name__} cannot cross between the test and the candidate "
                     "(only None, bool, int, float, complex, str, bytes, list, tuple, dict, set do)")


def _decode(data):
    if isinstance(data, list):
        return [_decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    ((tag, body),) = data.items()
    if tag == "d":
        return {_decode(k): _decode(v) for k, v in body}
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "c":
        return complex(*body)
    return {"t": tuple, "s": set, "fs": frozenset}[tag](_decode(v) for v in body)


def _send(fd, message):
    data = json.dumps(message).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def _receive(fd):
    """One message, or None at the end of the pipe."""
    head = _read_exactly(fd, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_MESSAGE:
        raise _Ended(f"the candidate's process sent {size} bytes, over the {MAX_MESSAGE >> 20} MB a value may have")
    body = _read_exactly(fd, size)
    if body is None:
        return None
    return json.loads(body)


def _read_exactly(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _exception_message(exc):
    return [type(exc).__name__, " ".join(str(exc).split())[:300]]


def _serve(source, cfg, requests, replies):
    """The candidate's process: load its program, say how that went, then answer each call of the test
    (a function name and arguments) with the value returned or the exception raised. Never returns."""
    ns = {"__name__": "candidate", "__file__": cfg["program"], "__builtins__": __builtins__}
    try:
        exec(compile(source, cfg["program"], "exec"), ns)
        loaded = {"ok": None}
    except BaseException as e:  # noqa: BLE001 - the test's process decides what it means
        loaded = {"raise": _exception_message(e)}
    _flush()
    _send(replies, loaded)
    while "ok" in loaded:
        call = _receive(requests)
        if call is None:
            break
        try:
            value = ns[call["name"]](*_decode(call["args"]), **_decode(call["kwargs"]))
            reply = {"ok": _encode(value)}
        except BaseException as e:  # noqa: BLE001
            reply = {"raise": _exception_message(e)}
        _flush()
        _send(replies, reply)
    _flush()
    os._exit(0)


def _rebuilt(name, message):
    """The exception the candidate raised, raised again in the test's process: a built-in exception
    class by its name (so that the test's ``except ValueError`` holds), else a plain ``Exception``."""
    cls = getattr(builtins, str(name), None)
    if isinstance(cls, type) and issubclass(cls, BaseException) and cls is not KeyboardInterrupt:
        try:
            if cls is SystemExit and message.lstrip("-").isdigit():
                return SystemExit(int(message))
            return cls(message)
        except Exception:  # noqa: BLE001 - a class that takes other arguments (UnicodeDecodeError)
            pass
    return Exception(f"{name}: {message}")


class _Candidate:
    """The test's side of the pipe to the candidate's process."""

    def __init__(self, pid, requests, replies):
        self.pid, self.requests, self.replies = pid, requests, replies

    def reply(self):
        try:
            message = _receive(self.replies)
            if message is not None:
                if set(message) == {"ok"}:
                    return _decode(message["ok"])
                name, text = message["raise"]
                exc = _rebuilt(name, text)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:  # not the protocol
            raise _Ended(f"the candidate's process broke the protocol ({type(e).__name__})") from None
        if message is not None:
            raise exc
        _, code = os.waitpid(self.pid, 0)
        if os.WIFSIGNALED(code):
            sig = os.WTERMSIG(code)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
            raise _Ended(f"the candidate's process was killed by {name} before the test's end"
                         + (" (the CPU-time limit)" if sig == signal.SIGXCPU else ""))
        raise _Ended(f"the candidate's process exited with code {os.waitstatus_to_exitcode(code)} "
                     "before the test's end")

    def function(self, name):
        def call(*args, **kwargs):
            try:
                message = {"name": name, "args": _encode(list(args)), "kwargs": _encode(kwargs)}
            except _Uncarried as e:
                raise TypeError(f"the test passed a value the sandbox cannot carry to the candidate: {e}") from None
            try:
                _send(self.requests, message)
            except OSError:  # its end of the pipe is closed: it is gone
                pass
            return self.reply()

        call.__name__ = call.__qualname__ = name
        return call


def _run_test(source, task, cfg):
    """The label: the candidate's program runs in a child process (no status descriptor, nothing of
    this process's memory: ``PR_SET_DUMPABLE`` 0 keeps it from reading or tracing this one); the
    task's prompt (its helpers: ``poly``, ``encode_cyclic``, ...) and hidden test run here, the entry
    point a stub that sends each call's arguments to the child and returns the plain value that
    comes back. The outcome is this process's: the candidate only ever returns values or raises.
    The prompt runs before the fork (the child inherits what it imported), the test after it (the
    child never holds it), while the child loads the program."""
    if _LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        _fail("set the test's process non-dumpable")
    ns = {"__name__": "__latentsift_test__", "__builtins__": __builtins__}
    try:
        exec(compile(task["prompt"], "prompt", "exec"), ns)
    except BaseException as e:  # noqa: BLE001 - a task whose prompt does not run labels nothing
        return _outcome(e)
    requests, replies = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(task["test_fd"])
        os.close(cfg["status_fd"])
        os.close(requests[1])
        os.close(replies[0])
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _serve(source, cfg, requests[0], replies[1])
    os.close(requests[0])
    os.close(replies[1])
    candidate = _Candidate(pid, requests[1], replies[0])
    try:
        entry = candidate.function(task["entry_point"])
        ns[task["entry_point"]] = entry
        with os.fdopen(task["test_fd"], encoding="utf-8") as f:
            test = f.read()
        exec(compile(test, "test", "exec"), ns)
        candidate.reply()  # the program loaded (or this raises what it raised)
        ns["check"](entry)
        exc = None
    except BaseException as e:  # noqa: BLE001 - every exception is the test's outcome
        exc = e
    _flush()
    os.close(requests[1])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return _outcome(exc)


def main():
    cfg = json.loads(sys.argv[1])
    status = os.fdopen(cfg["status_fd"], "w")
    os.set_inheritable(status.fileno(), False)
    with open(cfg["program"], encoding="utf-8") as f:
        source = f.read()
    task = None
    if cfg["task"]:
        with open(cfg["task"], encoding="utf-8") as f:
            task = json.load(f)
        # the hidden test is read after the fork, by the test's process only (the candidate's process
        # closes this descriptor first): the candidate never holds it, not even in inherited memory
        task["test_fd"] = os.open(cfg["test"], os.O_RDONLY)
    try:
        if cfg["namespaces"]:
            _new_root(cfg)
        _limits(cfg)
        _drop(cfg)
        if not cfg["namespaces"]:
            sys.addaudithook(_no_network)
    except OSError as e:
        status.write(json.dumps({"setup": f"the sandbox could not confine the program: {_one_line(e)}"}) + "\n")
        status.flush()
        os._exit(70)
    if cfg["namespaces"]:
        # this process is PID 1 of the new PID namespace, to which the kernel delivers no signal it
        # does not handle: the program runs in a child (PID 2), and when this one exits the kernel
        # kills whatever else is left in the namespace
        pid = os.fork()
        if pid:
            _, code = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(code) if os.WIFEXITED(code) else 128 + os.WTERMSIG(code))
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    status.write(json.dumps({"started": True}) + "\n")  # confined: what follows is the program's doing
    status.flush()
    outcome = _run_test(source, task, cfg) if task is not None else _run_program(source, cfg)
    status.write(json.dumps({"status": outcome[0], "detail": outcome[1]}) + "\n")
    status.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
