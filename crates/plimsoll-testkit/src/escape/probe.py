# The escape suite's attacker: one check per invocation, `python3 probe.py CHECK`, with the
# facts the test gives in ctx.json (beside this file). Prints one line, `HELD <detail>` when
# the wall held or there was nothing to reach, `OPEN <detail>` when the check got through.
# Everything it starts, it ends; nothing it does outlasts its run.
import ctypes, errno, json, os, signal, socket, sys, time

CTX = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ctx.json")))
libc = ctypes.CDLL(None, use_errno=True)


def verdict(opened, detail):
    print(("OPEN " if opened else "HELD ") + detail)
    sys.exit(0)


def err():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def in_child(fn):
    """Runs fn() in a forked child; its exit code (0: got through)."""
    pid = os.fork()
    if pid == 0:
        try:
            code = fn()
        except BaseException as e:
            sys.stderr.write("child: %r\n" % (e,))
            code = 98
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def inherited_fd():
    name, secret = CTX["inherited_name"], CTX["inherited_secret"].encode()
    found = []
    for fd in range(3, 1024):
        try:
            os.fstat(fd)
        except OSError:
            continue
        try:
            link = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            link = "?"
        if name in link:
            found.append("fd %d is %s" % (fd, link))
        try:
            if secret in os.pread(fd, 4096, 0):
                found.append("read the secret through fd %d" % fd)
            os.pwrite(fd, b"x", 4096)
            found.append("wrote through fd %d" % fd)
        except OSError:
            pass
    verdict(bool(found), "; ".join(found) or "no descriptor names or reads the held file")


WALL = ("plimsoll", "bwrap", "containerd", "runc", "runsc", "dockerd", "gvisor")


def wall_processes():
    me = os.getpid()
    got, seen = [], []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        try:
            comm = open("/proc/%s/comm" % p).read().strip()
        except OSError:
            continue
        if not comm.startswith(WALL):
            continue
        seen.append("%s(%s)" % (comm, p))
        try:
            with open("/proc/%s/environ" % p, "rb") as f:
                f.read(1)
            got.append("read %s's environ" % comm)
        except OSError:
            pass
        try:
            open("/proc/%s/mem" % p, "rb").close()
            got.append("opened %s's mem" % comm)
        except OSError:
            pass
        try:
            os.listdir("/proc/%s/fd" % p)
            got.append("listed %s's fd/" % comm)
        except OSError:
            pass
    verdict(bool(got), "; ".join(got) or "visible and refused: %s" % (", ".join(seen) or "none"))


def host_paths():
    got = []
    try:
        if CTX["host_secret"] in open(CTX["host_marker"]).read():
            got.append("read " + CTX["host_marker"])
    except OSError:
        pass
    for p in CTX["host_listed"]:
        try:
            os.listdir(p)
            got.append("listed " + p)
        except OSError:
            pass
    verdict(bool(got), "; ".join(got) or "none reached")


def state_dir():
    p = CTX["state_dir"]
    try:
        verdict(True, "listed %s: %s" % (p, sorted(os.listdir(p))[:5]))
    except OSError as e:
        verdict(False, "%s: %s" % (p, e.strerror))


def neighbour():
    """Waits for the other run's sleeper, then looks for its process and its file."""
    want, marker, secret = CTX["neighbour_sleep"], CTX["neighbour_file"], CTX["neighbour_secret"]
    procs, files = [], []
    end = time.monotonic() + float(CTX["neighbour_wait_s"])
    while time.monotonic() < end and not procs:
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                cmd = open("/proc/%s/cmdline" % p, "rb").read().replace(b"\0", b" ")
            except OSError:
                continue
            if want.encode() in cmd and b"python" not in cmd:
                procs.append(p)
                try:
                    if secret in open("/proc/%s/cwd/%s" % (p, marker)).read():
                        files.append("through /proc/%s/cwd" % p)
                except OSError:
                    pass
        time.sleep(0.2)
    for root in CTX["neighbour_roots"]:
        for d, subdirs, names in os.walk(root):
            if d.count("/") - root.count("/") > 4:
                subdirs[:] = []
            if marker in names:
                try:
                    if secret in open(os.path.join(d, marker)).read():
                        files.append(os.path.join(d, marker))
                except OSError:
                    pass
    print("PROCS " + ("OPEN saw the other run's process %s" % procs if procs else "HELD no process of the other run"))
    print("FILES " + ("OPEN read the other run's file %s" % files if files else "HELD no file of the other run"))


def sleeper():
    with open(CTX["neighbour_file"], "w") as f:
        f.write(CTX["neighbour_secret"])
    os.execvp("sleep", ["sleep", CTX["neighbour_sleep"]])


def egress(addr_key):
    addr = CTX[addr_key]
    if not addr:
        verdict(False, "no such address on this host")
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((addr, CTX["listener_port"]))
        verdict(True, "connected to %s:%d" % (addr, CTX["listener_port"]))
    except OSError as e:
        verdict(False, "%s:%d: %s" % (addr, CTX["listener_port"], e))


def process_bomb():
    cap, pids, why = CTX["process_cap"], [], "the cap"
    for _ in range(cap):
        try:
            pid = os.fork()
        except OSError as e:
            why = str(e)
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
    for p in pids:
        os.kill(p, signal.SIGKILL)
    for p in pids:
        os.waitpid(p, 0)
    if len(pids) >= cap:
        verdict(True, "REACHED %d processes" % len(pids))
    verdict(False, "stopped at %d processes: %s" % (len(pids), why))


def memory_bomb():
    cap, chunks = CTX["memory_cap_mib"], []
    try:
        while len(chunks) * 64 < cap:
            chunks.append(b"\x01" * (64 << 20))
    except MemoryError:
        verdict(False, "stopped at %d MiB: MemoryError" % (len(chunks) * 64))
    verdict(True, "REACHED %d MiB" % (len(chunks) * 64))


def personality():
    r = libc.personality(0x0400000)
    if r == -1:
        verdict(False, "personality(READ_IMPLIES_EXEC): " + err())
    now = libc.personality(0xFFFFFFFF)
    libc.personality(r)
    verdict(now & 0x0400000 != 0, "persona now %#x" % now)


def socket_families():
    got, refused = [], []
    for name, fam, kind in [("AF_PACKET", 17, socket.SOCK_RAW), ("AF_PACKET", 17, socket.SOCK_DGRAM),
                            ("AF_VSOCK", 40, socket.SOCK_STREAM), ("AF_ALG", 38, socket.SOCK_SEQPACKET),
                            ("AF_KEY", 15, socket.SOCK_RAW)]:
        try:
            socket.socket(fam, kind, 0).close()
            got.append(name)
        except OSError as e:
            refused.append("%s: %s" % (name, errno.errorcode.get(e.errno, e.errno)))
    verdict(bool(got), "opened " + ", ".join(got) if got else "; ".join(refused))


def tiocsti():
    import fcntl, termios

    def inject():
        os.setsid()
        m, s = os.openpty()
        fcntl.ioctl(s, termios.TIOCSCTTY, 0)
        try:
            fcntl.ioctl(s, termios.TIOCSTI, b"x")
        except OSError as e:
            sys.stderr.write("TIOCSTI: %s\n" % errno.errorcode.get(e.errno, e.errno))
            return 1
        return 0

    try:
        os.openpty()
    except OSError as e:
        verdict(False, "no terminal to reach: openpty: %s" % e)
    code = in_child(inject)
    verdict(code == 0, "TIOCSTI on its own terminal: exit %d" % code)


def modify_ldt():
    buf = ctypes.create_string_buffer(16)
    r = libc.syscall(154, 0, buf, 16)
    verdict(r >= 0, "modify_ldt(0): %s" % (r if r >= 0 else err()))


def unshare_user():
    def go():
        return 0 if libc.unshare(0x10000000) == 0 else 1
    code = in_child(go)
    verdict(code == 0, "unshare(CLONE_NEWUSER) in a child: exit %d" % code)


def mount():
    target = os.path.abspath("mnt")
    os.makedirs(target, exist_ok=True)
    r = libc.mount(b"tmpfs", target.encode(), b"tmpfs", 0, None)
    if r == 0:
        libc.umount2(target.encode(), 2)
        verdict(True, "mounted a tmpfs on " + target)
    verdict(False, "mount: " + err())


def ptrace():
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    r = libc.ptrace(16, pid, None, None)
    e = err()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    verdict(r == 0, "PTRACE_ATTACH to its own child: %s" % ("attached" if r == 0 else e))


def memfd_exec():
    try:
        fd = os.memfd_create("x", 0)
    except OSError as e:
        verdict(False, "memfd_create: %s" % e)
    with open("/bin/true", "rb") as f:
        os.write(fd, f.read())

    def run():
        os.execv("/proc/self/fd/%d" % fd, ["x"])
    code = in_child(run)
    verdict(code == 0, "exec of a memfd: exit %d" % code)


CHECKS = {
    "inherited-fd": inherited_fd, "wall-processes": wall_processes, "host-paths": host_paths,
    "state-dir": state_dir, "neighbour": neighbour, "sleeper": sleeper,
    "egress-loopback": lambda: egress("loopback_addr"), "egress-host": lambda: egress("host_addr"),
    "process-bomb": process_bomb, "memory-bomb": memory_bomb, "personality": personality,
    "socket-families": socket_families, "tiocsti": tiocsti, "modify-ldt": modify_ldt,
    "unshare-user": unshare_user, "mount": mount, "ptrace": ptrace, "memfd-exec": memfd_exec,
}

if __name__ == "__main__":
    try:
        CHECKS[sys.argv[1]]()
    except SystemExit:
        raise
    except BaseException as e:
        print("ERROR %r" % (e,))
        sys.exit(3)
