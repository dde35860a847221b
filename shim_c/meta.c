/* Channel meta: file metadata, the stat family (stat, lstat, fstat, fstatat and their
 * *64 names, the old __xstat family, statx). Every name goes to one of two calls:
 * fstatat(dirfd, path, flags) (stat = AT_FDCWD, lstat = AT_SYMLINK_NOFOLLOW, fstat(fd) =
 * fd, "", AT_EMPTY_PATH, as glibc makes them) or statx.
 *
 * What the kernel stamps (mtime/ctime/atime, inode, device, birth time, and the size of a
 * file the program writes as it goes) differs between two runs, and programs print it,
 * compare it (find -newer, make, importlib's directory cache keyed by the directory's
 * mtime) and branch on it. Record tapes the arguments and the whole result; replay checks
 * the arguments (another path or flags: a divergence, reported as serve() reports any; the
 * process goes on with live metadata, see t_soft in core.c) and
 * serves the whole recorded result -- struct and errno -- not a mix of recorded stamps
 * and live fields: the log is the truth, and a mix could show a size with another run's
 * mtime. To see the world change under the recording, replay also stats live (unless
 * STENO_DRIFT=0) and reports a `drift` line when the file's existence (or errno), its
 * type, or a regular file's size is not what was recorded; it still serves the recorded
 * result. Record also notes where a stat that names no absolute path looked
 * (meta_where): the files a program read, by name, for `stenograph diff`. */

#define META_PATHMAX 4096

/* The checked arguments: `dir` is AT_FDCWD or -1 (an fd: its number is not checked, as
 * fds the Python hooks' real connections held at record are not open at replay, so later
 * numbers can differ; it follows the path, unchecked) */
typedef struct { int32_t dir, flags; uint32_t pathlen; } statargs_t;        /* then path */
typedef struct { int32_t dir, flags; uint32_t mask, pathlen; } statxargs_t; /* then path */
typedef struct { int32_t fd, rc; } metares_t; /* then the struct (absent when rc < 0) */
_Static_assert(sizeof(statargs_t) == 12, "OP_FSTATAT args: i32 dir | i32 flags | u32 pathlen");
_Static_assert(sizeof(statxargs_t) == 16, "OP_STATX args: i32 dir | i32 flags | u32 mask | u32 pathlen");
_Static_assert(sizeof(metares_t) == 8, "meta result: i32 fd | i32 rc");
_Static_assert(sizeof(struct stat) == 144, "OP_FSTATAT result: struct stat (144 bytes)");
_Static_assert(sizeof(struct stat64) == sizeof(struct stat), "stat64 is stat on x86_64");
_Static_assert(sizeof(struct statx) == 256, "OP_STATX result: struct statx (256 bytes)");

static long meta_live(int op, int dirfd, const char *path, void *buf, int flags, unsigned mask) {
    if (op == OP_STATX) return rsys(SYS_statx, dirfd, (long)path, flags, mask, (long)buf, 0);
    return RS4(SYS_newfstatat, dirfd, path, buf, flags);
}

/* The kind and size a record says, and a live result's, for the drift check. */
static void meta_shape(int op, const void *b, unsigned *type, uint64_t *size) {
    if (op == OP_STATX) {
        const struct statx *x = b;
        *type = x->stx_mode & S_IFMT;
        *size = x->stx_size;
    } else {
        const struct stat *s = b;
        *type = s->st_mode & S_IFMT;
        *size = (uint64_t)s->st_size;
    }
}

static void meta_drift(tls_t *t, int op, const unsigned char *a, uint32_t argn, const char *what,
                       long rec_v, long live_v) {
    char line[1400];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, "drift\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tchannel=meta\tpos="); p = u_put(p, end, t->st[CH_META].pos - 1);
    p = s_put(p, end, "\trecorded="); p = s_put(p, end, what); p = s_put(p, end, " ");
    p = i_put(p, end, rec_v);
    p = s_put(p, end, "\tasked="); p = describe(p, end, CH_META, op, a, argn);
    p = s_put(p, end, ": live "); p = s_put(p, end, what); p = s_put(p, end, " ");
    p = i_put(p, end, live_v);
    p = s_put(p, end, " (served as recorded)\n");
    if (g_reports++ < 500) append_report(line, (size_t)(p - line));
}

static void meta_check(tls_t *t, int op, const unsigned char *a, uint32_t argn, int32_t rc,
                       const unsigned char *recbuf, int dirfd, const char *path, int flags,
                       unsigned mask) {
    union { struct stat s; struct statx x; } lb;
    long r = meta_live(op, dirfd, path, &lb, flags, mask);
    int32_t lrc = is_err(r) ? (int32_t)r : 0;
    if (lrc != rc) { meta_drift(t, op, a, argn, "errno", -rc, -lrc); return; }
    if (rc < 0) return;
    unsigned rt, lt;
    uint64_t rs, ls;
    union { struct stat s; struct statx x; } rb;
    memcpy(&rb, recbuf, op == OP_STATX ? sizeof rb.x : sizeof rb.s);
    meta_shape(op, &rb, &rt, &rs);
    meta_shape(op, &lb, &lt, &ls);
    if (rt != lt) meta_drift(t, op, a, argn, "type", (long)rt, (long)lt);
    else if (rt == S_IFREG && rs != ls) meta_drift(t, op, a, argn, "size", (long)rs, (long)ls);
}

/* Replay of an edited program (`stenograph replay FILE -- CMD` with another command: the
 * CLI sets STENO_EDITED=1, kept with the other STENO_* settings in g_extra): it stats its
 * own script, not the recorded one. A stat whose op, fd-or-cwd, flags (and mask) are the
 * recorded ones but whose path differs then takes its record's place, is made live and is
 * reported as drift; the divergence that matters surfaces later (a model call). Without
 * it, another path is a divergence like any other argument. */
static int g_edited = -1;

static int edited(void) {
    if (g_edited < 0) {
        g_edited = 0;
        for (size_t at = 0; at < g_extra_len; at += s_len(g_extra + at) + 1)
            if (starts(g_extra + at, "STENO_EDITED=1")) g_edited = 1;
    }
    return g_edited;
}

/* Edited replay: the next record is this call with another path. Consumed; 1. */
static int meta_other_path(tls_t *t, int op, const unsigned char *a, uint32_t hdr, uint32_t argn) {
    stream_t *s = &t->st[CH_META];
    int took = 0;
    inshim_enter();
    if (!s->mapped) map_stream(t, CH_META);
    if (s->base && s->off + 8 + hdr <= s->size) {
        const unsigned char *rh = s->base + s->off;
        uint32_t n;
        memcpy(&n, rh + 4, 4);
        if (rh[0] == CH_META && rh[1] == op && n >= hdr && s->off + 8 + n <= s->size &&
            memcmp(rh + 8, a, hdr - 4) == 0 && (n < argn || memcmp(rh + 8, a, argn) != 0)) {
            char line[1400];
            char *p = line, *end = line + sizeof line - 2;
            p = s_put(p, end, "drift\tproc="); p = s_put(p, end, g_proc);
            p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
            p = s_put(p, end, "\tchannel=meta\tpos="); p = u_put(p, end, s->pos);
            uint32_t rl;
            memcpy(&rl, rh + 8 + hdr - 4, 4);
            p = s_put(p, end, "\trecorded="); p = describe(p, end, CH_META, op, rh + 8, hdr + rl);
            p = s_put(p, end, "\tasked="); p = describe(p, end, CH_META, op, a, argn);
            p = s_put(p, end, ": another path (edited program), made live\n");
            if (g_reports++ < 500) append_report(line, (size_t)(p - line));
            s->off += 8 + n;
            s->pos++;
            took = 1;
        }
    }
    inshim_leave();
    return took;
}

/* Build replay: the recorded answer stands for the live one only if it is the same file
 * (outcome, type, mode, a regular file's size): what may differ is what the kernel stamps (times, inode,
 * device). A file the build changed -- its code -- is answered live, and counted. */
static int meta_same_file(int op, int32_t rc, const unsigned char *rb, int dirfd,
                          const char *path, void *buf, int flags, unsigned mask) {
    long r = meta_live(op, dirfd, path, buf, flags, mask);
    int same;
    if (is_err(r) || rc < 0) {
        same = is_err(r) ? rc == (int32_t)r : 0;
    } else if (op == OP_STATX) {
        struct statx rec, *live = buf;
        memcpy(&rec, rb, sizeof rec);
        same = rec.stx_mode == live->stx_mode &&
               (!S_ISREG(rec.stx_mode) || rec.stx_size == live->stx_size);
    } else {
        struct stat rec, *live = buf;
        memcpy(&rec, rb, sizeof rec);
        same = rec.st_mode == live->st_mode &&
               (!S_ISREG(rec.st_mode) || rec.st_size == live->st_size);
    }
    if (!same) build_miss(CH_META);
    return same;
}

/* Record: where a stat that names no absolute path looked -- an fstat's fd, a path
 * relative to the cwd or to a dirfd -- for a regular file, or a relative one that is not
 * there: `u32 n | n bytes` (the fd's link in /proc/self/fd, or the directory's joined with
 * the path) appended after the result. `diff` names the files a tool read by it; replay
 * reads nothing past the struct. Returns the bytes appended at `out` (0: nothing). */
static uint32_t meta_where(int op, int32_t rc, const void *st, int dirfd, const char *path,
                           uint32_t pl, unsigned char *out) {
    if (pl && path[0] == '/') return 0;
    if (rc == 0) {
        unsigned type;
        uint64_t size;
        meta_shape(op, st, &type, &size);
        if (type != S_IFREG) return 0;
    } else if (rc != -ENOENT || !pl) {
        return 0;
    }
    char *w = (char *)out + 4;
    long n;
    if (dirfd == AT_FDCWD) {
        n = RS2(SYS_getcwd, w, META_PATHMAX);
        n = is_err(n) || n < 1 ? -1 : n - 1; /* its length counts the NUL */
    } else {
        char link[40];
        char *p = u_put(s_put(link, link + 24, "/proc/self/fd/"), link + 39, (unsigned)dirfd);
        *p = 0;
        n = RS4(SYS_readlinkat, AT_FDCWD, link, w, META_PATHMAX);
    }
    if (is_err(n) || n <= 0 || (pl && n + 1 + pl > META_PATHMAX)) return 0;
    if (pl) {
        w[n++] = '/';
        memcpy(w + n, path, pl);
        n += pl;
    }
    uint32_t len = (uint32_t)n;
    memcpy(out, &len, 4);
    return 4 + len;
}

static int meta_call(int op, int dirfd, const char *path, void *buf, int flags, unsigned mask) {
    /* addresses below 4096 (NULL): let the kernel answer EFAULT, untaped (the prototypes are
     * nonnull, so a plain NULL test could be compiled away) */
    if (!ACTIVE() || (uintptr_t)path < 4096 || (uintptr_t)buf < 4096)
        return (int)sys_ret(meta_live(op, dirfd, path, buf, flags, mask));
    tls_t *t = me();
    uint32_t sz = op == OP_STATX ? (uint32_t)sizeof(struct statx) : (uint32_t)sizeof(struct stat);
    unsigned char a[16 + META_PATHMAX];
    uint32_t pl = 0;
    while (pl < META_PATHMAX && path[pl]) pl++;
    uint32_t hdr;
    int32_t dir = dirfd == AT_FDCWD ? AT_FDCWD : -1;
    if (op == OP_STATX) {
        statxargs_t h = {dir, flags, mask, pl};
        memcpy(a, &h, hdr = sizeof h);
    } else {
        statargs_t h = {dir, flags, pl};
        memcpy(a, &h, hdr = sizeof h);
    }
    memcpy(a + hdr, path, pl);
    uint32_t argn = hdr + pl;
    if (g_mode == MODE_REPLAY && (UNLIKELY(g_offtape) ||
        (UNLIKELY(edited()) && !g_build && meta_other_path(t, op, a, hdr, argn))))
        return (int)sys_ret(meta_live(op, dirfd, path, buf, flags, mask));
    size_t at_off = t->st[CH_META].off;
    uint32_t at_pos = t->st[CH_META].pos;
    served_t got;
    t_soft = 1; /* a divergence here is reported; the process goes on, metadata live */
    step_t step = tape_step(t, CH_META, op, a, argn, &got);
    t_soft = 0;
    switch (step) {
    case STEP_RECORD: {
        long r = meta_live(op, dirfd, path, buf, flags, mask);
        unsigned char out[sizeof(metares_t) + sizeof(struct statx) + 4 + META_PATHMAX];
        metares_t m = {dirfd, is_err(r) ? (int32_t)r : 0};
        memcpy(out, &m, sizeof m);
        uint32_t on = sizeof m;
        if (!m.rc) { memcpy(out + on, buf, sz); on += sz; }
        on += meta_where(op, m.rc, buf, dirfd, path, pl, out + on);
        rec2(t, CH_META, op, a, argn, out, on);
        return (int)sys_ret(is_err(r) ? r : 0);
    }
    case STEP_LIVE:
        return (int)sys_ret(meta_live(op, dirfd, path, buf, flags, mask));
    case STEP_SERVED:
        break;
    }
    const unsigned char *p = got.p;
    uint32_t n = got.n;
    if (n < argn + sizeof(metares_t))
        return (int)sys_ret(meta_live(op, dirfd, path, buf, flags, mask));
    metares_t m;
    memcpy(&m, p + argn, sizeof m);
    const unsigned char *rb = p + argn + sizeof m;
    if (!m.rc && n < argn + sizeof m + sz)
        return (int)sys_ret(meta_live(op, dirfd, path, buf, flags, mask));
    if (UNLIKELY(g_build) && !meta_same_file(op, m.rc, rb, dirfd, path, buf, flags, mask)) {
        /* another file's record (an fstat's arguments do not name the file): left for
         * the call it belongs to */
        t->st[CH_META].off = at_off;
        t->st[CH_META].pos = at_pos;
        return (int)sys_ret(meta_live(op, dirfd, path, buf, flags, mask));
    }
    if (g_drift && !g_build) meta_check(t, op, a, argn, m.rc, rb, dirfd, path, flags, mask);
    if (m.rc < 0) { errno = -m.rc; return -1; }
    memcpy(buf, rb, sz);
    return 0;
}

#define STATAT(dirfd, path, buf, flags) meta_call(OP_FSTATAT, dirfd, path, buf, flags, 0)

EXPORT int fstatat(int dirfd, const char *path, struct stat *st, int flags) { return STATAT(dirfd, path, st, flags); }
EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags) { return STATAT(dirfd, path, st, flags); }
EXPORT int stat(const char *path, struct stat *st) { return STATAT(AT_FDCWD, path, st, 0); }
EXPORT int stat64(const char *path, struct stat64 *st) { return STATAT(AT_FDCWD, path, st, 0); }
EXPORT int lstat(const char *path, struct stat *st) { return STATAT(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW); }
EXPORT int lstat64(const char *path, struct stat64 *st) { return STATAT(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW); }
EXPORT int fstat(int fd, struct stat *st) { return STATAT(fd, "", st, AT_EMPTY_PATH); }
EXPORT int fstat64(int fd, struct stat64 *st) { return STATAT(fd, "", st, AT_EMPTY_PATH); }
/* the pre-2.33 names (binaries built against an older glibc); on x86_64 every version
 * number means the kernel's struct stat */
EXPORT int __xstat(int ver, const char *path, struct stat *st) { (void)ver; return stat(path, st); }
EXPORT int __xstat64(int ver, const char *path, struct stat64 *st) { (void)ver; return stat64(path, st); }
EXPORT int __lxstat(int ver, const char *path, struct stat *st) { (void)ver; return lstat(path, st); }
EXPORT int __lxstat64(int ver, const char *path, struct stat64 *st) { (void)ver; return lstat64(path, st); }
EXPORT int __fxstat(int ver, int fd, struct stat *st) { (void)ver; return fstat(fd, st); }
EXPORT int __fxstat64(int ver, int fd, struct stat64 *st) { (void)ver; return fstat64(fd, st); }
EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags) {
    (void)ver;
    return fstatat(dirfd, path, st, flags);
}
EXPORT int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags) {
    (void)ver;
    return fstatat64(dirfd, path, st, flags);
}
EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *stx) {
    return meta_call(OP_STATX, dirfd, path, stx, flags, mask);
}
