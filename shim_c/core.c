/* The machinery every channel shares: string helpers, the private memory arena, spin
 * locks, per-thread record buffers and their shipping to the recorder, barriers, rec() /
 * rec2() (record), replay streams and serve() (replay), divergence reports. */

/* ------------------------------------------------------------------ small helpers */

static size_t s_len(const char *s) { size_t n = 0; while (s[n]) n++; return n; }

static char *s_put(char *p, char *end, const char *s) {
    while (*s && p < end) *p++ = *s++;
    return p;
}

static char *u_put(char *p, char *end, unsigned long long v) {
    char tmp[24]; int n = 0;
    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n && p < end) *p++ = tmp[--n];
    return p;
}

static char *i_put(char *p, char *end, long long v) {
    if (v < 0 && p < end) { *p++ = '-'; return u_put(p, end, (unsigned long long)(-v)); }
    return u_put(p, end, (unsigned long long)v);
}

static int starts(const char *s, const char *prefix) {
    while (*prefix) if (*s++ != *prefix++) return 0;
    return 1;
}

/* Memory for the shim itself, in its own address range (see header comment). */
static uintptr_t g_arena = 0x100000000000ULL;

static void *shim_map(size_t len, int fd) {
    len = (len + 4095) & ~(size_t)4095;
    for (int tries = 0; tries < 64; tries++) {
        uintptr_t at = __atomic_fetch_add(&g_arena, len + 65536, __ATOMIC_RELAXED);
        long p = RS6(SYS_mmap, at, len, fd < 0 ? PROT_READ | PROT_WRITE : PROT_READ,
                     MAP_PRIVATE | (fd < 0 ? MAP_ANONYMOUS | MAP_NORESERVE : 0) |
                         MAP_FIXED_NOREPLACE,
                     fd, 0);
        if (p == -EEXIST) continue;
        if (is_err(p)) return NULL;
        return (void *)p;
    }
    return NULL;
}

static void shim_unmap(void *p, size_t len) {
    RS2(SYS_munmap, p, (len + 4095) & ~(size_t)4095);
}

/* A raw syscall's result as libc gives it: -1 and errno for -errno. */
static long sys_ret(long r) {
    if (is_err(r)) { errno = (int)-r; return -1; }
    return r;
}

/* T.inshim brackets every critical section; the signal fences keep the compiler from
 * moving the lock or stream accesses outside the bracket (a handler runs on this thread). */
static inline void inshim_enter(void) {
    T.inshim++;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}
static inline void inshim_leave(void) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    T.inshim--;
}

static void spin_lock(int *l) {
    inshim_enter();
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) RS0(SYS_sched_yield);
}
static void spin_unlock(int *l) {
    __atomic_store_n(l, 0, __ATOMIC_RELEASE);
    inshim_leave();
}

/* ------------------------------------------------------------------ record: the connection */

/* Every process holds one connection to the recorder: it names the process's arena of
 * rings (ring.c) and carries barriers, nudges and the rare record too big for a ring. */

static void ring_announce(void); /* ring.c: name this process's arena on a new connection */

static int sock_ok(void) {
    if (g_sock < 0) return 0;
    struct stat st;
    if (is_err(RS2(SYS_fstat, g_sock, &st)) || st.st_ino != g_sock_ino) {
        g_sock = -1; /* the program closed it (close_range in a child) or reused the number */
        return 0;
    }
    return 1;
}

static int sock_connect(void) {
    if (sock_ok()) return 1;
    long fd = RS3(SYS_socket, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (is_err(fd)) return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, g_sockpath, s_len(g_sockpath));
    /* the cookie: a replay's network filters let the shim's own socket through */
    if (is_err(rsys(SYS_connect, fd, (long)&sa, sizeof sa, 0, 0, NET_COOKIE))) {
        RS1(SYS_close, fd);
        return 0;
    }
    int sndbuf = 4 << 20; /* big listings travel as one message */
    if (is_err(RS6(SYS_setsockopt, fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof sndbuf, 0)))
        RS6(SYS_setsockopt, fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf, 0);
    /* move out of the program's way: it must see the same fd numbers in both modes */
    long hi = RS3(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 900);
    if (!is_err(hi)) { RS1(SYS_close, fd); fd = hi; }
    struct stat st;
    RS2(SYS_fstat, fd, &st);
    g_sock_ino = st.st_ino;
    g_sock = (int)fd;
    ring_announce();
    return 1;
}

/* One message: header, body, and (fd >= 0) a file descriptor passed as SCM_RIGHTS. */
static int ship_fd(uint16_t type, uint32_t tindex, const void *body, size_t n, int fd) {
    if (!sock_connect()) return 0;
    unsigned char hdr[14 + 256];
    memcpy(hdr, STENO_MAGIC, 4);
    memcpy(hdr + 4, &type, 2);
    memset(hdr + 6, 0, 2);
    memcpy(hdr + 8, &tindex, 4);
    memcpy(hdr + 12, &g_proclen, 2);
    memcpy(hdr + 14, g_proc, g_proclen);
    struct iovec iov[2] = {{hdr, 14u + g_proclen}, {(void *)body, n}};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = n ? 2 : 1;
    union { struct cmsghdr h; unsigned char b[CMSG_SPACE(sizeof(int))]; } ctl;
    if (fd >= 0) {
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.b;
        mh.msg_controllen = sizeof ctl.b;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    long r;
    do r = rsys(SYS_sendmsg, g_sock, (long)&mh, MSG_NOSIGNAL, 0, 0, NET_COOKIE);
    while (r == -EINTR);
    return !is_err(r);
}

static int ship(uint16_t type, uint32_t tindex, const void *body, size_t n) {
    return ship_fd(type, tindex, body, n, -1);
}

/* Send a barrier-like message (drain, exit, a big record) and wait for the recorder's
 * answer: everything this process wrote before it is then appended. The answer's first
 * byte is the decision (1; 0: refused, for an intent the policy denies...), and some
 * decisions carry more (a stand-in's port, a settled command's output); 1 without a
 * recorder. Returns the answer's length. */
static int barrier_ask(uint16_t type, const void *body, size_t n, char *reply, size_t cap) {
    reply[0] = 1;
    long r = 1;
    spin_lock(&g_barrier_lock);
    if (ship(type, me()->tindex, body, n) && g_sock >= 0) {
        do r = RS3(SYS_read, g_sock, reply, cap); while (r == -EINTR);
        if (r < 1) { reply[0] = 1; r = 1; }
    }
    spin_unlock(&g_barrier_lock);
    return (int)r;
}

/* The same, for the answers that are one byte. */
static int barrier_with(uint16_t type, const void *body, size_t n) {
    char ack[8];
    barrier_ask(type, body, n, ack, sizeof ack);
    return ack[0];
}

static void barrier(uint16_t type) { barrier_with(type, NULL, 0); }

/* ------------------------------------------------------------------ replay: streams */

static void path_of_stream(char *out, size_t cap, uint32_t tindex, int ch) {
    char *p = out, *end = out + cap - 1;
    p = s_put(p, end, g_tape);
    p = s_put(p, end, "/");
    p = s_put(p, end, g_proc);
    p = s_put(p, end, "/");
    p = u_put(p, end, tindex);
    p = s_put(p, end, ".");
    p = s_put(p, end, CH_NAMES[ch]);
    *p = 0;
}

static void map_stream(tls_t *t, int ch) {
    stream_t *s = &t->st[ch];
    s->mapped = 1;
    s->base = NULL;
    s->size = s->off = s->dropped = 0;
    s->pos = 0;
    char path[1400];
    path_of_stream(path, sizeof path, t->tindex, ch);
    long fd = OWN4(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (is_err(fd)) return;
    struct stat st;
    if (!is_err(RS2(SYS_fstat, fd, &st)) && st.st_size > 0) {
        void *m = shim_map((size_t)st.st_size, (int)fd);
        if (m) { s->base = m; s->size = (size_t)st.st_size; }
    }
    RS1(SYS_close, fd);
}

static const char *const OP_NAMES[NCH][32] = {
#define OP(ch, op, name) [ch][op] = name,
#include "wrapped.def"
};

static const char *op_name(int ch, int op) {
    const char *name = (unsigned)ch < NCH && (unsigned)op < 32 ? OP_NAMES[ch][op] : NULL;
    return name ? name : "?";
}

/* "name(arg...)" from an op and its argument prefix. */
static char *describe(char *p, char *end, int ch, int op, const unsigned char *a, uint32_t n) {
    p = s_put(p, end, op_name(ch, op));
    p = s_put(p, end, "(");
    int32_t i1 = 0, i2 = 0;
    int64_t l1 = 0, l2 = 0;
    if (n >= 4) memcpy(&i1, a, 4);
    if (n >= 8) memcpy(&i2, a + 4, 4);
    switch (ch) {
    case CH_CLOCK:
        if (op == OP_CLOCK_GETTIME) { p = s_put(p, end, "clock="); p = i_put(p, end, i1); }
        if (op == OP_TIMESPEC_GET) { p = s_put(p, end, "base="); p = i_put(p, end, i1); }
        break;
    case CH_ENTROPY:
        p = s_put(p, end, "size="); p = u_put(p, end, (uint32_t)i1);
        if (op == OP_GETRANDOM || op == OP_GETRANDOM_RAW) { p = s_put(p, end, ", flags="); p = i_put(p, end, i2); }
        break;
    case CH_DIRENTS:
        if (n >= 2) {
            uint16_t pl; memcpy(&pl, a, 2);
            p = s_put(p, end, "path=");
            for (uint32_t i = 0; i < pl && 2 + i < n && p < end; i++)
                *p++ = (a[2 + i] == '\t' || a[2 + i] == '\n') ? ' ' : (char)a[2 + i];
        }
        break;
    case CH_IDENTITY:
        if (op == OP_GETHOSTNAME) { p = s_put(p, end, "size="); p = u_put(p, end, (uint32_t)i1); }
        break;
    case CH_WAIT:
        if (op == OP_NANOSLEEP && n >= 16) {
            memcpy(&l1, a, 8); memcpy(&l2, a + 8, 8);
            p = i_put(p, end, l1); p = s_put(p, end, "s+"); p = i_put(p, end, l2); p = s_put(p, end, "ns");
        } else if (op == OP_CLOCK_NANOSLEEP && n >= 24) {
            memcpy(&l1, a + 8, 8); memcpy(&l2, a + 16, 8);
            p = s_put(p, end, "clock="); p = i_put(p, end, i1);
            p = s_put(p, end, ", flags="); p = i_put(p, end, i2); p = s_put(p, end, ", ");
            p = i_put(p, end, l1); p = s_put(p, end, "s+"); p = i_put(p, end, l2); p = s_put(p, end, "ns");
        } else if (op == OP_SELECT && n >= 16) {
            memcpy(&l1, a + 8, 8);
            p = s_put(p, end, "timeout_us="); p = i_put(p, end, l1);
        } else if (n >= 4) {
            p = s_put(p, end, op == OP_POLL || op == OP_EPOLL ? "timeout_ms=" : "");
            p = i_put(p, end, i1);
        }
        break;
    case CH_META: { /* dir | flags | [mask] | pathlen | path */
        uint32_t hdr = op == OP_STATX ? 16 : 12, pl = 0;
        if (n < hdr) break;
        memcpy(&pl, a + hdr - 4, 4);
        if (i1 != AT_FDCWD) p = s_put(p, end, "an fd, ");
        p = s_put(p, end, "path=");
        for (uint32_t i = 0; i < pl && hdr + i < n && p < end; i++)
            *p++ = (a[hdr + i] == '\t' || a[hdr + i] == '\n') ? ' ' : (char)a[hdr + i];
        if (i2) { p = s_put(p, end, ", flags="); p = i_put(p, end, i2); }
        break;
    }
    case CH_NET:
        if (op == OP_NET_CONNECT && n >= 8) {
            uint16_t fam, port;
            uint32_t k;
            memcpy(&fam, a, 2); memcpy(&port, a + 2, 2); memcpy(&k, a + 4, 4);
            char s[64];
            if (fam == AF_UNIX) {
                p = s_put(p, end, "unix ");
                for (uint32_t i = 0; i < k && 8 + i < n && p < end; i++)
                    *p++ = a[8 + i] ? (char)a[8 + i] : '@';
            } else if (n >= 8 + k && inet_ntop(fam, a + 8, s, sizeof s)) {
                p = s_put(p, end, s);
                p = s_put(p, end, ":");
                p = u_put(p, end, port);
            }
        } else if (op == OP_NET_EPOLL && n >= 4) {
            p = s_put(p, end, "timeout_ms="); p = i_put(p, end, i1);
        } else if (n >= 4) {
            p = s_put(p, end, "connection #"); p = u_put(p, end, (uint32_t)i1);
        }
        break;
    case CH_IO:
        if (op == OP_IO_READ) { p = s_put(p, end, "size="); p = u_put(p, end, (uint32_t)i1); }
        if (op == OP_IO_POLL && n >= 8) {
            p = s_put(p, end, "timeout_ms="); p = i_put(p, end, i1);
            p = s_put(p, end, ", nfds="); p = i_put(p, end, i2);
        }
        break;
    }
    return s_put(p, end, ")");
}

/* One line onto TAPE/<name> (O_APPEND, one raw write; the cookie: never trapped, so it
 * is safe from inside the SIGSYS handler). */
static void tape_append(const char *name, const char *line, size_t n) {
    char path[1100];
    char *p = s_put(path, path + sizeof path - 1, g_tape);
    p = s_put(p, path + sizeof path - 1, "/");
    p = s_put(p, path + sizeof path - 1, name);
    *p = 0;
    long fd = OWN4(SYS_openat, AT_FDCWD, path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (is_err(fd)) return;
    OWN3(SYS_write, fd, line, n);
    OWN1(SYS_close, fd);
}

static void append_report(const char *line, size_t n) {
    char kept[2048];
    if (UNLIKELY(g_build) && n > 11 && starts(line, "divergence\t")) {
        /* build mode: a finding of the shim's own (a pipe's shape, a child, a signal) is
         * drift like any miss; counted on its channel, the first one described */
        const char *c = line;
        while (c < line + n && !starts(c, "\tchannel=")) c++;
        int ch = 0;
        for (int i = 1; c < line + n && i < NCH; i++) {
            size_t k = s_len(CH_NAMES[i]);
            if (starts(c + 9, CH_NAMES[i]) && c[9 + k] == '\t') ch = i;
        }
        if (!build_miss(ch) || n - 10 + 5 > sizeof kept) return;
        memcpy(kept, "drift", 5);
        memcpy(kept + 5, line + 10, n - 10);
        line = kept;
        n = n - 10 + 5;
    }
    tape_append("divergence", line, n);
}

static void report(const char *kind, tls_t *t, int ch, const unsigned char *rh, int op,
                   const void *args, uint32_t argn, uint16_t site) {
    char line[2048];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, kind);
    p = s_put(p, end, "\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tchannel="); p = s_put(p, end, CH_NAMES[ch]);
    p = s_put(p, end, "\tpos="); p = u_put(p, end, t->st[ch].pos);
    p = s_put(p, end, "\trecorded=");
    if (rh) {
        uint32_t rn; memcpy(&rn, rh + 4, 4);
        uint32_t an = argn < rn ? argn : rn;
        uint16_t rsite;
        memcpy(&rsite, rh + 2, 2);
        if (rh[0] != ch) p = s_put(p, end, "other-channel");
        else p = describe(p, end, rh[0], rh[1], rh + 8, an);
        if (rsite && site && rsite != site) { /* the same call from elsewhere: say so */
            p = s_put(p, end, " from site ");
            p = u_put(p, end, rsite & 0xfffu);
        }
    } else {
        p = s_put(p, end, "end-of-stream");
    }
    p = s_put(p, end, "\tasked=");
    p = describe(p, end, ch, op, args, argn);
    if (site && rh) {
        uint16_t rsite;
        memcpy(&rsite, rh + 2, 2);
        if (rsite && rsite != site) { p = s_put(p, end, " from site "); p = u_put(p, end, site & 0xfffu); }
    }
    *p++ = '\n';
    if (g_reports++ < 500) append_report(line, (size_t)(p - line));
}

/* A stream that ends where the program asks for more is a divergence -- unless the
 * recording of this process ended there because a signal killed it (its tape has no exit
 * record: TAPE/<proc>/exited is absent). If the recorded run was killed from outside
 * (TAPE/killed holds the signal that ended the recorded run), the replay ends here the
 * same way (die_as_recorded). Else the replayed killer sends it again, maybe a little
 * later than the recorded one landed: wait for it (10 s at most; a recording made before
 * exit records existed waits so at every end of stream). */
static int g_live_threads = 1; /* taped threads alive in this process (threads.c) */
static int g_parked;           /* of which at the end of their tape (die_as_recorded) */
static unsigned g_served;      /* records served so far, any thread (is the replay moving?) */
/* Resume: threads blocked in a replayed call until what the recording saw happen does
 * (the bytes a read was served, the readiness a poll was, the exit a wait reaped): most
 * often another replayed process's doing, and that process may be slower. While any is,
 * the process waits longer before it goes live (live.c). */
static int g_peer_waits;

static int peer_wait_in(void) {
    if (LIKELY(!g_resume) || g_mode != MODE_REPLAY) return 0;
    T.peer_waits++;
    __atomic_add_fetch(&g_peer_waits, 1, __ATOMIC_SEQ_CST);
    return 1;
}

static void peer_wait_out(int was) {
    if (!was || !T.peer_waits) return; /* (dropped by resume_park) */
    T.peer_waits--;
    __atomic_sub_fetch(&g_peer_waits, 1, __ATOMIC_SEQ_CST);
}

/* resume_park: the call reached this thread's end of tape; it waits for nobody. */
static void peer_wait_drop(void) {
    __atomic_sub_fetch(&g_peer_waits, T.peer_waits, __ATOMIC_SEQ_CST);
    T.peer_waits = 0;
}
static void sched_release(tls_t *t);

/* Replay's small files in the tape directory: TAPE/<name>, or TAPE/<this proc>/<name>. */
#define TAPE_PATH 1400
static void tape_path(char *path, int own, const char *name) {
    char *end = path + TAPE_PATH - 1;
    char *p = s_put(path, end, g_tape);
    p = s_put(p, end, "/");
    if (own) {
        p = s_put(p, end, g_proc);
        p = s_put(p, end, "/");
    }
    p = s_put(p, end, name);
    *p = 0;
}

static void tape_file_put(const char *path, const char *data, size_t n) {
    long fd = OWN4(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (is_err(fd)) return;
    RS3(SYS_write, fd, data, n);
    RS1(SYS_close, fd);
}

/* Up to n bytes of the file; -1 if it is not there. */
static long tape_file_get(const char *path, char *data, size_t n) {
    long fd = OWN4(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (is_err(fd)) return -1;
    long got = RS3(SYS_read, fd, data, n);
    RS1(SYS_close, fd);
    return got;
}

/* A signal number kept in a tape file (decimal); 0 if none. */
static int tape_signal_get(const char *path) {
    char num[8] = {0};
    long n = tape_file_get(path, num, sizeof num - 1);
    int sig = 0;
    for (long i = 0; i < n && num[i] >= '0' && num[i] <= '9'; i++) sig = sig * 10 + num[i] - '0';
    return sig > 0 && sig < 65 ? sig : 0;
}

static void tape_signal_put(const char *path, int sig) {
    char num[2] = {(char)('0' + sig / 10), (char)('0' + sig % 10)};
    tape_file_put(path, num, sizeof num);
}

/* The signals whose default action ends a process and which a handler can take: the
 * deaths replay keeps for a victim's tape end (signals.c, sig_defer_deaths). */
static const int g_fatal[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGALRM};
#define NFATAL (sizeof g_fatal / sizeof *g_fatal)

static int is_death(int sig) {
    for (size_t i = 0; i < NFATAL; i++)
        if (g_fatal[i] == sig) return 1;
    return sig == SIGKILL;
}

static int killed_signal(void) {
    char path[TAPE_PATH];
    tape_path(path, 0, "killed");
    return tape_signal_get(path);
}

/* The recorded run was killed: its threads were stopped wherever they were, and each
 * tape ends there. Under the schedule only the baton's holder was running; the others
 * were waiting for a turn that never came. So a thread that reaches its end without the
 * baton waits (the holder still has its part to replay: what it printed before the kill),
 * and the process dies with the recorded signal when the holder reaches its end, or when
 * every taped thread has (10 s at most: a thread the shim does not see may never come). */
/* Every taped thread replays to the end of its own tape before the process dies: the
 * one holding the scheduler's baton (running when the kill landed) lets it go and waits
 * too. A thread's output is not taped, and a thread without the baton may still have
 * to print what it printed before the kill (between its last taped call and the kill):
 * dying at once lost it whenever that thread was slower than the holder (a loaded
 * machine: the replay's output short of the recorded prefix, one in about thirty). */
static volatile int g_dying; /* the signal a thread of this process dies of at its end */
static void die_parked(int sig) {
    g_dying = sig;
    sched_release(&T);
    for (int i = 0; i < 10000; i++) {
        if (__atomic_load_n(&g_parked, __ATOMIC_SEQ_CST) >=
            __atomic_load_n(&g_live_threads, __ATOMIC_SEQ_CST)) break;
        struct timespec ts = {0, 1000 * 1000};
        RS2(SYS_nanosleep, &ts, NULL);
    }
    struct { void *h; unsigned long flags; void *restorer; uint64_t mask; } dfl = {0};
    RS4(SYS_rt_sigaction, sig, &dfl, NULL, 8); /* the recorded death, not a handler */
    uint64_t none = 0;
    RS4(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
    RS2(SYS_kill, RS0(SYS_getpid), sig);
}

static void die_as_recorded(int sig) {
    __atomic_add_fetch(&g_parked, 1, __ATOMIC_SEQ_CST);
    die_parked(sig);
}

/* Did this process's recording end through exit (TAPE/<proc>/exited)? (No directory for
 * the process at all: killed before it shipped a record.) */
static int recorded_exit(void) {
    char path[TAPE_PATH];
    tape_path(path, 1, "exited");
    struct stat st;
    return !is_err(OWN4(SYS_newfstatat, AT_FDCWD, path, &st, 0));
}

static void resume_park(tls_t *t); /* live.c: the end of a resumed prefix */

/* Has this thread replayed all its tape? (Streams it never used are looked at now.) */
static int tape_spent(tls_t *t) {
    for (int c = 1; c < NCH; c++) {
        stream_t *s = &t->st[c];
        if (!s->mapped) map_stream(t, c);
        if (s->off + 8 <= s->size) return 0;
    }
    return 1;
}

/* A terminating signal from another process that arrived before this process reached
 * the end of a tape that ends killed (signals.c, sig_defer_deaths): its death, due here.
 * It can come before the process execs (a `timeout` kills its child at once, while the
 * child is still on its way to exec the command): TAPE/<proc>/deferred carries it over. */
static volatile int g_deferred_kill;

static void deferred_save(void) {
    char path[TAPE_PATH];
    if (!g_deferred_kill || g_mode != MODE_REPLAY) return;
    tape_path(path, 1, "deferred");
    tape_signal_put(path, g_deferred_kill);
}

static void deferred_load(void) {
    char path[TAPE_PATH];
    tape_path(path, 1, "deferred");
    int sig = tape_signal_get(path);
    if (sig) g_deferred_kill = sig;
}

/* Replay: a death sent to a whole process group (kill(0), killpg) is kept in
 * TAPE/.group-<live pgid>: a member whose tape ends killed dies of it at its end even if
 * it did not exist yet when the signal was sent (the killer replayed faster). */
static void group_kill_path(char *path, long pgid) {
    char name[32];
    char *p = s_put(name, name + sizeof name - 1, ".group-");
    p = u_put(p, name + sizeof name - 1, (uint64_t)pgid);
    *p = 0;
    tape_path(path, 0, name);
}

static void group_kill_note(long pgid, int sig) {
    char path[TAPE_PATH];
    if (g_mode != MODE_REPLAY || g_resume || g_build || pgid <= 0 || !is_death(sig)) return;
    group_kill_path(path, pgid); /* (timeout's SIGCONT after its SIGTERM is no death) */
    tape_signal_put(path, sig);
}

static int group_killed(void) {
    char path[TAPE_PATH];
    group_kill_path(path, RS1(SYS_getpgid, 0));
    return tape_signal_get(path);
}

/* A thread at its end of tape in a process whose recording ended killed: it counts as
 * parked while it waits, so that another thread dying of the recorded signal (one the
 * process raised itself: uvicorn re-raises the SIGTERM it shut down for) does not wait
 * for it in turn -- each waited for the other until one gave up and called it a
 * divergence. */
static void await_kill(void) {
    if (recorded_exit()) return;
    int sig = killed_signal();
    if (sig) die_as_recorded(sig);
    if (g_deferred_kill) die_as_recorded(g_deferred_kill);
    if ((sig = group_killed())) die_as_recorded(sig);
    __atomic_add_fetch(&g_parked, 1, __ATOMIC_SEQ_CST);
    sched_release(&T);
    /* with every signal unblocked: the recorded one landed before this point, which the
     * program may have reached with it blocked (a shell's child right after fork) */
    uint64_t none = 0, old = 0;
    RS4(SYS_rt_sigprocmask, SIG_SETMASK, &none, &old, 8);
    for (int i = 0; i < 1000; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        RS2(SYS_nanosleep, &ts, NULL);
        if (g_dying) die_parked(g_dying);
        if (g_deferred_kill) die_parked(g_deferred_kill);
        if (i % 10 == 9 && (sig = group_killed())) die_parked(sig);
    }
    __atomic_sub_fetch(&g_parked, 1, __ATOMIC_SEQ_CST);
    RS4(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, 8);
}

/* This process's recording ended by exit while this thread was inside a call (a timed
 * wait, a blocking read: a heartbeat, a worker's semaphore): the exit stopped it there,
 * before its next record. So it waits here, off the schedule, for the replayed exit to
 * end it. If none comes (the program waits for this thread: a real divergence), it is
 * reported once the process has served no record for EXIT_PARK_MS. Quiet time, not time
 * parked: a worker parks at its end as soon as it has started, and a loaded machine took
 * more than 3 s to bring node's main thread from there to its exit (and, beside
 * stress-ng --cpu 3 --io 1, once more than 3 s between two of its taped calls). */
#define EXIT_PARK_MS 10000
static int64_t mono_ns(void); /* sched.c */
static void park_at_exit(tls_t *t) {
    sched_release(t);
    unsigned seen = __atomic_load_n(&g_served, __ATOMIC_RELAXED);
    int64_t quiet = mono_ns();
    for (;;) {
        struct timespec ts = {0, 1000 * 1000};
        RS2(SYS_nanosleep, &ts, NULL);
        unsigned now = __atomic_load_n(&g_served, __ATOMIC_RELAXED);
        if (now != seen) {
            seen = now;
            quiet = mono_ns();
        } else if (mono_ns() - quiet >= EXIT_PARK_MS * 1000000LL) {
            return;
        }
    }
}

/* A divergence on the meta channel (meta.c serves with t_soft set) is reported like any
 * other (the replay fails) but does not stop the process: from then on its metadata is
 * live and unchecked (g_offtape), while every other channel is served and checked as
 * before. A program that fails because replay refused it something (the network) prints
 * its traceback -- linecache stats the source files, which the recording never did --
 * and is stopped at the first other call the tape does not account for. */
static int g_offtape;
static __thread int t_soft __attribute__((tls_model("initial-exec")));

/* Next record of (thread, ch) if it is op with these argument bytes; else report the
 * divergence and exit 86 (or return NULL under STENO_LENIENT, leaving the stream where
 * it is so a later call may line up again). *plen receives the payload length. */
/* Before a divergence stops the replay: where the program was, into TAPE/<proc>/where,
 * for the report: the native stack of the diverging thread, then, in a CPython, every
 * thread's Python stack (CPython's own fatal-error dumper, which needs no GIL). */
static void dump_where(void) {
    typedef const char *(*dump_t)(int, void *, void *);
    typedef void *(*tstate_t)(void);
    dump_t dump = (dump_t)dlsym(RTLD_DEFAULT, "_Py_DumpTracebackThreads");
    tstate_t cur = (tstate_t)dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    char path[TAPE_PATH];
    tape_path(path, 1, "where");
    long fd = OWN4(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (is_err(fd)) return;
    /* in a forked copy: a thread caught half-made (its state being linked in) can crash
     * the dumper, and then only the copy dies, the lines so far written */
    long pid = RS6(SYS_clone, SIGCHLD, 0, 0, 0, 0, 0);
    if (pid == 0) {
        void *frames[48];
        int n = backtrace(frames, 48); /* the native stack first: any program has one */
        RS3(SYS_write, fd, "Native stack (most recent call first):\n", 39);
        backtrace_symbols_fd(frames, n, (int)fd);
        if (dump && cur) dump((int)fd, NULL, cur());
        RS1(SYS_exit_group, 0);
    }
    if (pid > 0) {
        int st;
        while (RS4(SYS_wait4, pid, &st, 0, 0) == -EINTR) {}
    }
    RS1(SYS_close, fd);
}

/* A replay that cannot go on: say where it was, then stop with the divergence code. */
static void diverged(void) {
    dump_where();
    die(DIVERGENCE_EXIT);
}

/* The pages of a stream's mapping well behind its read offset back to the kernel: a
 * replay's memory is a window per stream, not the tape (a page read again is read from
 * the file again: the mapping is private and never written). */
static void stream_release(stream_t *s) {
    size_t to = (s->off - STREAM_LAG) & ~(size_t)4095;
    if (to > s->dropped) {
        RS3(SYS_madvise, s->base + s->dropped, to - s->dropped, MADV_DONTNEED);
        s->dropped = to;
    }
}

static const unsigned char *serve(tls_t *t, int ch, int op, const void *args, uint32_t argn,
                                  uint32_t *plen) {
    uint16_t site = t->site; /* before the handlers due here can take it */
    t->site = 0;
    if (UNLIKELY(g_sigtape) && ch != CH_SIGNAL) sig_at_serve(t); /* handlers due here */
    stream_t *s = &t->st[ch];
    inshim_enter();
    if (UNLIKELY(!s->mapped)) map_stream(t, ch);
    const unsigned char *rh = NULL;
    if (LIKELY(s->off + 8 <= s->size)) {
        rh = s->base + s->off;
        uint32_t n;
        uint16_t rsite;
        memcpy(&n, rh + 4, 4);
        memcpy(&rsite, rh + 2, 2);
        if (LIKELY(rh[0] == ch && rh[1] == op && n >= argn && s->off + 8 + n <= s->size &&
                   memcmp(rh + 8, args, argn) == 0 &&
                   (rsite == site || !rsite || !site || g_anysite))) {
            s->off += 8 + n;
            s->pos++;
            __atomic_add_fetch(&g_served, 1, __ATOMIC_RELAXED);
            if (UNLIKELY(s->off - s->dropped > STREAM_WINDOW)) stream_release(s);
            if (ch != CH_SIGNAL) t->sigk = 0;
            *plen = n;
            inshim_leave();
            return rh + 8;
        }
    }
    if (UNLIKELY(g_build)) { /* build.c: a fit a little further on, or a live call */
        const unsigned char *p = build_fit(s, ch, op, args, argn, plen);
        if (p) {
            if (ch != CH_SIGNAL) t->sigk = 0;
            inshim_leave();
            return p;
        }
        if (build_miss(ch)) report("drift", t, ch, rh, op, args, argn, site);
        inshim_leave();
        return NULL;
    }
    if (!rh && g_resume && ch != CH_SIGNAL && !recorded_exit()) {
        inshim_leave();
        resume_park(t); /* returns live, or still replaying (lenient) */
        return NULL;
    }
    if (!rh && !g_lenient && recorded_exit()) park_at_exit(t); /* (a resume's too) */
    if (!rh && !g_lenient) await_kill();
    report("divergence", t, ch, rh, op, args, argn, site);
    if (!g_lenient && t_soft) g_offtape = 1;
    else if (!g_lenient) diverged();
    inshim_leave();
    return NULL;
}

/* Replay: is the next record of (t, ch) op with these argument bytes? 1 yes, 0 no (a
 * record of something else), -1 the stream has ended. Nothing is consumed or reported. */
static int tape_peek(tls_t *t, int ch, int op, const void *args, uint32_t argn) {
    stream_t *s = &t->st[ch];
    if (UNLIKELY(!s->mapped)) {
        inshim_enter();
        map_stream(t, ch);
        inshim_leave();
    }
    if (s->off + 8 > s->size) return -1;
    const unsigned char *rh = s->base + s->off;
    uint32_t n;
    memcpy(&n, rh + 4, 4);
    return rh[0] == ch && rh[1] == op && n >= argn && s->off + 8 + n <= s->size &&
           !memcmp(rh + 8, args, argn);
}

/* ------------------------------------------------------------------ the one decision */

/* What a taped call does, decided here, in one order, for every wrapper that tapes: under
 * record it is made and taped; under replay the next record of its stream is served when
 * it is this call (serve() reports a divergence otherwise); when nothing is served the
 * call runs live and untaped (a build replay's miss, a lenient replay past a divergence,
 * meta's off-tape calls), unless the process just went live at the end of a resumed
 * prefix (live.c): then it is made and taped as under record. A wrapper computes its
 * arguments, asks once, and switches on the answer. */
typedef enum { STEP_SERVED, STEP_LIVE, STEP_RECORD } step_t;
typedef struct {
    const unsigned char *p; /* STEP_SERVED: the record's payload */
    uint32_t n;             /* its length */
} served_t;

static inline step_t tape_step(tls_t *t, int ch, int op, const void *args, uint32_t argn,
                               served_t *out) {
    if (LIKELY(g_mode == MODE_RECORD)) return STEP_RECORD;
    out->p = serve(t, ch, op, args, argn, &out->n);
    if (out->p) return STEP_SERVED;
    return g_mode == MODE_RECORD ? STEP_RECORD : STEP_LIVE;
}
