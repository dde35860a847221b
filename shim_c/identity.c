/* Channel identity: getpid, getppid, gettid, gethostname, uname, and the procinfo
 * record each process (or image) starts with. */

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
    int32_t v[2] = {(int32_t)RS0(SYS_getpid), (int32_t)RS0(SYS_getppid)};
    if (g_mode == MODE_RECORD) {
        rec(t, CH_IDENTITY, OP_PROCINFO, v, 8);
    } else if (g_mode == MODE_REPLAY) {
        stream_t *s = &t->st[CH_IDENTITY];
        if (!s->mapped) map_stream(t, CH_IDENTITY);
        uint32_t n = 0;
        if (s->base && s->off + 16 <= s->size) memcpy(&n, s->base + s->off + 4, 4);
        if (n >= 8 && s->base[s->off + 1] == OP_PROCINFO && s->off + 8 + n <= s->size) {
            memcpy(&g_vpid, s->base + s->off + 8, 4);
            memcpy(&g_vppid, s->base + s->off + 12, 4);
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
            int32_t rc; uint32_t k;
            memcpy(&rc, p + 4, 4); memcpy(&k, p + 8, 4);
            if (rc) { errno = -rc; return -1; }
            if (k > len) k = (uint32_t)len;
            memcpy(name, p + 12, k);
            return 0;
        }
        return real_gethostname(name, len);
    }
    int r = real_gethostname(name, len);
    unsigned char head[12];
    int32_t rc = r ? -errno : 0;
    uint32_t k = 0;
    if (!r) { while (k < len && name[k]) k++; if (k < len) k++; }
    memcpy(head, &size, 4); memcpy(head + 4, &rc, 4); memcpy(head + 8, &k, 4);
    rec2(t, CH_IDENTITY, OP_GETHOSTNAME, head, 12, name, k);
    if (r) errno = -rc;
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
