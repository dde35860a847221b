/* rename, renameat, renameat2: whether a rename crossed file systems is taped (io op 8,
 * since protocol 7), so a program that copies when it gets EXDEV (pip, go build, shutil.move)
 * takes the same way at replay. A sealed replay puts /tmp and the workspace on two
 * overlays: a rename between them fails with EXDEV where the recorded one succeeded, and
 * the shim then moves the file or tree itself (copy, then remove), as the kernel did in
 * one step. A recorded EXDEV is given back without trying. */

typedef struct { int32_t result; } renamerec_t;
_Static_assert(sizeof(renamerec_t) == 4, "OP_IO_RENAME payload: i32 result");

#define MOVE_DEPTH 64

static long move_at(int ofd, const char *old, int nfd, const char *new_, int depth);

/* The copy takes the original's mode and times; both ends are closed. */
static void move_done(long from, long to, const struct stat *st) {
    RS2(SYS_fchmod, to, st->st_mode & 07777);
    struct timespec ts[2] = {st->st_atim, st->st_mtim};
    RS4(SYS_utimensat, to, NULL, ts, 0);
    RS1(SYS_close, from);
    RS1(SYS_close, to);
}

static long move_file(int ofd, const char *old, int nfd, const char *new_,
                      const struct stat *st) {
    long in = RS4(SYS_openat, ofd, old, O_RDONLY | O_CLOEXEC, 0);
    if (is_err(in)) return in;
    long out = RS4(SYS_openat, nfd, new_, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                   st->st_mode & 07777);
    if (is_err(out)) { RS1(SYS_close, in); return out; }
    char buf[65536];
    long r;
    while ((r = RS3(SYS_read, in, buf, sizeof buf)) > 0 || r == -EINTR) {
        for (long off = 0; r > 0 && off < r;) {
            long w = RS3(SYS_write, out, buf + off, r - off);
            if (w == -EINTR) continue;
            if (is_err(w)) { r = w; break; }
            off += w;
        }
        if (is_err(r)) break;
    }
    move_done(in, out, st);
    if (is_err(r)) return r;
    return RS3(SYS_unlinkat, ofd, old, 0);
}

static long move_dir(int ofd, const char *old, int nfd, const char *new_,
                     const struct stat *st, int depth) {
    if (depth > MOVE_DEPTH) return -EXDEV;
    long r = RS3(SYS_mkdirat, nfd, new_, 0700);
    if (r == -EEXIST) { /* rename replaces an empty directory */
        r = RS3(SYS_unlinkat, nfd, new_, AT_REMOVEDIR);
        if (!is_err(r)) r = RS3(SYS_mkdirat, nfd, new_, 0700);
    }
    if (is_err(r)) return r;
    long from = RS4(SYS_openat, ofd, old, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    long to = RS4(SYS_openat, nfd, new_, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (is_err(from) || is_err(to)) {
        if (!is_err(from)) RS1(SYS_close, from);
        if (!is_err(to)) RS1(SYS_close, to);
        return is_err(from) ? from : to;
    }
    char buf[4096];
    long n;
    r = 0;
    while (!is_err(r) && (n = RS3(SYS_getdents64, from, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n && !is_err(r);) {
            struct { uint64_t ino; int64_t off; unsigned short reclen; unsigned char type;
                     char name[]; } *d = (void *)(buf + off);
            off += d->reclen;
            if (!strcmp(d->name, ".") || !strcmp(d->name, "..")) continue;
            r = move_at((int)from, d->name, (int)to, d->name, depth + 1);
        }
    }
    move_done(from, to, st);
    if (is_err(r)) return r;
    return RS3(SYS_unlinkat, ofd, old, AT_REMOVEDIR);
}

static long move_at(int ofd, const char *old, int nfd, const char *new_, int depth) {
    struct stat st;
    long r = RS4(SYS_newfstatat, ofd, old, &st, AT_SYMLINK_NOFOLLOW);
    if (is_err(r)) return r;
    if (S_ISREG(st.st_mode)) return move_file(ofd, old, nfd, new_, &st);
    if (S_ISDIR(st.st_mode)) return move_dir(ofd, old, nfd, new_, &st, depth);
    if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        long k = RS4(SYS_readlinkat, ofd, old, target, sizeof target - 1);
        if (is_err(k)) return k;
        target[k] = 0;
        RS3(SYS_unlinkat, nfd, new_, 0);
        r = RS3(SYS_symlinkat, target, nfd, new_);
        return is_err(r) ? r : RS3(SYS_unlinkat, ofd, old, 0);
    }
    return -EXDEV; /* a fifo, a socket, a device: not moved by hand */
}

static long rename_live(int ofd, const char *old, int nfd, const char *new_, unsigned flags) {
    return flags ? rsys(SYS_renameat2, ofd, (long)old, nfd, (long)new_, flags, 0)
                 : RS4(SYS_renameat, ofd, old, nfd, new_);
}

static int rename_taped(int ofd, const char *old, int nfd, const char *new_,
                        unsigned flags) {
    if (!ACTIVE() || !SINCE(7)) return (int)sys_ret(rename_live(ofd, old, nfd, new_, flags));
    tls_t *t = me();
    served_t s;
    renamerec_t rec_;
    long live;
    switch (tape_step(t, CH_IO, OP_IO_RENAME, NULL, 0, &s)) {
    case STEP_RECORD:
        live = rename_live(ofd, old, nfd, new_, flags);
        rec_.result = live == -EXDEV ? -EXDEV : 0;
        rec(t, CH_IO, OP_IO_RENAME, &rec_, sizeof rec_);
        return (int)sys_ret(live);
    case STEP_LIVE:
        return (int)sys_ret(rename_live(ofd, old, nfd, new_, flags));
    case STEP_SERVED:
        break;
    }
    rec_.result = 0;
    if (s.n >= sizeof rec_) memcpy(&rec_, s.p, sizeof rec_);
    if (rec_.result == -EXDEV) return (int)sys_ret(-EXDEV); /* the program copies, as then */
    live = rename_live(ofd, old, nfd, new_, flags);
    if (live == -EXDEV && !(flags & RENAME_EXCHANGE)) live = move_at(ofd, old, nfd, new_, 0);
    return (int)sys_ret(live);
}

EXPORT int rename(const char *old, const char *new_) {
    return rename_taped(AT_FDCWD, old, AT_FDCWD, new_, 0);
}
EXPORT int renameat(int ofd, const char *old, int nfd, const char *new_) {
    return rename_taped(ofd, old, nfd, new_, 0);
}
EXPORT int renameat2(int ofd, const char *old, int nfd, const char *new_, unsigned flags) {
    return rename_taped(ofd, old, nfd, new_, flags);
}
