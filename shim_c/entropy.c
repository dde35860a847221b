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
    served_t s;
    step_t step = tape_step(t, CH_ENTROPY, op, args, argn, &s);
    if (step == STEP_SERVED) {
        int32_t rc;
        memcpy(&rc, s.p + argn, 4);
        uint32_t hdr = gr ? sizeof(randrec_t) : sizeof(entrec_t);
        if (rc < 0) { errno = -rc; return -1; }
        uint32_t give = op == OP_GETENTROPY ? size : (uint32_t)rc;
        if (give > s.n - hdr) give = s.n - hdr;
        memcpy(buf, s.p + hdr, give);
        return op == OP_GETENTROPY ? 0 : rc;
    }
    long r;
    if (op == OP_RANDOM_READ) r = RS3(SYS_read, fd, buf, size);
    else r = RS3(SYS_getrandom, buf, size, op == OP_GETENTROPY ? 0 : flags);
    if (op == OP_GETENTROPY && r >= 0 && (uint32_t)r != size) r = -EIO;
    if (step == STEP_RECORD) {
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
