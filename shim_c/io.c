/* Channel io: the shape of I/O on pipes and socketpairs the process made itself
 * (pipe*, socketpair, followed through dup2/dup3, dropped at close), on connections
 * between processes of the tree (since protocol 7: a connect to the tree's own address,
 * an accepted connection), and waitpid(WNOHANG).
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

/* The tree's own pipes across exec: a new image does not have the marks its process
 * had, and a program reading a pipe its parent made (an MCP server's stdin, read by an
 * anyio worker thread) would block in a read the scheduler does not see. So an exec's
 * environment carries STENO_PFD=<highest fd>:<inode>,<inode>... of the marked pipes and
 * socketpairs, and the new image marks the fds up to that one that are those (spawn's
 * file actions may have moved them to 0, 1 and 2). */
static int pfd_env(char *out, size_t cap) {
    if (!SINCE(5)) return 0;
    char *p = out, *end = out + cap - 24;
    int top = 2, n = 0;
    char inos[480], *q = inos, *qend = inos + sizeof inos - 24;
    for (int fd = 0; fd < 1024 && q < qend; fd++) {
        if (!pfd_is(fd)) continue;
        struct stat st;
        if (is_err(RS2(SYS_fstat, fd, &st))) continue;
        if (fd > top) top = fd;
        if (n++) *q++ = ',';
        q = u_put(q, qend, (uint64_t)st.st_ino);
    }
    if (!n) return 0;
    *q = 0;
    p = u_put(p, end, (uint64_t)top);
    *p++ = ':';
    p = s_put(p, out + cap - 1, inos);
    *p = 0;
    return 1;
}

static void pfd_inherit(const char *v) {
    uint64_t top = 0, inos[64];
    int n = 0;
    while (*v >= '0' && *v <= '9') top = top * 10 + (uint64_t)(*v++ - '0');
    if (*v++ != ':') return;
    while (*v && n < 64) {
        uint64_t x = 0;
        while (*v >= '0' && *v <= '9') x = x * 10 + (uint64_t)(*v++ - '0');
        inos[n++] = x;
        if (*v == ',') v++;
        else break;
    }
    for (int fd = 0; fd <= (int)top && fd < 1024; fd++) {
        struct stat st;
        if (is_err(RS2(SYS_fstat, fd, &st)) || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
            continue;
        for (int i = 0; i < n; i++)
            if (inos[i] == (uint64_t)st.st_ino) { pfd_set(fd, 1); break; }
    }
}

EXPORT int pipe2(int fds[2], int flags) {
    long r = RS2(SYS_pipe2, fds, flags);
    if (is_err(r)) { errno = (int)-r; return -1; }
    if (g_mode) {
        pfd_set(fds[0], 1); pfd_set(fds[1], 1); rfd_set(fds[0], 0); rfd_set(fds[1], 0);
        nfd_clear(fds[0]); nfd_clear(fds[1]);
    }
    return 0;
}
EXPORT int pipe(int fds[2]) { return pipe2(fds, 0); }

EXPORT int socketpair(int dom, int type, int proto, int sv[2]) {
    long r = RS4(SYS_socketpair, dom, type, proto, sv);
    if (is_err(r)) { errno = (int)-r; return -1; }
    if (g_mode) {
        pfd_set(sv[0], dom == AF_UNIX); pfd_set(sv[1], dom == AF_UNIX);
        nfd_clear(sv[0]); nfd_clear(sv[1]);
    }
    return 0;
}

static void dup_marks(int from, int to) {
    pfd_set(to, pfd_is(from));
    rfd_set(to, rfd_is(from));
    nfd_dup(from, to);
}
EXPORT int dup(int from) {
    long r = RS1(SYS_dup, from);
    if (is_err(r)) { errno = (int)-r; return -1; }
    if (g_mode && SINCE(5)) dup_marks(from, (int)r);
    return (int)r;
}
/* fcntl's F_DUPFD and F_DUPFD_CLOEXEC (CPython's os.dup) are dups too: the marks follow.
 * Every other command goes to the kernel as it is (64-bit: one struct flock). fcntl64 is
 * the same function on 64-bit. */
EXPORT int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    long r = RS3(SYS_fcntl, fd, cmd, arg);
    if (is_err(r)) { errno = (int)-r; return -1; }
    if (g_mode && SINCE(5) && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) dup_marks(fd, (int)r);
    return (int)r;
}
EXPORT int fcntl64(int fd, int cmd, ...) __attribute__((alias("fcntl")));
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
    if (UNLIKELY(nfd_is(fd)) &&
        (g_nconn[fd].ccall[0] || g_nconn[fd].call[0] || g_nconn[fd].held))
        net_conn_closed(fd, "closed");
    nfd_clear(fd);
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
    if (!g_lenient) diverged();
}

/* Block until fd shows one of `want` (or hangs up); the peer is being replayed. */
static void io_wait(int fd, short events, short want) {
    int peer = peer_wait_in();
    for (;;) {
        struct pollfd pf = {fd, events ? events : POLLIN, 0};
        long r = RS3(SYS_poll, &pf, 1, -1);
        if (r == 1 && (pf.revents & (want | POLLHUP | POLLERR | POLLNVAL))) break;
        if (is_err(r) && r != -EINTR) break;
    }
    peer_wait_out(peer);
}

typedef struct { uint32_t asked; int32_t result; } ioread_t;
typedef struct { int32_t options, result, status; } iowait_t;
_Static_assert(sizeof(ioread_t) == 8, "OP_IO_READ payload: u32 asked | i32 result");
_Static_assert(sizeof(iowait_t) == 12, "OP_IO_WAIT payload: i32 options | i32 result | i32 status");

/* read() (flags -1), or recv() with `flags` (0 or MSG_DONTWAIT) of a tree socket. */
static ssize_t io_read(int fd, void *buf, size_t n, int flags) {
    tls_t *t = me();
    uint32_t asked = n > 0x7fffffff ? 0x7fffffff : (uint32_t)n;
    served_t s;
    long r;
    switch (tape_step(t, CH_IO, OP_IO_READ, &asked, 4, &s)) {
    case STEP_RECORD: {
        r = flags < 0 ? RS3(SYS_read, fd, buf, n) : RS6(SYS_recvfrom, fd, buf, n, flags, 0, 0);
        ioread_t out = {asked, (int32_t)r};
        rec(t, CH_IO, OP_IO_READ, &out, sizeof out);
        return sys_ret(r);
    }
    case STEP_LIVE:
        return sys_ret(flags < 0 ? RS3(SYS_read, fd, buf, n)
                                 : RS6(SYS_recvfrom, fd, buf, n, flags, 0, 0));
    case STEP_SERVED:
        break;
    }
    int32_t want;
    memcpy(&want, s.p + offsetof(ioread_t, result), 4);
    if (want < 0) { errno = -want; return -1; }  /* EAGAIN, EINTR...: as recorded */
    size_t got = 0;
    for (;;) {
        int peer = peer_wait_in();
        long k = RS3(SYS_read, fd, (char *)buf + got, want ? (size_t)want - got : n);
        peer_wait_out(peer);
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

/* Waits for children. waitpid(..., WNOHANG): whether a child has exited yet is timing,
 * and polling loops (Popen.wait with a timeout) read the clock once per try: CH_IO
 * OP_IO_WAIT. A blocking wait: which child it reaps (wait(), waitpid(-1)) and its pid:
 * CH_IDENTITY OP_WAIT. Replay serves the recorded outcome and makes it true live: it reaps
 * the live child the recorded pid maps to (blocking), so the program sees the recorded
 * pid and status whatever order the live children end in. Paused: live, pids translated
 * both ways. */
typedef struct { int32_t pid, options, result, status; } waitrec_t;
_Static_assert(sizeof(waitrec_t) == 16, "OP_WAIT payload: i32 pid | i32 options | i32 result | i32 status");

static void wait_report(tls_t *t, int ch, pid_t want, long got) {
    char line[512];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, "divergence\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tchannel="); p = s_put(p, end, CH_NAMES[ch]);
    p = s_put(p, end, "\tpos="); p = u_put(p, end, t->st[ch].pos - 1);
    p = s_put(p, end, "\trecorded=child "); p = i_put(p, end, want);
    p = s_put(p, end, " reaped\tasked=wait: live child gave "); p = i_put(p, end, got);
    *p++ = '\n';
    if (g_reports++ < 500) append_report(line, (size_t)(p - line));
    if (!g_lenient) diverged();
}

/* Replay: reap the live child behind recorded pid `rpid` as the recorded wait did. */
static void reap_live(tls_t *t, int ch, pid_t rpid, int options, struct rusage *ru) {
    pid_t lp = pid_live(rpid);
    int st;
    long r;
    int peer = peer_wait_in();
    do r = RS4(SYS_wait4, lp, &st, options & ~WNOHANG, ru); while (r == -EINTR);
    peer_wait_out(peer);
    if (r != lp) wait_report(t, ch, rpid, r);
}

static pid_t io_wait4(pid_t pid, int *status, int options, struct rusage *ru) {
    tls_t *t = me();
    int32_t opt = options;
    served_t s;
    switch (tape_step(t, CH_IO, OP_IO_WAIT, &opt, 4, &s)) {
    case STEP_RECORD: {
        int st = 0;
        long r = RS4(SYS_wait4, pid_live(pid), &st, options, ru);
        if (!is_err(r)) r = pid_rec((pid_t)r); /* gone live: still recorded pids */
        iowait_t out = {opt, (int32_t)r, st};
        rec(t, CH_IO, OP_IO_WAIT, &out, sizeof out);
        if (is_err(r)) { errno = (int)-r; return -1; }
        if (status && r > 0) *status = st;
        return (pid_t)r;
    }
    case STEP_LIVE: {
        long r = RS4(SYS_wait4, pid_live(pid), status, options, ru);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return pid_rec((pid_t)r);
    }
    case STEP_SERVED:
        break;
    }
    iowait_t w;
    memcpy(&w, s.p, sizeof w);
    if (UNLIKELY(g_build) && pid > 0 && w.result > 0 && w.result != pid) {
        /* a build replay's lookahead fits a poll of another child (the record names no
         * pid): not this one's answer, so this poll runs live (a miss) */
        build_miss(CH_IO);
        long r = RS4(SYS_wait4, pid_live(pid), status, options, ru);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return pid_rec((pid_t)r);
    }
    if (w.result == 0) return 0;
    if (w.result < 0) { errno = -w.result; return -1; }
    reap_live(t, CH_IO, w.result, options, ru);
    if (status) *status = w.status;
    return w.result;
}

static pid_t wait_blocking(pid_t pid, int *status, int options, struct rusage *ru) {
    tls_t *t = me();
    waitrec_t w = {pid, options, 0, 0};
    served_t s;
    switch (tape_step(t, CH_IDENTITY, OP_WAIT, &w, 8, &s)) {
    case STEP_RECORD: {
        long r = RS4(SYS_wait4, pid_live(pid), &w.status, options, ru);
        if (!is_err(r)) r = pid_rec((pid_t)r); /* gone live: still recorded pids */
        w.result = (int32_t)r;
        rec(t, CH_IDENTITY, OP_WAIT, &w, sizeof w);
        if (is_err(r)) { errno = (int)-r; return -1; }
        if (status) *status = w.status;
        return (pid_t)r;
    }
    case STEP_LIVE: {
        long r = RS4(SYS_wait4, pid_live(pid), status, options, ru);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return pid_rec((pid_t)r);
    }
    case STEP_SERVED:
        break;
    }
    memcpy(&w, s.p, sizeof w);
    if (w.result < 0) { errno = -w.result; return -1; } /* EINTR, ECHILD: as recorded */
    if (w.result > 0) reap_live(t, CH_IDENTITY, w.result, options, ru);
    if (status && w.result > 0) *status = w.status;
    return w.result;
}

static pid_t wait4_taped(pid_t pid, int *status, int options, struct rusage *ru) {
    if (ACTIVE()) {
        if (options & WNOHANG) return io_wait4(pid, status, options, ru);
        return wait_blocking(pid, status, options, ru);
    }
    long r = RS4(SYS_wait4, pid_live(pid), status, options, ru);
    if (is_err(r)) { errno = (int)-r; return -1; }
    return pid_rec((pid_t)r);
}
EXPORT pid_t wait4(pid_t pid, int *status, int options, struct rusage *ru) {
    return GATED(OP_SCHED_CHILD, !(options & WNOHANG), wait4_taped(pid, status, options, ru));
}
EXPORT pid_t waitpid(pid_t pid, int *status, int options) { return wait4(pid, status, options, NULL); }
EXPORT pid_t wait(int *status) { return wait4(-1, status, 0, NULL); }
EXPORT pid_t wait3(int *status, int options, struct rusage *ru) { return wait4(-1, status, options, ru); }

/* waitid: payload i32 idtype | i32 id | i32 options (the arguments) | i32 rc | what the
 * siginfo said (si_pid 0: nothing to report, WNOHANG). */
typedef struct { int32_t idtype, id, options, rc, pid, code, status, uid; } waitidrec_t;
_Static_assert(sizeof(waitidrec_t) == 32, "OP_WAITID payload: 8 x i32");

static int waitid_taped(idtype_t idtype, id_t id, siginfo_t *info, int options) {
    id_t lid = idtype == P_PID || idtype == P_PGID ? (id_t)pid_live((pid_t)id) : id;
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (!ACTIVE()) {
        long r = RS6(SYS_waitid, idtype, lid, &si, options, NULL, 0);
        if (is_err(r)) { errno = (int)-r; return -1; }
        if (si.si_pid) si.si_pid = pid_rec(si.si_pid);
        if (info) *info = si;
        return 0;
    }
    tls_t *t = me();
    waitidrec_t w = {(int32_t)idtype, (int32_t)id, options, 0, 0, 0, 0, 0};
    served_t s;
    switch (tape_step(t, CH_IDENTITY, OP_WAITID, &w, 12, &s)) {
    case STEP_RECORD: {
        long r = RS6(SYS_waitid, idtype, lid, &si, options, NULL, 0);
        if (si.si_pid) si.si_pid = pid_rec(si.si_pid); /* gone live: still recorded pids */
        w.rc = (int32_t)r;
        if (!is_err(r)) { w.pid = si.si_pid; w.code = si.si_code; w.status = si.si_status; w.uid = (int32_t)si.si_uid; }
        rec(t, CH_IDENTITY, OP_WAITID, &w, sizeof w);
        if (is_err(r)) { errno = (int)-r; return -1; }
        if (info) *info = si;
        return 0;
    }
    case STEP_LIVE: {
        long r = RS6(SYS_waitid, idtype, lid, &si, options, NULL, 0);
        if (is_err(r)) { errno = (int)-r; return -1; }
        if (si.si_pid) si.si_pid = pid_rec(si.si_pid);
        if (info) *info = si;
        return 0;
    }
    case STEP_SERVED:
        break;
    }
    memcpy(&w, s.p, sizeof w);
    if (w.rc < 0) { errno = -w.rc; return -1; }
    if (w.pid > 0) {
        pid_t lp = pid_live(w.pid);
        long r;
        do r = RS6(SYS_waitid, P_PID, lp, &si, options & ~WNOHANG, NULL, 0); while (r == -EINTR);
        if (is_err(r) || si.si_pid != lp) wait_report(t, CH_IDENTITY, w.pid, is_err(r) ? r : si.si_pid);
        si.si_signo = SIGCHLD;
        si.si_pid = w.pid;
        si.si_code = w.code;
        si.si_status = w.status;
        si.si_uid = (uid_t)w.uid;
    } else {
        memset(&si, 0, sizeof si);
    }
    if (info) *info = si;
    return 0;
}
EXPORT int waitid(idtype_t idtype, id_t id, siginfo_t *info, int options) {
    return GATED(OP_SCHED_CHILD, !(options & WNOHANG), waitid_taped(idtype, id, info, options));
}

EXPORT ssize_t read(int fd, void *buf, size_t n) {
    if (UNLIKELY(rfd_is(fd)) && ACTIVE()) return entropy(CALL_SITE(), OP_RANDOM_READ, buf, n, 0, fd);
    if (UNLIKELY(pfd_is(fd)) && ACTIVE()) return GATED(OP_SCHED_IO, 1, io_read(fd, buf, n, -1));
    if (NET_ON(fd)) return GATED(OP_SCHED_IO, may_block(fd, 0), net_recv1(fd, buf, n, 0, NULL, NULL));
    RESOLVE(read);
    return real_read(fd, buf, n);
}

#define IO_POLL_MAX 64

/* poll() of a set holding one of these fds: the ready set and revents are the shape. */
static void raw_mask(int how, const sigset_t *set, sigset_t *old); /* signals.c */

/* io_poll under a signal mask of its own (ppoll, pselect): the mask is set and restored
 * around the wait atomically under record, and around its serving at replay, so a
 * handler the recording ran inside the wait runs there again. */
static int io_poll_masked(struct pollfd *fds, nfds_t nfds, int timeout,
                          const struct timespec *ts, const sigset_t *mask);

static int io_poll(struct pollfd *fds, nfds_t nfds, int timeout) {
    return io_poll_masked(fds, nfds, timeout, NULL, NULL);
}

static int io_poll_masked(struct pollfd *fds, nfds_t nfds, int timeout,
                          const struct timespec *ts, const sigset_t *mask) {
    tls_t *t = me();
    unsigned char a[8 + 2 * IO_POLL_MAX];
    int32_t to = timeout;
    uint32_t nf = (uint32_t)nfds;
    memcpy(a, &to, 4);
    memcpy(a + 4, &nf, 4);
    for (nfds_t i = 0; i < nfds; i++) memcpy(a + 8 + 2 * i, &fds[i].events, 2);
    uint32_t argn = 8 + 2 * (uint32_t)nfds;
    served_t s;
    sigset_t before;
    if (mask) {
        t->sigk++; /* a mask call: where a handler that ran in the wait is replayed */
        if (g_mode != MODE_RECORD) raw_mask(SIG_SETMASK, mask, &before);
    }
    step_t step = tape_step(t, CH_IO, OP_IO_POLL, a, argn, &s);
    if (mask && g_mode != MODE_RECORD && step != STEP_RECORD)
        raw_mask(SIG_SETMASK, &before, NULL);
    switch (step) {
    case STEP_RECORD: {
        for (nfds_t i = 0; g_resume && i < nfds; i++) /* a served connection, gone live */
            if (nfd_is(fds[i].fd) && g_nconn[fds[i].fd].served) net_live(fds[i].fd);
        struct timespec left;
        if (ts) left = *ts;
        long r = mask ? RS6(SYS_ppoll, fds, nfds, ts ? &left : NULL, mask, 8, 0)
                      : RS3(SYS_poll, fds, nfds, timeout);
        unsigned char out[4 + 2 * IO_POLL_MAX];
        int32_t res = (int32_t)r;
        memcpy(out, &res, 4);
        for (nfds_t i = 0; i < nfds; i++) memcpy(out + 4 + 2 * i, &fds[i].revents, 2);
        rec2(t, CH_IO, OP_IO_POLL, a, argn, out, 4 + 2 * (uint32_t)nfds);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return (int)r;
    }
    case STEP_LIVE:
        if (mask) {
            struct timespec left;
            if (ts) left = *ts;
            return (int)sys_ret(RS6(SYS_ppoll, fds, nfds, ts ? &left : NULL, mask, 8, 0));
        }
        return real_poll(fds, nfds, timeout);
    case STEP_SERVED:
        break;
    }
    const unsigned char *p = s.p;
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
        if (pfd_is(fds[i].fd) || nfd_is(fds[i].fd)) return 1;
    return 0;
}
