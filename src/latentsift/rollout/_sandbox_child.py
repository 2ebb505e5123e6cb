"""The sandbox's child: run by ``sandbox.run_program`` as a script (``python -I _sandbox_child.py
CONFIG``), never imported. It runs inside the namespaces ``unshare`` made (network, PID, mount) and,
before it reads the candidate program, confines itself:

1. (mount namespace) the host becomes read-only and private to the program: its own ``/proc``
   (a fresh proc of its PID namespace, listing only its own processes; an empty read-only tmpfs
   where the kernel refuses a new proc); its working folder bound onto itself; then every mount,
   recursively, read-only and ``nosuid`` (``mount_setattr``, or a remount of each mount in
   ``/proc/self/mountinfo`` on kernels before 5.12); then the working folder writable again and a
   fresh, size-bounded tmpfs over ``/tmp``, ``/var/tmp`` and ``/dev/shm``. So the rule is "read-only
   except its own folder and its private temporary mounts", whatever else the host leaves
   world-writable (``/run/lock``, a shared cache, ...). The interpreter's own folders that the
   unprivileged user could not enter (``/root/.pyenv`` under a ``0700`` ``/root``) are bound
   read-only into a fresh tmpfs at the closed folder, so the interpreter still finds its standard
   library while the rest of that folder stays hidden;
2. resource limits (address space, CPU seconds, file size, processes, open files, no core dumps);
3. no new privileges (``PR_SET_NO_NEW_PRIVS``: a set-uid program gains nothing); as root it drops to
   the unprivileged ``uid``/``gid`` with no supplementary groups; in a user namespace (the program
   keeps the caller's uid) it drops every capability, bounding set included, so that it cannot
   undo the read-only mounts; then it asks the kernel to kill it when its parent (``unshare``) dies
   (``PR_SET_PDEATHSIG``, set after the uid change that clears it);
4. (without a network namespace) an audit hook that refuses Python's socket calls.

Then (in namespaces) it forks, so that the program is not the PID namespace's init, writes a
"started" line to the status file descriptor, executes the program as the module ``candidate`` and
writes one JSON status line after it:
``passed`` (ran to its end), ``failed`` (an ``AssertionError`` or an early ``SystemExit``),
``memory`` (``MemoryError``) or ``error`` (any other exception), with a one-line detail. A process
that dies without writing one is judged by the parent (timeout, crash).
"""
import ctypes
import errno
import json
import os
import resource
import signal
import stat
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (a syscall added after 5.1)
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


def _set_attr(path, set_=0, clear=0, recursive=False):
    """``mount_setattr``: change only these attributes of the mount at ``path`` (and those below it);
    False where the kernel has no such call (before 5.12)."""
    attr = _MountAttr(set_, clear, 0, 0)
    if _LIBC.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_long(AT_FDCWD), ctypes.c_char_p(path.encode()),
                     ctypes.c_long(AT_RECURSIVE if recursive else 0), ctypes.byref(attr),
                     ctypes.c_long(ctypes.sizeof(attr))) == 0:
        return True
    if ctypes.get_errno() == errno.ENOSYS:
        return False
    _fail(f"make {path} read-only" if set_ else f"make {path} writable")


def _remount(path, options, read_only):
    """The pre-5.12 way: remount one mount, keeping the options it has (``options`` as in mountinfo)."""
    flags = MS_REMOUNT | MS_BIND | (MS_RDONLY | MS_NOSUID if read_only else 0)
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


def _read_only_host(work):
    """Everything read-only and ``nosuid``, but ``work`` (bound onto itself first, so that it is a
    mount of its own)."""
    _mount(work, work, None, MS_BIND)
    os.chdir(work)  # into the new mount
    if _set_attr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, recursive=True):
        _set_attr(work, clear=MOUNT_ATTR_RDONLY)
        return
    mounts = _mountinfo()
    for point, options in mounts:
        if point != work and os.path.isdir(point):  # a mount hidden under a later one is read-only with it
            try:
                _remount(point, options, True)
            except OSError:
                if os.path.ismount(point):
                    raise
    _remount(work, dict(mounts)[work], False)


def _own_proc():
    """A proc of this PID namespace over ``/proc``; an empty one where the kernel refuses it."""
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        _mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0555")


def _closed_ancestor(path, uid):
    """The topmost ancestor of ``path`` that ``uid`` (not its owner) may not enter, or None."""
    parts = os.path.abspath(path).split(os.sep)[1:]
    for i in range(1, len(parts)):
        p = os.sep + os.sep.join(parts[:i])
        try:
            st = os.stat(p)
        except OSError:
            return None
        if st.st_uid != uid and not st.st_mode & stat.S_IXOTH:
            return p
    return None


def _mount_folders(cfg):
    """Step 1 of the module docstring (root in a private mount namespace)."""
    _own_proc()
    _read_only_host(os.getcwd())
    for folder in cfg["world_writable"]:
        if os.path.isdir(folder):
            _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmpfs_bytes']},mode=1777")
    # each closed interpreter folder is bound aside (into the fresh /tmp) before its closed ancestor
    # is covered, then bound back read-only
    stage = []
    for path in cfg["expose"]:
        closed = _closed_ancestor(path, cfg["uid"])
        if closed is not None and os.path.isdir(path):
            point = f"/tmp/.latentsift-stage{len(stage)}"
            os.mkdir(point)
            _mount(path, point, None, MS_BIND | MS_REC)
            stage.append((closed, path, point))
    for closed in sorted({c for c, _, _ in stage}):
        _mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for _, path, point in stage:
        os.makedirs(path, exist_ok=True)
        _mount(point, path, None, MS_BIND | MS_REC)
        _mount("none", path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        _umount(point)
        os.rmdir(point)
    for closed in sorted({c for c, _, _ in stage}):
        _mount("none", closed, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


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


def main():
    cfg = json.loads(sys.argv[1])
    status = os.fdopen(cfg["status_fd"], "w")
    os.set_inheritable(status.fileno(), False)
    try:
        if cfg["namespaces"]:
            _mount_folders(cfg)
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
    with open(cfg["program"], encoding="utf-8") as f:
        source = f.read()
    status.write(json.dumps({"started": True}) + "\n")  # confined: what follows is the program's doing
    status.flush()
    # not "__main__": a candidate's ``if __name__ == "__main__":`` demo does not run (as in HumanEval's harness)
    ns = {"__name__": "candidate", "__file__": cfg["program"], "__builtins__": __builtins__}
    try:
        exec(compile(source, cfg["program"], "exec"), ns)
        outcome = ("passed", "ran to its end")
    except AssertionError as e:
        outcome = ("failed", _one_line(e) if str(e) else "AssertionError (a test did not hold)")
    except SystemExit as e:
        outcome = ("failed", f"exited before its end (SystemExit {e.code!r})")
    except MemoryError as e:
        outcome = ("memory", _one_line(e) if str(e) else "MemoryError (over the memory limit)")
    except BaseException as e:  # noqa: BLE001 - every other exception is the program's error
        outcome = ("error", _one_line(e))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or full stream: the status still counts
            pass
    status.write(json.dumps({"status": outcome[0], "detail": outcome[1]}) + "\n")
    status.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
