/* Channel entropy: getrandom, getentropy, arc4random*, and read() of an fd open on
 * /dev/urandom or /dev/random (open* and fopen* mark such fds). */

#define ECHUNK 32768 /* bigger requests are split, identically in both modes */

/* Payload heads; the bytes follow. The arguments are the fields before rc. */
typedef struct { uint32_t size, flags; int32_t rc; uint32_t zero; } randrec_t; /* getrandom */
typedef struct { uint32_t size; int32_t rc; } entrec_t; /* getentropy, read(/dev/urandom) */
_Static_assert(sizeof(randrec_t) == 16 && offsetof(randrec_t, rc) == 8,
               "OP_GETRANDOM payload: u32 size | u32 flags | i32 rc | u32 0 | bytes[rc]");
_Static_assert(sizeof(entrec_t) == 8 && offsetof(entrec_t, rc) == 4,
               "OP_GETENTROPY / OP_RANDOM_READ payload: u32 size | i32 rc | bytes");

static ssize_t entropy_chunk(uint16_t site, int op, void *buf, uint32_t size, uint32_t flags,
                             int fd) {
    tls_t *t = me();
    t->site = site;
    uint32_t args[2] = {size, flags};
    int gr = op == OP_GETRANDOM || op == OP_GETRANDOM_RAW;
    uint32_t argn = gr ? 8 : 4;
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_ENTROPY, op, args, argn, &n);
        if (p) {
            int32_t rc;
            memcpy(&rc, p + argn, 4);
            uint32_t hdr = gr ? sizeof(randrec_t) : sizeof(entrec_t);
            if (rc < 0) { errno = -rc; return -1; }
            uint32_t give = op == OP_GETENTROPY ? size : (uint32_t)rc;
            if (give > n - hdr) give = n - hdr;
            memcpy(buf, p + hdr, give);
            return op == OP_GETENTROPY ? 0 : rc;
        }
    }
    long r;
    if (op == OP_RANDOM_READ) r = RS3(SYS_read, fd, buf, size);
    else r = RS3(SYS_getrandom, buf, size, op == OP_GETENTROPY ? 0 : flags);
    if (op == OP_GETENTROPY && r >= 0 && (uint32_t)r != size) r = -EIO;
    if (g_mode == MODE_RECORD) {
        int32_t rc = is_err(r) ? (int32_t)r : (op == OP_GETENTROPY ? 0 : (int32_t)r);
        uint32_t data = is_err(r) ? 0 : (uint32_t)r;
        randrec_t h = {size, flags, rc, 0};
        entrec_t e = {size, rc};
        if (gr) rec2(t, CH_ENTROPY, op, &h, sizeof h, buf, data);
        else rec2(t, CH_ENTROPY, op, &e, sizeof e, buf, data);
    }
    if (is_err(r)) { errno = (int)-r; return -1; }
    return op == OP_GETENTROPY ? 0 : r;
}

static ssize_t entropy(uint16_t site, int op, void *buf, size_t size, uint32_t flags, int fd) {
    if (size <= ECHUNK) return entropy_chunk(site, op, buf, (uint32_t)size, flags, fd);
    size_t done = 0;
    while (done < size) {
        size_t n = size - done > ECHUNK ? ECHUNK : size - done;
        ssize_t r = entropy_chunk(site, op, (char *)buf + done, (uint32_t)n, flags, fd);
        if (r < 0) return done ? (ssize_t)done : -1;
        if (op == OP_GETENTROPY) r = (ssize_t)n;
        if (r == 0) break;
        done += (size_t)r;
        if ((size_t)r < n) break;
    }
    return op == OP_GETENTROPY ? 0 : (ssize_t)done;
}

EXPORT ssize_t getrandom(void *buf, size_t n, unsigned int flags) {
    if (!ACTIVE()) {
        long r = RS3(SYS_getrandom, buf, n, flags);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return r;
    }
    return entropy(CALL_SITE(), OP_GETRANDOM, buf, n, flags, -1);
}

/* getentropy calls made while paused under record: OpenSSL seeding its generator inside
 * work replay does not repeat (a tool's body, a real network call). Replay seeds it at
 * the same point instead, off the tape (steno_paused_seeds, interpose/pytape.py). */
static uint32_t g_paused_seeds;

EXPORT unsigned steno_paused_seeds(void) {
    return __atomic_load_n(&g_paused_seeds, __ATOMIC_RELAXED);
}

EXPORT int getentropy(void *buf, size_t n) {
    if (n > 256) { errno = EIO; return -1; }
    if (!ACTIVE()) {
        if (g_mode == MODE_RECORD && T.guard)
            __atomic_fetch_add(&g_paused_seeds, 1, __ATOMIC_RELAXED);
        long r = RS3(SYS_getrandom, buf, n, 0);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return 0;
    }
    return (int)entropy(CALL_SITE(), OP_GETENTROPY, buf, n, 0, -1);
}

EXPORT void arc4random_buf(void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = getrandom((char *)buf + done, n - done, 0);
        if (r > 0) done += (size_t)r;
    }
}
EXPORT uint32_t arc4random(void) { uint32_t v; arc4random_buf(&v, sizeof v); return v; }
EXPORT uint32_t arc4random_uniform(uint32_t upper) {
    if (upper < 2) return 0;
    uint32_t min = -upper % upper, r;
    do r = arc4random(); while (r < min);
    return r % upper;
}

/* fds open on /dev/urandom or /dev/random */
static uint64_t g_rfd[16];

static inline int rfd_is(int fd) {
    return (unsigned)fd < 1024 && (__atomic_load_n(&g_rfd[fd >> 6], __ATOMIC_RELAXED) >> (fd & 63) & 1);
}
static inline void rfd_set(int fd, int on) {
    if ((unsigned)fd >= 1024) return;
    if (on) __atomic_fetch_or(&g_rfd[fd >> 6], 1ULL << (fd & 63), __ATOMIC_RELAXED);
    else __atomic_fetch_and(&g_rfd[fd >> 6], ~(1ULL << (fd & 63)), __ATOMIC_RELAXED);
}

/* the kernel's random uuid and boot id files are entropy too (uuidgen falls back on
 * the first; `cat /proc/sys/kernel/random/uuid` is how shell scripts make ids) */
static int is_random_path(const char *p) {
    static const char kr[] = "/proc/sys/kernel/random/";
    if (!p) return 0;
    if (starts(p, "/dev/")) return !strcmp(p + 5, "urandom") || !strcmp(p + 5, "random");
    return starts(p, kr) && (!strcmp(p + sizeof kr - 1, "uuid") || !strcmp(p + sizeof kr - 1, "boot_id"));
}

static int open_common(int dirfd, const char *path, int flags, mode_t mode) {
    long fd = RS4(SYS_openat, dirfd, path, flags, mode);
    if (is_err(fd)) { errno = (int)-fd; return -1; }
    if (g_mode && is_random_path(path)) rfd_set((int)fd, 1);
    else if (g_mode) rfd_set((int)fd, 0);
    return (int)fd;
}

#define OPEN_MODE(flags) \
    mode_t mode = 0; \
    if ((flags) & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }

EXPORT int open(const char *path, int flags, ...) { OPEN_MODE(flags); return open_common(AT_FDCWD, path, flags, mode); }
EXPORT int open64(const char *path, int flags, ...) { OPEN_MODE(flags); return open_common(AT_FDCWD, path, flags, mode); }
EXPORT int openat(int d, const char *path, int flags, ...) { OPEN_MODE(flags); return open_common(d, path, flags, mode); }
EXPORT int openat64(int d, const char *path, int flags, ...) { OPEN_MODE(flags); return open_common(d, path, flags, mode); }
EXPORT int __open_2(const char *path, int flags) { return open_common(AT_FDCWD, path, flags, 0); }
EXPORT int __open64_2(const char *path, int flags) { return open_common(AT_FDCWD, path, flags, 0); }
EXPORT int __openat_2(int d, const char *path, int flags) { return open_common(d, path, flags, 0); }
EXPORT int __openat64_2(int d, const char *path, int flags) { return open_common(d, path, flags, 0); }

static ssize_t cookie_read(void *c, char *buf, size_t n) {
    return read((int)(intptr_t)c, buf, n);
}
static int cookie_close(void *c) { return close((int)(intptr_t)c); }

static FILE *fopen_random(const char *path, const char *mode) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    cookie_io_functions_t io = {cookie_read, NULL, NULL, cookie_close};
    FILE *f = fopencookie((void *)(intptr_t)fd, mode, io);
    if (!f) close(fd);
    return f;
}

EXPORT FILE *fopen(const char *path, const char *mode) {
    RESOLVE(fopen);
    if (g_mode && is_random_path(path) && mode && mode[0] == 'r' && !strchr(mode, '+'))
        return fopen_random(path, mode);
    return real_fopen(path, mode);
}
EXPORT FILE *fopen64(const char *path, const char *mode) {
    RESOLVE(fopen64);
    if (g_mode && is_random_path(path) && mode && mode[0] == 'r' && !strchr(mode, '+'))
        return fopen_random(path, mode);
    return real_fopen64(path, mode);
}

/* glibc's mkstemp family draws its names from a getrandom inside libc, which no wrapper
 * sees (and a syscall instruction in libc's text, which a filter cannot trap safely: it
 * outlives exec). So while taped these make the names themselves, from getrandom()
 * (taped): git's probe files, a C tool's scratch file get their recorded names. The
 * shape is glibc's: six trailing X's (before `suffix` bytes), 62 letters, EEXIST draws
 * again. */
enum { TMP_FILE, TMP_DIR, TMP_NAME };

static int tempname(char *tmpl, int suffix, int flags, int kind) {
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t len = tmpl ? strlen(tmpl) : 0;
    if (suffix < 0 || len < 6 + (size_t)suffix || strspn(tmpl + len - 6 - suffix, "X") < 6) {
        errno = EINVAL;
        return -1;
    }
    char *x = tmpl + len - 6 - suffix;
    for (int tries = 0; tries < 62 * 62 * 62; tries++) {
        unsigned char r[6];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return -1;
        for (int i = 0; i < 6; i++) x[i] = abc[r[i] % 62];
        if (kind == TMP_FILE) {
            int fd = open_common(AT_FDCWD, tmpl, (flags & ~O_ACCMODE) | O_RDWR | O_CREAT | O_EXCL,
                                 0600);
            if (fd >= 0 || errno != EEXIST) return fd;
            continue;
        }
        struct stat st;
        long e = kind == TMP_DIR ? RS3(SYS_mkdirat, AT_FDCWD, tmpl, 0700)
                                 : RS4(SYS_newfstatat, AT_FDCWD, tmpl, &st, AT_SYMLINK_NOFOLLOW);
        if (kind == TMP_NAME) e = e == -ENOENT ? 0 : is_err(e) ? e : -EEXIST;
        if (e != -EEXIST) {
            if (!is_err(e)) return 0;
            errno = (int)-e;
            return -1;
        }
    }
    errno = EEXIST;
    return -1;
}

EXPORT int mkostemps(char *t, int suffix, int flags) {
    RESOLVE(mkostemps);
    return ACTIVE() ? tempname(t, suffix, flags, TMP_FILE) : real_mkostemps(t, suffix, flags);
}
EXPORT int mkstemp(char *t) { return mkostemps(t, 0, 0); }
EXPORT int mkstemp64(char *t) { return mkostemps(t, 0, 0); }
EXPORT int mkostemp(char *t, int flags) { return mkostemps(t, 0, flags); }
EXPORT int mkostemp64(char *t, int flags) { return mkostemps(t, 0, flags); }
EXPORT int mkstemps(char *t, int suffix) { return mkostemps(t, suffix, 0); }
EXPORT int mkstemps64(char *t, int suffix) { return mkostemps(t, suffix, 0); }
EXPORT int mkostemps64(char *t, int suffix, int flags) { return mkostemps(t, suffix, flags); }

EXPORT char *mkdtemp(char *t) {
    RESOLVE(mkdtemp);
    if (!ACTIVE()) return real_mkdtemp(t);
    return tempname(t, 0, 0, TMP_DIR) == 0 ? t : NULL;
}

EXPORT char *mktemp(char *t) {
    RESOLVE(mktemp);
    if (!ACTIVE()) return real_mktemp(t);
    if (tempname(t, 0, 0, TMP_NAME) < 0 && t) t[0] = 0;
    return t;
}
