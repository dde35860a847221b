/* Channel identity: getpid, getppid, gettid, gethostname, uname, and the procinfo
 * record each process (or image) starts with. */

typedef struct { int32_t pid, ppid; } procrec_t;
typedef struct { uint32_t size; int32_t rc; uint32_t n; } hostrec_t; /* then bytes[n] */
_Static_assert(sizeof(procrec_t) == 8, "OP_PROCINFO payload: i32 pid | i32 ppid");
_Static_assert(sizeof(hostrec_t) == 12, "OP_GETHOSTNAME payload: u32 size | i32 rc | u32 n | bytes[n]");
_Static_assert(sizeof(struct utsname) == 390, "OP_UNAME payload: i32 rc | struct utsname (390 bytes)");

/* getpid, getppid, gettid: payload i32 value */
static int32_t ident(int op, int32_t live) {
    tls_t *t = me();
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_IDENTITY, op, NULL, 0, &n);
        if (p && n >= 4) { int32_t v; memcpy(&v, p, 4); return v; }
        return live;
    }
    rec(t, CH_IDENTITY, op, &live, 4);
    return live;
}

/* The pids replay has served. While the tape is paused (a Python hook at work) the
 * program must still see them, not the live ones: asyncio, for one, checks that the pid
 * its running loop was started under is still os.getpid(). */
static pid_t g_vpid, g_vppid;

/* Each process's pid and ppid, taped once as it (or a new image) starts. Replay takes
 * them before anything else, so the recorded pids are known from the first instruction,
 * even to code that runs while the tape is paused. A recording without them (an older
 * one) simply has no such first record. */
static void procinfo(void) {
    tls_t *t = me();
    T.guard++;
    procrec_t v = {(int32_t)RS0(SYS_getpid), (int32_t)RS0(SYS_getppid)};
    if (g_mode == MODE_RECORD) {
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
    return g_mode == MODE_REPLAY && cached ? cached : live;
}

EXPORT pid_t getpid(void) {
    pid_t live = (pid_t)RS0(SYS_getpid);
    if (!ACTIVE()) return virtual_pid(g_vpid, live);
    pid_t v = ident(OP_GETPID, live);
    if (g_mode == MODE_REPLAY) g_vpid = v;
    return v;
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
    if (!ACTIVE()) return live;
    return ident(OP_GETTID, live);
}

EXPORT int gethostname(char *name, size_t len) {
    RESOLVE(gethostname);
    if (!ACTIVE()) return real_gethostname(name, len);
    tls_t *t = me();
    uint32_t size = (uint32_t)len;
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_IDENTITY, OP_GETHOSTNAME, &size, 4, &n);
        if (p) {
            hostrec_t h;
            memcpy(&h, p, sizeof h);
            if (h.rc) { errno = -h.rc; return -1; }
            if (h.n > len) h.n = (uint32_t)len;
            memcpy(name, p + sizeof h, h.n);
            return 0;
        }
        return real_gethostname(name, len);
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
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_IDENTITY, OP_UNAME, NULL, 0, &n);
        if (p && n >= 4 + sizeof *u) {
            int32_t rc; memcpy(&rc, p, 4);
            if (rc) { errno = -rc; return -1; }
            memcpy(u, p + 4, sizeof *u);
            return 0;
        }
        return real_uname(u);
    }
    int r = real_uname(u);
    int32_t rc = r ? -errno : 0;
    struct utsname z;
    if (r) memset(&z, 0, sizeof z);
    rec2(t, CH_IDENTITY, OP_UNAME, &rc, 4, r ? &z : u, sizeof *u);
    if (r) errno = -rc;
    return r;
}
