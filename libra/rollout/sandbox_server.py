"""The sandbox server (see `libra.rollout.sandbox` for what a call gets): the program that runs
inside one bwrap sandbox and forks every call into namespaces of its own (`SERVE`); its caller's
side is `libra.rollout.sandbox_client`.

`libra.rollout.sandbox` builds the bwrap command that runs `SERVE` and decides which calls go
through the server; this module knows nothing of configurations, only of requests.
"""

from __future__ import annotations

INSIDE = "/workspace"  # where the task's working directory appears inside the sandbox
ROOTS = "/roots"  # where the sandbox server sees the working-directory root (hidden from every call)
CGROUPS = "/cgroups"  # where it sees its directories of calls' cgroups (one a hierarchy: 0, 1, ...), if any (hidden too)
NEW_ROOT = "/newroot"  # where a call builds its own root (`new_root`)
MASKED = ("/proc/keys", "/proc/key-users")  # /proc files a call reads as empty (they list what all calls share)

# The sandbox server: runs inside a bwrap sandbox (uid 65534, no capabilities), reads one request a
# message from its socket (fd argv[1]; {"id", "rel", "limits", "tmp_bytes", "cgroup"} with three descriptors
# attached: the code to run (an anonymous file the server never reads), the call's stdout and its
# stderr; or {"kill": id}) and answers {"id", "status"} (the wait
# status of the call's first child) when a call has ended. Per call: child C (forked ahead by the
# zygote Z, which never sees a request, and handed its own request alone) makes the namespaces,
# init G (PID 1 there) mounts /proc and /tmp, worker W drops its capabilities and runs the code.
# Runs the tool's code in the process it is in, in both ways a call starts: reads the code from a
# descriptor (which is closed; stdin is /dev/null from then on), sets the limits (hard ones too: an
# unprivileged process cannot raise them again), runs the code in a namespace of its own and
# returns its exit status; a traceback starts at the tool's own code.
TOOL_RUNNER = r'''
import ctypes, os, sys, resource, traceback
class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
def confine(program):
    """A session keyring of its own, then no_new_privs and the system-call filter (for good)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(250, 1, None, 0, 0, 0) < 0 and ctypes.get_errno() not in (38, 95):  # keyctl JOIN_SESSION_KEYRING
        raise OSError(ctypes.get_errno(), "a fresh session keyring: " + os.strerror(ctypes.get_errno()))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "no_new_privs: " + os.strerror(ctypes.get_errno()))
    code = ctypes.create_string_buffer(program, len(program))
    if libc.prctl(22, 2, ctypes.byref(_Fprog(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the system-call filter: " + os.strerror(ctypes.get_errno()))
def run_tool(source_fd, limits, program):
    with open(source_fd, "rb") as source:
        text = source.read()
    null = os.open("/dev/null", os.O_RDONLY)
    if null != 0:
        os.dup2(null, 0)
        os.close(null)
    for name, value in limits:
        resource.setrlimit(getattr(resource, name), value)
    with open("/proc/self/oom_score_adj", "w") as adj:  # a machine out of memory kills a call before Libra
        adj.write("1000")
    confine(program)
    try:
        exec(compile(text, "<tool>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<tool>":
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
        return 1
    return 0
'''

SERVE = TOOL_RUNNER + r'''
import ctypes, errno, gc, json, select, signal, socket
sock = socket.socket(fileno=int(sys.argv[1]))
libc = ctypes.CDLL(None, use_errno=True)
NEWUSER, NEWNS, NEWPID, NEWNET, NEWIPC, NEWUTS = 0x10000000, 0x20000, 0x20000000, 0x40000000, 0x08000000, 0x04000000
NEWCGROUP = 0x02000000  # (after the call joined its cgroups: they are its root, and no host path shows)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}[os.uname().machine]  # (no libc wrapper)
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
UID, GID = os.getuid(), os.getgid()
CATCHABLE = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGALRM)
INIT = []  # in a call's first child: its init, once forked
with open("/proc/sys/kernel/cap_last_cap") as f:
    LAST_CAP = int(f.read())
ENV = json.loads(sys.argv[2])
PROGRAM = bytes.fromhex(sys.argv[3])  # the system-call filter every call's code runs under

class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")

def write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)

def die_with_parent(alive):
    """SIGKILL when the parent dies; exit now if it already has (`alive`: the read end of a pipe
    whose write end only the parent holds)."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    os.set_blocking(alive, False)
    try:
        gone = os.read(alive, 1) == b""
    except BlockingIOError:
        gone = False
    os.close(alive)
    if gone:
        os._exit(111)

def end_call(*_):  # C, asked to end the call: kill its init; waiting for it waits out the namespace
    if not INIT:
        os._exit(137)
    try:
        os.kill(INIT[0], signal.SIGKILL)
    except ProcessLookupError:  # it has just ended on its own
        pass

def server_view(mounts):
    """What of the server's file system a call gets: the entries of its root (name, link target or
    None for a directory) and the outermost of `mounts` (the server's system mounts, as its bwrap
    made them; its mount table is never read: it lists every trajectory's working directory, whose
    names would stay in the memory every call is forked with)."""
    entries = [(name, os.readlink("/" + name) if os.path.islink("/" + name) else None)
               for name in sorted(os.listdir("/")) if "/" + name not in (ROOTS, CGROUPS, NEW_ROOT, "/tmp")
               and (os.path.islink("/" + name) or os.path.isdir("/" + name))]
    outermost = [m for m in mounts if not any(m.startswith(other + "/") for other in mounts)]
    return entries, sorted(set(outermost))

def new_root(source):
    """Make the call's root a file system of its own that holds the server's system mounts and the
    call's working directory alone, and detach the server's root: the other calls' working
    directories are then nowhere in the call's mount table (a tmpfs over them would hide their
    contents but still list their names)."""
    check(libc.mount(b"none", NEW_ROOT.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=755"), "new root")
    for name, link in ROOT_ENTRIES:
        if link is None:
            os.mkdir(NEW_ROOT + "/" + name)
        else:
            os.symlink(link, NEW_ROOT + "/" + name)
    for point in CARRIED:
        os.makedirs(NEW_ROOT + point, exist_ok=True)
        check(libc.mount(point.encode(), (NEW_ROOT + point).encode(), None, MS_BIND | MS_REC, None), "carry " + point)
    for name in (INSIDE, "/tmp"):
        os.makedirs(NEW_ROOT + name, exist_ok=True)
    check(libc.mount(source.encode(), (NEW_ROOT + INSIDE).encode(), None, MS_BIND | MS_REC, None), "bind")
    check(libc.mount(b"none", NEW_ROOT.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None), "read-only root")
    os.chdir(NEW_ROOT)
    check(libc.syscall(PIVOT_ROOT, b".", b"."), "pivot_root")  # the old root now lies over the new one
    check(libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")

def call(request, fds):  # C, once it has its request (see `blank`): the call's exit code
    code = 111
    try:
        os.setsid()
        source_fd, out, err = fds
        null = os.open("/dev/null", os.O_RDONLY)
        for target, fd in ((0, null), (1, out), (2, err), (3, source_fd)):
            os.dup2(fd, target)
        os.closerange(4, REPORT)  # all but the call's own descriptors and its report
        os.closerange(REPORT + 1, 1 << 16)
        cgroup = request.get("cgroup")
        if cgroup:  # the call's cgroups: joined before anything else, so all it starts is counted
            if os.path.basename(cgroup) != cgroup or cgroup in (".", ".."):
                raise OSError(f"not a cgroup name: {cgroup!r}")
            for tree in sorted(os.listdir(CGROUPS)):
                write(os.path.join(CGROUPS, tree, cgroup, "cgroup.procs"), "0")
        source = os.path.join(ROOTS, request["rel"])
        if os.path.realpath(source) != source or not os.path.isdir(source):
            raise OSError(f"the working directory {request['rel']} is not a plain directory under the root")
        check(libc.unshare(NEWUSER | NEWNS | NEWPID | NEWNET | NEWIPC | NEWUTS | NEWCGROUP), "unshare")
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", f"{UID} {UID} 1")
        write("/proc/self/gid_map", f"{GID} {GID} 1")
        write("/proc/sys/user/max_user_namespaces", "0")  # the code can make no user namespace
        check(libc.sethostname(b"sandbox", 7), "hostname")
        check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private")
        new_root(source)
        alive, holder = os.pipe()
        init = os.fork()
        if init == 0:
            os.close(holder)
            run_init(request, alive)
        INIT.append(init)
        os.close(alive)
        _, status = os.waitpid(init, 0)
        code = os.waitstatus_to_exitcode(status)
        code = code if code >= 0 else 128 - code
    except BaseException:
        traceback.print_exc()
    return code

def run_init(request, alive):  # G: PID 1 of the call's namespace
    code = 111
    try:
        os.close(REPORT)  # the code never holds the line its status goes back on
        die_with_parent(alive)
        check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV, None), "proc")
        for masked in MASKED:  # the uid's keys are every call's (other calls' keyrings, their count)
            if os.path.exists(masked):
                check(libc.mount(b"/dev/null", masked.encode(), None, MS_BIND, None), "mask " + masked)
        # an inode a page of the cap: empty files cost kernel memory the size does not count (without
        # root no memory cgroup does either: 200,000 of them held 193 MiB)
        tmpfs = b"size=%d,nr_inodes=%d" % (request["tmp_bytes"], max(64, request["tmp_bytes"] // 4096))
        check(libc.mount(b"none", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, tmpfs), "tmp")
        check(libc.mount(b"none", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, tmpfs), "shm")
        check(libc.mount(b"none", b"/dev/pts", b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k"), "pts")
        for sig in CATCHABLE:  # the namespace's init takes no signal from the code (SIGKILL it ignores anyway)
            signal.signal(sig, signal.SIG_IGN)
        worker = os.fork()
        if worker == 0:
            run_code(request)
        while True:  # reap orphans until the code's process ends; then everything else dies with us
            pid, status = os.wait()
            if pid == worker:
                code = os.waitstatus_to_exitcode(status)
                code = code if code >= 0 else 128 - code
                break
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)

def run_code(request):  # W: the tool's code, without capabilities, under the limits
    code = 1
    try:
        for sig in CATCHABLE:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        for cap in range(LAST_CAP + 1):
            check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "capbset")
        check(libc.capset(ctypes.byref(CapHeader(0x20080522, 0)), (CapData * 2)()), "capset")
        os.chdir(INSIDE)
        os.environ.clear()
        os.environ.update(ENV)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        code = run_tool(3, request["limits"], PROGRAM)  # the code comes from the caller, never through the server
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

def blank(channel, alive, holder):  # C, forked from the zygote before any call is known
    """Wait for this process's one request on `channel`, run the call, and report its status there."""
    code = 111
    try:
        os.close(holder)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        die_with_parent(alive)
        signal.signal(signal.SIGTERM, end_call)
        message, fds, _, _ = socket.recv_fds(channel, 1 << 16, 3)
        if not message:  # the server went away, or had no call for it
            os._exit(0)
        if any(fd >= REPORT for fd in fds):
            raise OSError(f"descriptors {fds} reach the report's ({REPORT})")
        os.dup2(channel.fileno(), REPORT)
        channel.close()
        code = call(json.loads(message), fds)
    except BaseException:
        traceback.print_exc()
    finally:
        try:  # the status goes to the server itself: the zygote that reaps this process learns nothing
            os.write(REPORT, json.dumps({"status": (code & 0xFF) << 8}).encode())
        finally:
            os._exit(0)

def zygote(ctl):  # Z: forks each call's process before anything of the call is known, and keeps nothing of it
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    alive, holder = os.pipe()  # every call's process dies with the zygote (the write end is ours alone)
    gc.freeze()  # never collected: a forked call does not copy pages to scan them
    while True:
        readable, _, _ = select.select([ctl, wake_r], [], [])
        if wake_r in readable:
            while True:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    break
            reap_all()
        if ctl not in readable:
            continue
        if not ctl.recv(16):  # the server went away: so do the calls (they die with us)
            os._exit(0)
        try:
            theirs, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:  # (the host's open files at fs.file-max, say): this call is refused, not all
            ctl.send(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}).encode())
            continue
        try:
            child = os.fork()
        except OSError as exc:
            theirs.close()
            mine.close()
            ctl.send(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}).encode())
            continue
        if child == 0:
            for fd in (ctl.fileno(), mine.fileno(), wake_r, wake_w):
                os.close(fd)
            blank(theirs, alive, holder)
        theirs.close()
        try:
            socket.send_fds(ctl, [json.dumps({"spawned": child}).encode()], [mine.fileno()])
        except OSError as exc:  # (descriptors in flight past the limit: see RLIMIT_NOFILE in `_rlimits`)
            os.kill(child, signal.SIGKILL)
            ctl.send(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}).encode())
        mine.close()

def reap_all():
    """Reap every call's process that has ended (each reported its own status to the server)."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return

# The server never forks a call from itself: it has read the other calls' requests (their working
# directories' names), and a fork would carry them in its memory, which the code can read. The
# zygote, forked before any request arrived, forks each call's process, which then reads its own
# request and no other and reports its status to the server itself; one is kept ready ahead of the
# next call. The zygote keeps nothing of any call: no request, no status, no list of processes.
ROOT_ENTRIES, CARRIED = server_view(SYSTEM_MOUNTS)
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)  # past the calls
REPORT = 63  # a call's process's descriptor for its status, above the few it holds (closed in its init: never the code's)
ours, zygotes = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
alive, holder = os.pipe()
ZYGOTE = os.fork()
if ZYGOTE == 0:
    os.close(holder)
    ours.close()
    sock.close()
    die_with_parent(alive)
    zygote(zygotes)
os.close(alive)
zygotes.close()
SPARE = 2  # blank call processes kept ready
spares, asked, waiting = [], 0, []  # [(process, its socket)], spawns asked for, [(request, message, fds)]
starved = False  # the last spawn failed: no spare is asked for ahead (each failure would ask again at once)
calls, pids = {}, {}  # a pidfd of a call's process -> (request id, its socket); request id -> process

def send(message):
    sock.send(json.dumps(message).encode())

def refuse(why):
    """The oldest waiting call cannot start: its stderr says why, and it ends with status 111."""
    request, _, fds = waiting.pop(0)
    try:
        os.write(fds[2], f"sandbox: the call could not start: {why}\n".encode())
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    send({"id": request["id"], "status": 111 << 8})

def dispatch():
    global asked
    while waiting and spares:
        pid, channel = spares.pop(0)
        request, message, fds = waiting[0]
        try:
            exited = os.pidfd_open(pid)  # readable once it has ended (and left the call's cgroups)
        except OSError:  # a blank one that died, its zygote going: the request waits for the next
            channel.close()
            continue
        try:
            socket.send_fds(channel, [message], fds)
        except OSError as exc:
            channel.close()
            os.close(exited)
            if exc.errno not in (errno.EPIPE, errno.ECONNREFUSED, errno.ECONNRESET):
                refuse(f"{type(exc).__name__}: {exc}")
            continue
        waiting.pop(0)
        for fd in fds:
            os.close(fd)
        calls[exited], pids[request["id"]] = (request["id"], channel), pid
    while len(spares) + asked < len(waiting) + (0 if starved else SPARE):
        ours.send(b"spawn")
        asked += 1

def ended(exited):
    """A call's process has ended: its status is the report it wrote before (none: it was killed,
    reported as SIGKILL). Reported once the process is gone, so its cgroups are empty by then."""
    ident, channel = calls.pop(exited)
    os.close(exited)
    try:
        channel.setblocking(False)
        report = channel.recv(256)
    except OSError:
        report = b""
    channel.close()
    pids.pop(ident, None)
    send({"id": ident, "status": json.loads(report)["status"] if report else signal.SIGKILL})

dispatch()
send({"ready": True})
while True:
    readable, _, _ = select.select([sock, ours, *calls], [], [])
    for exited in [r for r in readable if r in calls]:
        ended(exited)
    if ours in readable:
        message, fds, _, _ = socket.recv_fds(ours, 1 << 16, 1)
        if not message:  # the zygote is gone: nothing more can run
            break
        asked -= 1
        news = json.loads(message)
        starved = "spawned" not in news
        if not starved:
            spares.append((news["spawned"], socket.socket(fileno=fds[0])))
        elif waiting:
            refuse(news["failed"])
        dispatch()
    if sock not in readable:
        continue
    message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
    if not message:  # the caller went away: so does every call
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        break
    request = json.loads(message)
    if "kill" in request:
        pid = pids.get(request["kill"])
        if pid is not None:  # it kills its init, waits for the namespace to end, reports, then exits
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:  # it has just ended: its report is on its way
                pass
        for queued in [w for w in waiting if w[0]["id"] == request["kill"]]:  # not started yet
            waiting.remove(queued)
            for fd in queued[2]:
                os.close(fd)
            send({"id": request["kill"], "status": signal.SIGKILL})
        continue
    waiting.append((request, message, fds))
    dispatch()
'''
