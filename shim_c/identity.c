/* Channel identity: getpid, getppid, gettid, gethostname, uname, the procinfo record
 * each process (or image) starts with, and every pid the program is handed (fork, spawn,
 * waits, getpgid/getsid) -- with the map that turns the recorded pids the program passes
 * back (kill, waitpid, sched_*, setpgid, prlimit...) into live ones at replay. */

typedef struct { int32_t pid, ppid; } procrec_t;
typedef struct { uint32_t size; int32_t rc; uint32_t n; } hostrec_t; /* then bytes[n] */
_Static_assert(sizeof(procrec_t) == 8, "OP_PROCINFO payload: i32 pid | i32 ppid");
_Static_assert(sizeof(hostrec_t) == 12, "OP_GETHOSTNAME payload: u32 size | i32 rc | u32 n | bytes[n]");
_Static_assert(sizeof(struct utsname) == 390, "OP_UNAME payload: i32 rc | struct utsname (390 bytes)");

/* The pids replay has served. While the tape is paused (a Python hook at work) the
 * program must still see them, not the live ones: asyncio, for one, checks that the pid
 * its running loop was started under is still os.getpid(). */
static pid_t g_vpid, g_vppid;

/* Replay: recorded pid -> live pid, for every pid the tape served this process (children
 * from fork/spawn, reaped pids, tids, process groups and sessions). Own pid and parent
 * are g_vpid / g_vppid. Entries are appended under a lock and published by count, so
 * lookups (any thread, any context) take no lock; the newest entry for a pid wins (pids
 * are reused). Record needs no map: there the program sees live pids. */
#define PIDMAP 4096
static int32_t g_pm_rec[PIDMAP], g_pm_live[PIDMAP];
static uint32_t g_pm_n;
static int g_pm_lock;

static void pid_learn(pid_t rec, pid_t live) {
    if (!g_virt || rec <= 0 || live <= 0) return;
    spin_lock(&g_pm_lock);
    uint32_t n = g_pm_n;
    if (!(n && g_pm_rec[(n - 1) % PIDMAP] == rec && g_pm_live[(n - 1) % PIDMAP] == live)) {
        g_pm_rec[n % PIDMAP] = rec;
        g_pm_live[n % PIDMAP] = live;
        __atomic_store_n(&g_pm_n, n + 1, __ATOMIC_RELEASE);
    }
    spin_unlock(&g_pm_lock);
}

static pid_t pid_live1(pid_t p) { /* p > 0, recorded numbering */
    if (g_vpid && p == g_vpid) return (pid_t)RS0(SYS_getpid);
    uint32_t n = __atomic_load_n(&g_pm_n, __ATOMIC_ACQUIRE);
    uint32_t lo = n > PIDMAP ? n - PIDMAP : 0;
    for (uint32_t i = n; i-- > lo;)
        if (g_pm_rec[i % PIDMAP] == p) return g_pm_live[i % PIDMAP];
    if (g_vppid && p == g_vppid) return (pid_t)RS0(SYS_getppid);
    return p; /* not a pid the tape handed out (outside the tree, or never seen): as is */
}

/* A pid (or -pgid) the program passes to the kernel: recorded -> live. 0 and -1 keep
 * their meaning (own group, every process). */
static pid_t pid_live(pid_t p) {
    if (!g_virt) return p;
    if (p > 0) return pid_live1(p);
    if (p < -1) return -pid_live1(-p);
    return p;
}

/* A pid the kernel returned that the tape did not serve (paused calls): live -> recorded. */
static pid_t pid_rec(pid_t live) {
    if (!g_virt || live <= 0) return live;
    if (g_vpid && live == (pid_t)RS0(SYS_getpid)) return g_vpid;
    uint32_t n = __atomic_load_n(&g_pm_n, __ATOMIC_ACQUIRE);
    uint32_t lo = n > PIDMAP ? n - PIDMAP : 0;
    for (uint32_t i = n; i-- > lo;)
        if (g_pm_live[i % PIDMAP] == live) return g_pm_rec[i % PIDMAP];
    if (g_vppid && live == (pid_t)RS0(SYS_getppid)) return g_vppid;
    return live;
}

/* getpid, getppid, gettid: payload i32 value */
static int32_t ident(int op, int32_t live) {
    tls_t *t = me();
    served_t s;
    switch (tape_step(t, CH_IDENTITY, op, NULL, 0, &s)) {
    case STEP_SERVED:
        if (s.n >= 4) {
            int32_t v; memcpy(&v, s.p, 4);
            if (op == OP_GETTID) pid_learn(v, live);
            return v;
        }
        return live;
    case STEP_LIVE:
        /* build replay, a miss: still the recorded numbering, or a program comparing its
         * pid with one it saw before (asyncio's running loop, os.register_at_fork users)
         * would find another process */
        return g_build ? pid_rec(live) : live;
    case STEP_RECORD:
        break;
    }
    live = pid_rec(live); /* gone live after a resumed prefix: the pids it served stay */
    rec(t, CH_IDENTITY, op, &live, 4);
    return live;
}

/* Each process's pid and ppid, taped once as it (or a new image) starts. Replay takes
 * them before anything else, so the recorded pids are known from the first instruction,
 * even to code that runs while the tape is paused. A recording without them (an older
 * one) simply has no such first record. */
static void procinfo(void) {
    tls_t *t = me();
    T.guard++;
    procrec_t v = {(int32_t)RS0(SYS_getpid), (int32_t)RS0(SYS_getppid)};
    if (g_mode == MODE_RECORD) {
        if (g_virt && g_vppid) v.ppid = g_vppid; /* a child forked after a resume went live */
        rec(t, CH_IDENTITY, OP_PROCINFO, &v, sizeof v);
    } else if (g_mode == MODE_REPLAY) {
        stream_t *s = &t->st[CH_IDENTITY];
        if (!s->mapped) map_stream(t, CH_IDENTITY);
        uint32_t n = 0;
        if (s->base && s->off + 16 <= s->size) memcpy(&n, s->base + s->off + 4, 4);
        if (n >= sizeof v && s->base[s->off + 1] == OP_PROCINFO && s->off + 8 + n <= s->size) {
            memcpy(&v, s->base + s->off + 8, sizeof v);
            g_vpid = v.pid;
            g_vppid = v.ppid;
            s->off += 8 + n;
            s->pos++;
        }
    }
    T.guard--;
}

static pid_t virtual_pid(pid_t cached, pid_t live) {
    return g_virt && cached ? cached : live;
}

/* A process's own pid does not change: it is taped once, in the procinfo record each
 * process (and image) starts with, and every getpid is served from it, not from a record
 * of its own. Counting getpid calls by position made the tape depend on who asked first:
 * asyncio asks at every get_running_loop, and a library's first use of its loop moved
 * from paused work (a tool's body at record) to taped code (replay). */
EXPORT pid_t getpid(void) {
    return virtual_pid(g_vpid, (pid_t)RS0(SYS_getpid));
}
EXPORT pid_t getppid(void) {
    pid_t live = (pid_t)RS0(SYS_getppid);
    if (!ACTIVE()) return virtual_pid(g_vppid, live);
    pid_t v = ident(OP_GETPPID, live);
    if (g_mode == MODE_REPLAY) g_vppid = v;
    return v;
}
EXPORT pid_t gettid(void) {
    pid_t live = (pid_t)RS0(SYS_gettid);
    if (!ACTIVE()) return pid_rec(live);
    return ident(OP_GETTID, live);
}

/* A pid the kernel handed the program (fork, spawn, getpgid, getsid...): record tapes it
 * (payload: args | i32 result, result a pid or -errno), replay serves the recorded one and
 * learns recorded -> live. Paused: the live result, translated. */
typedef struct { int32_t pid, result; } pidq_t;
_Static_assert(sizeof(pidq_t) == 8, "OP_GETPGID/OP_GETSID payload: i32 pid | i32 result");

static long pid_query(int op, int nr, pid_t pid) {
    long r = RS1(nr, pid_live(pid));
    if (!ACTIVE()) return is_err(r) ? r : pid_rec((pid_t)r);
    tls_t *t = me();
    pidq_t q = {pid, (int32_t)r};
    served_t s;
    switch (tape_step(t, CH_IDENTITY, op, &q.pid, 4, &s)) {
    case STEP_SERVED:
        memcpy(&q, s.p, sizeof q);
        if (q.result > 0 && !is_err(r)) pid_learn(q.result, (pid_t)r);
        return q.result;
    case STEP_LIVE:
        return is_err(r) ? r : pid_rec((pid_t)r);
    case STEP_RECORD:
        break;
    }
    q.result = (int32_t)(is_err(r) ? r : pid_rec((pid_t)r)); /* gone live: still recorded pids */
    rec(t, CH_IDENTITY, op, &q, sizeof q);
    return q.result;
}
EXPORT pid_t getpgid(pid_t pid) { return (pid_t)sys_ret(pid_query(OP_GETPGID, SYS_getpgid, pid)); }
EXPORT pid_t getpgrp(void) { return getpgid(0); }
EXPORT pid_t getsid(pid_t pid) { return (pid_t)sys_ret(pid_query(OP_GETSID, SYS_getsid, pid)); }

EXPORT int gethostname(char *name, size_t len) {
    RESOLVE(gethostname);
    if (!ACTIVE()) return real_gethostname(name, len);
    tls_t *t = me();
    uint32_t size = (uint32_t)len;
    served_t s;
    switch (tape_step(t, CH_IDENTITY, OP_GETHOSTNAME, &size, 4, &s)) {
    case STEP_SERVED: {
        hostrec_t h;
        memcpy(&h, s.p, sizeof h);
        if (h.rc) { errno = -h.rc; return -1; }
        if (h.n > len) h.n = (uint32_t)len;
        memcpy(name, s.p + sizeof h, h.n);
        return 0;
    }
    case STEP_LIVE:
        return real_gethostname(name, len);
    case STEP_RECORD:
        break;
    }
    int r = real_gethostname(name, len);
    hostrec_t h = {size, r ? -errno : 0, 0};
    if (!r) { while (h.n < len && name[h.n]) h.n++; if (h.n < len) h.n++; }
    rec2(t, CH_IDENTITY, OP_GETHOSTNAME, &h, sizeof h, name, h.n);
    if (r) errno = -h.rc;
    return r;
}

EXPORT int uname(struct utsname *u) {
    RESOLVE(uname);
    if (!ACTIVE()) return real_uname(u);
    tls_t *t = me();
    served_t s;
    switch (tape_step(t, CH_IDENTITY, OP_UNAME, NULL, 0, &s)) {
    case STEP_SERVED:
        if (s.n >= 4 + sizeof *u) {
            int32_t rc; memcpy(&rc, s.p, 4);
            if (rc) { errno = -rc; return -1; }
            memcpy(u, s.p + 4, sizeof *u);
            return 0;
        }
        return real_uname(u);
    case STEP_LIVE:
        return real_uname(u);
    case STEP_RECORD:
        break;
    }
    int r = real_uname(u);
    int32_t rc = r ? -errno : 0;
    struct utsname z;
    if (r) memset(&z, 0, sizeof z);
    rec2(t, CH_IDENTITY, OP_UNAME, &rc, 4, r ? &z : u, sizeof *u);
    if (r) errno = -rc;
    return r;
}
