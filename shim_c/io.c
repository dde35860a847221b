/* Channel io: the shape of I/O on pipes and socketpairs the process made itself
 * (pipe*, socketpair, followed through dup2/dup3, dropped at close), and waitpid(WNOHANG).
 *
 * How many bytes each read() of a pipe returns, and which fds a poll() finds ready,
 * depend on when the peer process wrote: a parent draining a child's output in a
 * timed poll loop (subprocess.communicate with a timeout) reads the clock once per
 * iteration, so the iteration count must repeat. For pipes and socketpairs a process
 * creates itself, record the sizes and ready sets; replay waits on the live fd (the peer
 * is replayed too, so the same bytes do come) until the recorded shape holds. */

static uint64_t g_pfd[16];

static inline int pfd_is(int fd) {
    return (unsigned)fd < 1024 && (__atomic_load_n(&g_pfd[fd >> 6], __ATOMIC_RELAXED) >> (fd & 63) & 1);
}
static inline void pfd_set(int fd, int on) {
    if ((unsigned)fd >= 1024) return;
    if (on) __atomic_fetch_or(&g_pfd[fd >> 6], 1ULL << (fd & 63), __ATOMIC_RELAXED);
    else __atomic_fetch_and(&g_pfd[fd >> 6], ~(1ULL << (fd & 63)), __ATOMIC_RELAXED);
}

EXPORT int pipe2(int fds[2], int flags) {
    long r = RS2(SYS_pipe2, fds, flags);
    if (is_err(r)) { errno = (int)-r; return -1; }
    if (g_mode) { pfd_set(fds[0], 1); pfd_set(fds[1], 1); rfd_set(fds[0], 0); rfd_set(fds[1], 0); }
    return 0;
}
EXPORT int pipe(int fds[2]) { return pipe2(fds, 0); }

EXPORT int socketpair(int dom, int type, int proto, int sv[2]) {
    long r = RS4(SYS_socketpair, dom, type, proto, sv);
    if (is_err(r)) { errno = (int)-r; return -1; }
    if (g_mode) { pfd_set(sv[0], dom == AF_UNIX); pfd_set(sv[1], dom == AF_UNIX); }
    return 0;
}

static void dup_marks(int from, int to) {
    pfd_set(to, pfd_is(from));
    rfd_set(to, rfd_is(from));
}
EXPORT int dup2(int from, int to) {
    long r = RS2(SYS_dup2, from, to);
    if (is_err(r)) { errno = (int)-r; return -1; }
    if (g_mode && from != to) dup_marks(from, to);
    return (int)r;
}
EXPORT int dup3(int from, int to, int flags) {
    long r = RS3(SYS_dup3, from, to, flags);
    if (is_err(r)) { errno = (int)-r; return -1; }
    if (g_mode) dup_marks(from, to);
    return (int)r;
}

EXPORT int close(int fd) {
    if (UNLIKELY(rfd_is(fd))) rfd_set(fd, 0);
    if (UNLIKELY(pfd_is(fd))) pfd_set(fd, 0);
    RESOLVE(close);
    return real_close(fd);
}

static void io_report(tls_t *t, const char *what) {
    char line[512];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, "divergence\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tchannel=io\tpos="); p = u_put(p, end, t->st[CH_IO].pos);
    p = s_put(p, end, "\trecorded="); p = s_put(p, end, what);
    p = s_put(p, end, "\tasked=read of a pipe\n");
    if (g_reports++ < 500) append_report(line, (size_t)(p - line));
    if (!g_lenient) die(DIVERGENCE_EXIT);
}

/* Block until fd shows one of `want` (or hangs up); the peer is being replayed. */
static void io_wait(int fd, short events, short want) {
    for (;;) {
        struct pollfd pf = {fd, events ? events : POLLIN, 0};
        long r = RS3(SYS_poll, &pf, 1, -1);
        if (r == 1 && (pf.revents & (want | POLLHUP | POLLERR | POLLNVAL))) return;
        if (is_err(r) && r != -EINTR) return;
    }
}

typedef struct { uint32_t asked; int32_t result; } ioread_t;
typedef struct { int32_t options, result, status; } iowait_t;
_Static_assert(sizeof(ioread_t) == 8, "OP_IO_READ payload: u32 asked | i32 result");
_Static_assert(sizeof(iowait_t) == 12, "OP_IO_WAIT payload: i32 options | i32 result | i32 status");

static ssize_t io_read(int fd, void *buf, size_t n) {
    tls_t *t = me();
    uint32_t asked = n > 0x7fffffff ? 0x7fffffff : (uint32_t)n;
    if (g_mode == MODE_RECORD) {
        long r = RS3(SYS_read, fd, buf, n);
        ioread_t out = {asked, (int32_t)r};
        rec(t, CH_IO, OP_IO_READ, &out, sizeof out);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return r;
    }
    uint32_t plen;
    const unsigned char *p = serve(t, CH_IO, OP_IO_READ, &asked, 4, &plen);
    if (!p) {
        long r = RS3(SYS_read, fd, buf, n);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return r;
    }
    int32_t want;
    memcpy(&want, p + offsetof(ioread_t, result), 4);
    if (want < 0) { errno = -want; return -1; }  /* EAGAIN, EINTR...: as recorded */
    size_t got = 0;
    for (;;) {
        long k = RS3(SYS_read, fd, (char *)buf + got, want ? (size_t)want - got : n);
        if (k == -EINTR) continue;
        if (k == -EAGAIN) { io_wait(fd, POLLIN, POLLIN); continue; }
        if (is_err(k)) { errno = (int)-k; return got ? (ssize_t)got : -1; }
        if (want == 0) {
            if (k > 0) io_report(t, "end of pipe, but the pipe had more data");
            return k;
        }
        if (k == 0) { io_report(t, "more data, but the pipe reached its end"); return (ssize_t)got; }
        got += (size_t)k;
        if (got >= (size_t)want) return (ssize_t)got;
    }
}

/* waitpid(..., WNOHANG): whether a child has exited yet is timing, and polling loops
 * (Popen.wait with a timeout) read the clock once per try. Blocking waits need no tape. */
static pid_t io_wait4(pid_t pid, int *status, int options, struct rusage *ru) {
    tls_t *t = me();
    int32_t opt = options;
    if (g_mode == MODE_RECORD) {
        int st = 0;
        long r = RS4(SYS_wait4, pid, &st, options, ru);
        iowait_t out = {opt, (int32_t)r, st};
        rec(t, CH_IO, OP_IO_WAIT, &out, sizeof out);
        if (is_err(r)) { errno = (int)-r; return -1; }
        if (status) *status = st;
        return (pid_t)r;
    }
    uint32_t plen;
    const unsigned char *p = serve(t, CH_IO, OP_IO_WAIT, &opt, 4, &plen);
    long r;
    if (!p) {
        r = RS4(SYS_wait4, pid, status, options, ru);
    } else {
        int32_t res;
        memcpy(&res, p + offsetof(iowait_t, result), 4);
        if (res == 0) return 0;
        if (res < 0) { errno = -res; return -1; }
        do r = RS4(SYS_wait4, pid, status, options & ~WNOHANG, ru); while (r == -EINTR);
    }
    if (is_err(r)) { errno = (int)-r; return -1; }
    return (pid_t)r;
}

static pid_t wait4_taped(pid_t pid, int *status, int options, struct rusage *ru) {
    if ((options & WNOHANG) && ACTIVE()) return io_wait4(pid, status, options, ru);
    long r = RS4(SYS_wait4, pid, status, options, ru);
    if (is_err(r)) { errno = (int)-r; return -1; }
    return (pid_t)r;
}
EXPORT pid_t wait4(pid_t pid, int *status, int options, struct rusage *ru) {
    return GATED(OP_SCHED_CHILD, !(options & WNOHANG), wait4_taped(pid, status, options, ru));
}
EXPORT pid_t waitpid(pid_t pid, int *status, int options) { return wait4(pid, status, options, NULL); }

EXPORT ssize_t read(int fd, void *buf, size_t n) {
    if (UNLIKELY(rfd_is(fd)) && ACTIVE()) return entropy(OP_RANDOM_READ, buf, n, 0, fd);
    if (UNLIKELY(pfd_is(fd)) && ACTIVE()) return GATED(OP_SCHED_IO, 1, io_read(fd, buf, n));
    RESOLVE(read);
    return real_read(fd, buf, n);
}

#define IO_POLL_MAX 64

/* poll() of a set holding one of these fds: the ready set and revents are the shape. */
static int io_poll(struct pollfd *fds, nfds_t nfds, int timeout) {
    tls_t *t = me();
    unsigned char a[8 + 2 * IO_POLL_MAX];
    int32_t to = timeout;
    uint32_t nf = (uint32_t)nfds;
    memcpy(a, &to, 4);
    memcpy(a + 4, &nf, 4);
    for (nfds_t i = 0; i < nfds; i++) memcpy(a + 8 + 2 * i, &fds[i].events, 2);
    uint32_t argn = 8 + 2 * (uint32_t)nfds;
    if (g_mode == MODE_RECORD) {
        long r = RS3(SYS_poll, fds, nfds, timeout);
        unsigned char out[4 + 2 * IO_POLL_MAX];
        int32_t res = (int32_t)r;
        memcpy(out, &res, 4);
        for (nfds_t i = 0; i < nfds; i++) memcpy(out + 4 + 2 * i, &fds[i].revents, 2);
        rec2(t, CH_IO, OP_IO_POLL, a, argn, out, 4 + 2 * (uint32_t)nfds);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return (int)r;
    }
    uint32_t plen;
    const unsigned char *p = serve(t, CH_IO, OP_IO_POLL, a, argn, &plen);
    if (!p) return real_poll(fds, nfds, timeout);
    int32_t res;
    memcpy(&res, p + argn, 4);
    if (res < 0) { errno = -res; return -1; }
    for (nfds_t i = 0; i < nfds; i++) {
        short rev;
        memcpy(&rev, p + argn + 4 + 2 * i, 2);
        if (rev && pfd_is(fds[i].fd)) io_wait(fds[i].fd, fds[i].events, rev);
        fds[i].revents = rev;
    }
    return res;
}

static int poll_shaped(const struct pollfd *fds, nfds_t nfds) {
    if (nfds > IO_POLL_MAX) return 0;
    for (nfds_t i = 0; i < nfds; i++)
        if (pfd_is(fds[i].fd)) return 1;
    return 0;
}
