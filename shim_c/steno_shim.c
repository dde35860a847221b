/* stenograph LD_PRELOAD shim: records (or serves back) what a process reads from the
 * world -- clocks, entropy, directory listings, identity, timed-wait outcomes.
 *
 * Rules this file keeps, and why:
 *  - Hot paths (clock reads, getrandom, readdir, getpid) use no malloc, no stdio and no
 *    lock shared between threads: every thread appends to its own buffer. A wrapper that
 *    calls back into libc deadlocks in forked children and recurses at start-up (rr's
 *    syscallbuf and libfaketime's issue tracker both document it).
 *  - Kernel calls the shim makes for itself are raw `syscall` instructions, so they are
 *    never intercepted by this very library.
 *  - The shim's own memory lives in a private address range (MAP_FIXED_NOREPLACE hints
 *    far below the mmap base), so recording and replaying leave the program's own heap
 *    and mmap layout identical: with ASLR off, id() and default reprs repeat.
 *  - STENO_* variables are removed from `environ` at start-up and re-added only in the
 *    environments of exec'd / spawned children: record and replay must look the same to
 *    the program.
 * Spec: docs/shim-protocol.md.
 */
#undef _FORTIFY_SOURCE
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <link.h>
#include <ucontext.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "steno_shim.h"

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

extern char **environ;

/* ------------------------------------------------------------------ raw syscalls */

static inline long rsys(long n, long a, long b, long c, long d, long e, long f) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
#define RS0(n) rsys((n), 0, 0, 0, 0, 0, 0)
#define RS1(n, a) rsys((n), (long)(a), 0, 0, 0, 0, 0)
#define RS2(n, a, b) rsys((n), (long)(a), (long)(b), 0, 0, 0, 0)
#define RS3(n, a, b, c) rsys((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define RS4(n, a, b, c, d) rsys((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define RS6(n, a, b, c, d, e, f) \
    rsys((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

static inline int is_err(long r) { return (unsigned long)r > -4096UL; }

static void die(int status) {
    for (;;) RS1(SYS_exit_group, status);
}

/* ------------------------------------------------------------------ global state */

enum { MODE_OFF = 0, MODE_RECORD = 1, MODE_REPLAY = 2 };

static int g_mode;
static int g_inited;
static int g_lenient;
static char g_proc[256];
static uint16_t g_proclen;
static char g_sockpath[108];
static char g_tape[1024];
static char g_shim[1024];
static uint32_t g_tnext = 1;  /* next thread index to hand out */
static uint32_t g_cnext;      /* children spawned so far by this process */
static int g_sock = -1;
static unsigned long g_sock_ino;
static int g_final;           /* past the exit flush: ship every record at once */
static int g_barrier_lock;
static int g_reports;
static int g_nonet;
static int g_drift = 1; /* STENO_DRIFT=0: replay does not read live directories to check drift */
/* Seccomp filters already on this process tree (inherited across fork and exec, never
 * removable): "n" once the network rule is in, "t<lo>-<hi>" per trapped text range.
 * Travels to exec'd / spawned children as STENO_FILT. */
static char g_filt[512];
static pthread_key_t g_key;
/* CPython's PyGILState_Check, when the process is a CPython interpreter (resolved once at
 * start-up with dlsym(RTLD_DEFAULT); NULL otherwise). See gil_free() below. */
static int (*g_py_gil_check)(void);
static void *volatile g_null;
/* Every other STENO_* variable (Python hook settings, redaction rules...), saved at
 * start-up: hidden from the program like the rest, but handed to children and to the
 * Python hooks through steno_getenv(). */
static char g_extra[8192];
static size_t g_extra_len; /* compared against nonnull-declared arguments */

static const char *const CH_NAMES[NCH] = {"?", "clock", "entropy", "dirents", "identity", "wait",
                                          "io"};

/* ------------------------------------------------------------------ real functions */

#define REAL_DECL(ret, name, args) static ret(*real_##name) args
REAL_DECL(int, clock_gettime, (clockid_t, struct timespec *));
REAL_DECL(int, gettimeofday, (struct timeval *, void *));
REAL_DECL(time_t, time, (time_t *));
REAL_DECL(int, timespec_get, (struct timespec *, int));
REAL_DECL(clock_t, clock, (void));
REAL_DECL(ssize_t, read, (int, void *, size_t));
REAL_DECL(int, close, (int));
REAL_DECL(DIR *, opendir, (const char *));
REAL_DECL(DIR *, fdopendir, (int));
REAL_DECL(struct dirent64 *, readdir64, (DIR *));
REAL_DECL(struct dirent *, readdir, (DIR *));
REAL_DECL(void, rewinddir, (DIR *));
REAL_DECL(int, closedir, (DIR *));
REAL_DECL(int, gethostname, (char *, size_t));
REAL_DECL(int, uname, (struct utsname *));
REAL_DECL(int, poll, (struct pollfd *, nfds_t, int));
REAL_DECL(int, select, (int, fd_set *, fd_set *, fd_set *, struct timeval *));
REAL_DECL(int, epoll_wait, (int, struct epoll_event *, int, int));
REAL_DECL(int, epoll_pwait, (int, struct epoll_event *, int, int, const sigset_t *));
REAL_DECL(pid_t, fork, (void));
REAL_DECL(int, execve, (const char *, char *const[], char *const[]));
REAL_DECL(int, execvpe, (const char *, char *const[], char *const[]));
REAL_DECL(int, posix_spawn, (pid_t *, const char *, const posix_spawn_file_actions_t *,
                             const posix_spawnattr_t *, char *const[], char *const[]));
REAL_DECL(int, posix_spawnp, (pid_t *, const char *, const posix_spawn_file_actions_t *,
                              const posix_spawnattr_t *, char *const[], char *const[]));
REAL_DECL(int, system, (const char *));
REAL_DECL(FILE *, popen, (const char *, const char *));
REAL_DECL(int, pthread_create, (pthread_t *, const pthread_attr_t *, void *(*)(void *), void *));
REAL_DECL(FILE *, fopen, (const char *, const char *));
REAL_DECL(FILE *, fopen64, (const char *, const char *));
REAL_DECL(void, _exit, (int)) __attribute__((noreturn));

#define RESOLVE(name) \
    do { \
        if (!real_##name) real_##name = (__typeof__(real_##name))dlsym(RTLD_NEXT, #name); \
    } while (0)

static void resolve_all(void) {
    RESOLVE(clock_gettime); RESOLVE(gettimeofday); RESOLVE(time); RESOLVE(timespec_get);
    RESOLVE(clock); RESOLVE(read); RESOLVE(close); RESOLVE(opendir); RESOLVE(fdopendir);
    RESOLVE(readdir64); RESOLVE(readdir); RESOLVE(rewinddir); RESOLVE(closedir);
    RESOLVE(gethostname); RESOLVE(uname); RESOLVE(poll); RESOLVE(select);
    RESOLVE(epoll_wait); RESOLVE(epoll_pwait); RESOLVE(fork); RESOLVE(execve);
    RESOLVE(execvpe); RESOLVE(posix_spawn); RESOLVE(posix_spawnp); RESOLVE(system);
    RESOLVE(popen); RESOLVE(pthread_create); RESOLVE(fopen); RESOLVE(fopen64); RESOLVE(_exit);
}

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

static void spin_lock(int *l) {
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) RS0(SYS_sched_yield);
}
static void spin_unlock(int *l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }

/* ------------------------------------------------------------------ per-thread state */

#define MAXT 1024
#define BUFCAP (124 * 1024) /* one message; well under the send buffer an unprivileged process gets */

typedef struct tbuf {
    int used;
    int lock;
    uint32_t tindex;
    uint32_t len;
    unsigned char data[BUFCAP];
} tbuf_t;

static tbuf_t *g_slots[MAXT];

typedef struct {
    const unsigned char *base;
    size_t size, off;
    uint32_t pos;
    int mapped;
} stream_t;

typedef struct {
    int init;
    int guard;
    uint32_t tindex;
    tbuf_t *tb;
    stream_t st[NCH];
    unsigned char *spare[2]; /* listing blocks kept for reuse: no mmap/munmap/faults per listing */
} tls_t;

static __thread tls_t T __attribute__((tls_model("initial-exec")));

static void thread_init(void) {
    T.tindex = __atomic_fetch_add(&g_tnext, 1, __ATOMIC_RELAXED);
    T.init = 1;
    if (g_inited) pthread_setspecific(g_key, (void *)1);
}

static inline tls_t *me(void) {
    if (UNLIKELY(!T.init)) thread_init();
    return &T;
}

/* ------------------------------------------------------------------ record: shipping */

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
    if (is_err(RS3(SYS_connect, fd, &sa, sizeof sa))) { RS1(SYS_close, fd); return 0; }
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
    return 1;
}

static void ship(uint16_t type, uint32_t tindex, const void *body, size_t n) {
    if (!sock_connect()) return;
    unsigned char hdr[14 + 256];
    memcpy(hdr, "STP1", 4);
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
    long r;
    do r = RS3(SYS_sendmsg, g_sock, &mh, MSG_NOSIGNAL); while (r == -EINTR);
}

/* Called with b->lock held. */
static void ship_buf(tbuf_t *b) {
    if (b->len) {
        ship(MSG_DATA, b->tindex, b->data, b->len);
        b->len = 0;
    }
}

static void flush_all(void) {
    for (int i = 0; i < MAXT; i++) {
        tbuf_t *b = g_slots[i];
        if (!b) break;
        if (!__atomic_load_n(&b->used, __ATOMIC_ACQUIRE) && !b->len) continue;
        spin_lock(&b->lock);
        ship_buf(b);
        spin_unlock(&b->lock);
    }
}

/* Send a barrier (or exit) message and wait for the recorder's one-byte ack. */
static void barrier(uint16_t type) {
    spin_lock(&g_barrier_lock);
    ship(type, me()->tindex, NULL, 0);
    if (g_sock >= 0) {
        char ack;
        long r;
        do r = RS3(SYS_read, g_sock, &ack, 1); while (r == -EINTR);
    }
    spin_unlock(&g_barrier_lock);
}

static tbuf_t *claim_buf(uint32_t tindex) {
    for (int i = 0; i < MAXT; i++) {
        tbuf_t *b = g_slots[i];
        if (!b) {
            tbuf_t *nb = shim_map(sizeof(tbuf_t), -1);
            if (!nb) return NULL;
            nb->used = 1;
            nb->tindex = tindex;
            tbuf_t *expect = NULL;
            if (__atomic_compare_exchange_n(&g_slots[i], &expect, nb, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                return nb;
            shim_unmap(nb, sizeof(tbuf_t));
            b = expect;
        }
        int zero = 0;
        if (!b->len && __atomic_compare_exchange_n(&b->used, &zero, 1, 0, __ATOMIC_ACQ_REL,
                                                   __ATOMIC_ACQUIRE)) {
            spin_lock(&b->lock);
            ship_buf(b); /* a late record of a previous owner */
            b->tindex = tindex;
            spin_unlock(&b->lock);
            return b;
        }
    }
    return NULL;
}

/* Append one record to this thread's buffer: u8 channel | u8 op | u16 flags | u32 len. */
static void rec2(tls_t *t, int ch, int op, const void *p1, uint32_t n1, const void *p2,
                 uint32_t n2) {
    tbuf_t *b = t->tb;
    if (UNLIKELY(!b)) {
        b = t->tb = claim_buf(t->tindex);
        if (!b) return;
    }
    uint32_t n = n1 + n2, need = 8 + n;
    spin_lock(&b->lock);
    if (UNLIKELY(b->len + need > BUFCAP)) ship_buf(b);
    if (UNLIKELY(need > BUFCAP)) { /* oversized (a big listing): its own message */
        unsigned char *big = shim_map(need, -1);
        if (big) {
            big[0] = (unsigned char)ch; big[1] = (unsigned char)op; big[2] = big[3] = 0;
            memcpy(big + 4, &n, 4);
            memcpy(big + 8, p1, n1);
            if (n2) memcpy(big + 8 + n1, p2, n2);
            ship(MSG_DATA, b->tindex, big, need);
            shim_unmap(big, need);
        }
        spin_unlock(&b->lock);
        return;
    }
    unsigned char *w = b->data + b->len;
    w[0] = (unsigned char)ch;
    w[1] = (unsigned char)op;
    w[2] = w[3] = 0;
    memcpy(w + 4, &n, 4);
    memcpy(w + 8, p1, n1);
    if (n2) memcpy(w + 8 + n1, p2, n2);
    b->len += need;
    if (UNLIKELY(g_final)) ship_buf(b);
    spin_unlock(&b->lock);
}

static inline void rec(tls_t *t, int ch, int op, const void *p, uint32_t n) {
    rec2(t, ch, op, p, n, NULL, 0);
}

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
    s->size = s->off = 0;
    s->pos = 0;
    char path[1400];
    path_of_stream(path, sizeof path, t->tindex, ch);
    long fd = RS4(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (is_err(fd)) return;
    struct stat st;
    if (!is_err(RS2(SYS_fstat, fd, &st)) && st.st_size > 0) {
        void *m = shim_map((size_t)st.st_size, (int)fd);
        if (m) { s->base = m; s->size = (size_t)st.st_size; }
    }
    RS1(SYS_close, fd);
}

static const char *op_name(int ch, int op) {
    switch (ch * 16 + op) {
    case CH_CLOCK * 16 + OP_CLOCK_GETTIME: return "clock_gettime";
    case CH_CLOCK * 16 + OP_GETTIMEOFDAY: return "gettimeofday";
    case CH_CLOCK * 16 + OP_TIME: return "time";
    case CH_CLOCK * 16 + OP_TIMESPEC_GET: return "timespec_get";
    case CH_CLOCK * 16 + OP_CLOCK: return "clock";
    case CH_ENTROPY * 16 + OP_GETRANDOM: return "getrandom";
    case CH_ENTROPY * 16 + OP_GETENTROPY: return "getentropy";
    case CH_ENTROPY * 16 + OP_RANDOM_READ: return "read(/dev/urandom)";
    case CH_ENTROPY * 16 + OP_GETRANDOM_RAW: return "syscall-instruction(getrandom)";
    case CH_DIRENTS * 16 + OP_OPENDIR: return "opendir";
    case CH_IDENTITY * 16 + OP_GETPID: return "getpid";
    case CH_IDENTITY * 16 + OP_GETPPID: return "getppid";
    case CH_IDENTITY * 16 + OP_GETTID: return "gettid";
    case CH_IDENTITY * 16 + OP_GETHOSTNAME: return "gethostname";
    case CH_IDENTITY * 16 + OP_UNAME: return "uname";
    case CH_IDENTITY * 16 + OP_PROCINFO: return "procinfo";
    case CH_WAIT * 16 + OP_NANOSLEEP: return "nanosleep";
    case CH_WAIT * 16 + OP_CLOCK_NANOSLEEP: return "clock_nanosleep";
    case CH_WAIT * 16 + OP_SLEEP: return "sleep";
    case CH_WAIT * 16 + OP_USLEEP: return "usleep";
    case CH_WAIT * 16 + OP_POLL: return "poll";
    case CH_WAIT * 16 + OP_SELECT: return "select";
    case CH_WAIT * 16 + OP_EPOLL: return "epoll_wait";
    case CH_IO * 16 + OP_IO_READ: return "read(pipe)";
    case CH_IO * 16 + OP_IO_POLL: return "poll(pipes)";
    case CH_IO * 16 + OP_IO_WAIT: return "waitpid(WNOHANG)";
    }
    return "?";
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

static void append_report(const char *line, size_t n) {
    char path[1100];
    char *p = s_put(path, path + sizeof path - 1, g_tape);
    p = s_put(p, path + sizeof path - 1, "/divergence");
    *p = 0;
    long fd = RS4(SYS_openat, AT_FDCWD, path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (is_err(fd)) return;
    RS3(SYS_write, fd, line, n);
    RS1(SYS_close, fd);
}

static void report(const char *kind, tls_t *t, int ch, const unsigned char *rh, int op,
                   const void *args, uint32_t argn) {
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
        if (rh[0] != ch) p = s_put(p, end, "other-channel");
        else p = describe(p, end, rh[0], rh[1], rh + 8, an);
    } else {
        p = s_put(p, end, "end-of-stream");
    }
    p = s_put(p, end, "\tasked=");
    p = describe(p, end, ch, op, args, argn);
    *p++ = '\n';
    if (g_reports++ < 500) append_report(line, (size_t)(p - line));
}

/* Next record of (thread, ch) if it is op with these argument bytes; else report the
 * divergence and exit 86 (or return NULL under STENO_LENIENT, leaving the stream where
 * it is so a later call may line up again). *plen receives the payload length. */
static const unsigned char *serve(tls_t *t, int ch, int op, const void *args, uint32_t argn,
                                  uint32_t *plen) {
    stream_t *s = &t->st[ch];
    if (UNLIKELY(!s->mapped)) map_stream(t, ch);
    const unsigned char *rh = NULL;
    if (LIKELY(s->off + 8 <= s->size)) {
        rh = s->base + s->off;
        uint32_t n;
        memcpy(&n, rh + 4, 4);
        if (LIKELY(rh[0] == ch && rh[1] == op && n >= argn && s->off + 8 + n <= s->size &&
                   memcmp(rh + 8, args, argn) == 0)) {
            s->off += 8 + n;
            s->pos++;
            *plen = n;
            return rh + 8;
        }
    }
    report("divergence", t, ch, rh, op, args, argn);
    if (!g_lenient) die(DIVERGENCE_EXIT);
    return NULL;
}

/* ------------------------------------------------------------------ init */

static void copy_env(char *dst, size_t cap, const char *v) {
    size_t n = s_len(v);
    if (n >= cap) n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

static void thread_key_done(void *unused);
static void procinfo(void);

/* ------------------------------------------------------------------ seccomp
 *
 * Replay isolation: refuse new AF_INET/AF_INET6 sockets with EACCES, so a replay can never
 * reach a live model or tool (once per tree: filters are inherited across fork and exec).
 *
 * Raw getrandom: a `syscall` instruction for getrandom in the program's own code (inline
 * asm; libc's syscall() is wrapped below) bypasses every libc wrapper. In both modes the
 * shim traps it with SECCOMP_RET_TRAP when the instruction pointer lies in the main
 * executable's text, and serves it from the SIGSYS handler through the entropy stream
 * (op 4). Only the main executable is trapped: glibc itself calls getrandom raw (malloc's
 * tcache key) before this library's constructor has installed the handler, and a filter
 * outlives exec, when libraries move but the executable's text (ASLR off) stays put.
 * The shim's own raw syscalls are never in that range. Hand-written BPF, no libseccomp. */

static uintptr_t g_exe_lo, g_exe_hi;
static ssize_t entropy(int op, void *buf, size_t size, uint32_t flags, int fd);

static int exe_range_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size; (void)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (!g_exe_lo || lo < g_exe_lo) g_exe_lo = lo;
        if (hi > g_exe_hi) g_exe_hi = hi;
    }
    return 1; /* the first object is the main program */
}

static void sigsys_handler(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    ucontext_t *uc = ctx;
    greg_t *g = uc->uc_mcontext.gregs;
    int saved = errno;
    long ret = -ENOSYS;
    if (si->si_syscall == SYS_getrandom) {
        void *buf = (void *)g[REG_RDI];
        size_t n = (size_t)g[REG_RSI];
        unsigned flags = (unsigned)g[REG_RDX];
        if (g_mode && !T.guard) {
            ssize_t r = entropy(OP_GETRANDOM_RAW, buf, n, flags, -1);
            ret = r < 0 ? -errno : r;
        } else {
            ret = RS3(SYS_getrandom, buf, n, flags);
        }
    }
    g[REG_RAX] = ret;
    errno = saved;
}

static char *hex_put(char *p, char *end, uint64_t v) {
    char tmp[16]; int n = 0;
    do { tmp[n++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    while (n && p < end) *p++ = tmp[--n];
    return p;
}

static void install_filters(void) {
    int want_net = g_mode == MODE_REPLAY && g_nonet && !strchr(g_filt, 'n');
    char tag[48] = {0}, *tp = tag, *tend = tag + sizeof tag - 1;
    int want_trap = 0;
    dl_iterate_phdr(exe_range_cb, NULL);
    uint32_t hi32 = (uint32_t)(g_exe_lo >> 32);
    if (g_exe_lo && g_exe_hi > g_exe_lo && (uint32_t)((g_exe_hi - 1) >> 32) == hi32) {
        tp = s_put(tp, tend, "t"); tp = hex_put(tp, tend, g_exe_lo);
        tp = s_put(tp, tend, "-"); tp = hex_put(tp, tend, g_exe_hi);
        *tp = 0;
        want_trap = !strstr(g_filt, tag);
    }
    /* an inherited filter may trap this image's executable too: the handler goes in
     * whenever any trap rule is on the tree, before the filter */
    if (want_trap || strchr(g_filt, 't')) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = sigsys_handler;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSYS, &sa, NULL);
    }
    if (!want_net && !want_trap) return;
    uint32_t lo = (uint32_t)g_exe_lo, hi = (uint32_t)g_exe_hi;
    if ((uint32_t)((g_exe_hi) >> 32) != hi32) hi = 0xffffffffu;
    struct sock_filter f[] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        /* 2 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        /* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, want_trap ? SYS_getrandom : 0xffffffffu, 2, 0),
        /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, want_net ? SYS_socket : 0xffffffffu, 8, 0),
        /* 6 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 7: getrandom: trap if lo <= ip < hi (same upper half) */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer) + 4),
        /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, hi32, 0, 4),
        /* 9 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer)),
        /* 10 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, lo, 0, 2),
        /* 11 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, hi, 1, 0),
        /* 12 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        /* 13 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 14: socket(AF_INET / AF_INET6) -> EACCES */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        /* 15 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET, 2, 0),
        /* 16 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET6, 1, 0),
        /* 17 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 18 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EACCES & SECCOMP_RET_DATA)),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
    /* SPEC_ALLOW: by default the kernel turns on speculative-store-bypass mitigation for
     * a task under seccomp, which made every recorded clock read twice as slow; this
     * filter is a tape, not a security boundary. */
#ifndef SECCOMP_FILTER_FLAG_SPEC_ALLOW
#define SECCOMP_FILTER_FLAG_SPEC_ALLOW (1UL << 2)
#endif
    unsigned long fl = SECCOMP_FILTER_FLAG_SPEC_ALLOW;
    long r = RS3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, fl, &prog);
    if (r == -EINVAL) r = RS3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, fl = 0, &prog);
    if (r == -EACCES) { /* no CAP_SYS_ADMIN: a filter needs no_new_privs */
        RS4(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0);
        r = RS3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, fl, &prog);
    }
    if (is_err(r)) return;
    size_t at = s_len(g_filt);
    char *p = g_filt + at, *end = g_filt + sizeof g_filt - 1;
    if (want_net) p = s_put(p, end, "n");
    if (want_trap) p = s_put(p, end, tag);
    *p = 0;
}

__attribute__((constructor)) static void shim_init(void) {
    if (g_inited) return;
    resolve_all();
    const char *mode = NULL, *sock = NULL, *tape = NULL, *proc = NULL, *shim = NULL,
               *next = NULL, *lenient = NULL;
    for (char **e = environ; e && *e; e++) {
        const char *v = *e;
        if (!starts(v, "STENO_")) continue;
        if (starts(v, "STENO_MODE=")) mode = v + 11;
        else if (starts(v, "STENO_SOCK=")) sock = v + 11;
        else if (starts(v, "STENO_TAPE=")) tape = v + 11;
        else if (starts(v, "STENO_PROC=")) proc = v + 11;
        else if (starts(v, "STENO_SHIM=")) shim = v + 11;
        else if (starts(v, "STENO_NEXT=")) next = v + 11;
        else if (starts(v, "STENO_LENIENT=")) lenient = v + 14;
        else if (starts(v, "STENO_NONET=")) g_nonet = v[12] == '1';
        else if (starts(v, "STENO_FILT=")) copy_env(g_filt, sizeof g_filt, v + 11);
        else if (starts(v, "STENO_DRIFT=")) g_drift = v[12] != '0';
        else {
            size_t n = s_len(v) + 1;
            if (g_extra_len + n < sizeof g_extra) {
                memcpy(g_extra + g_extra_len, v, n);
                g_extra_len += n;
            }
        }
    }
    int m = MODE_OFF;
    if (mode && mode[0] == 'r' && mode[2] == 'c') m = MODE_RECORD;
    else if (mode && mode[0] == 'r' && mode[2] == 'p') m = MODE_REPLAY;
    if (m == MODE_RECORD && !sock) m = MODE_OFF;
    if (m == MODE_REPLAY && !tape) m = MODE_OFF;
    if (m != MODE_OFF) {
        copy_env(g_sockpath, sizeof g_sockpath, sock ? sock : "");
        copy_env(g_tape, sizeof g_tape, tape ? tape : "");
        copy_env(g_proc, sizeof g_proc, proc ? proc : "0");
        copy_env(g_shim, sizeof g_shim, shim ? shim : "");
        g_proclen = (uint16_t)s_len(g_proc);
        g_lenient = lenient && lenient[0] == '1';
        uint32_t tbase = 0, cnext = 0;
        if (next) {
            const char *p = next;
            while (*p >= '0' && *p <= '9') tbase = tbase * 10 + (uint32_t)(*p++ - '0');
            if (*p == ',') p++;
            while (*p >= '0' && *p <= '9') cnext = cnext * 10 + (uint32_t)(*p++ - '0');
        }
        T.tindex = tbase;
        T.init = 1;
        g_tnext = tbase + 1;
        g_cnext = cnext;
        /* hide STENO_* from the program: record and replay must look alike */
        char **w = environ;
        for (char **e = environ; e && *e; e++)
            if (!starts(*e, "STENO_")) *w++ = *e;
        if (w) *w = NULL;
        pthread_key_create(&g_key, thread_key_done);
        pthread_setspecific(g_key, (void *)1);
        g_py_gil_check = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Check");
    }
    g_mode = m;
    if (m != MODE_OFF) install_filters();
    g_inited = 1;
    if (m != MODE_OFF) procinfo();
}

static void final_flush(void) {
    if (g_mode != MODE_RECORD || g_final) return;
    T.guard++;
    flush_all();
    barrier(MSG_EXIT);
    g_final = 1;
    T.guard--;
}

__attribute__((destructor)) static void shim_fini(void) { final_flush(); }

#define DBLOCK (64u << 20) /* listing blocks: virtual, MAP_NORESERVE: only touched pages cost */

static void thread_key_done(void *unused) {
    (void)unused;
    for (int i = 0; i < 2; i++)
        if (T.spare[i]) { shim_unmap(T.spare[i], DBLOCK); T.spare[i] = NULL; }
    if (g_mode != MODE_RECORD || !T.tb) return;
    tbuf_t *b = T.tb;
    spin_lock(&b->lock);
    ship_buf(b);
    __atomic_store_n(&b->used, 0, __ATOMIC_RELEASE);
    spin_unlock(&b->lock);
    T.tb = NULL;
}

/* Fast gate: are we recording or replaying, and not inside the shim already? */
#define ACTIVE() (LIKELY(g_mode) && LIKELY(!T.guard))

/* In a CPython process, a thread that does not hold the GIL cannot run Python code, so a
 * clock it reads is incidental to the program's output: CPython reads CLOCK_MONOTONIC
 * without the GIL only to compute deadlines of its own waits (take_gil's 5 ms timed
 * condition wait, PyThread_acquire_lock_timed's semaphore deadline), and how many times
 * take_gil loops depends on the scheduler. Such reads are served live in both modes and
 * never taped, and the deadlines they produce are already in real time, so they are not
 * translated (translate_deadline). Timed waits themselves (time.sleep releases the GIL
 * around clock_nanosleep, whose deadline was computed with the GIL held), entropy,
 * listings and identity stay taped whoever calls them: their number is the program's.
 * PyGILState_Check reads runtime state and pthread_getspecific only: no lock, no
 * allocation; it answers 1 before the runtime is initialised and after it is finalised,
 * so start-up and shut-down reads of the main thread stay taped. */
static inline int gil_free(void) {
    return g_py_gil_check && !g_py_gil_check();
}
#define CLOCK_ACTIVE() (ACTIVE() && LIKELY(!gil_free()))

/* ------------------------------------------------------------------ clocks */

typedef struct { int32_t arg; int32_t rc; int64_t a; int64_t b; } clockrec_t;

/* The hot path of record mode: one fixed-size clock record appended to this thread's
 * buffer with constant-size copies the compiler inlines; anything unusual (no buffer
 * yet, buffer full, past the exit flush) takes the general path. */
static inline void rec_clock(tls_t *t, int op, const clockrec_t *r) {
    tbuf_t *b = t->tb;
    if (LIKELY(b != NULL) && LIKELY(!g_final)) {
        spin_lock(&b->lock);
        if (LIKELY(b->len + 8 + sizeof *r <= BUFCAP)) {
            unsigned char *w = b->data + b->len;
            uint32_t head = (uint32_t)CH_CLOCK | (uint32_t)op << 8, n = sizeof *r;
            memcpy(w, &head, 4);
            memcpy(w + 4, &n, 4);
            memcpy(w + 8, r, sizeof *r);
            b->len += 8 + sizeof *r;
            spin_unlock(&b->lock);
            return;
        }
        spin_unlock(&b->lock);
    }
    rec(t, CH_CLOCK, op, r, sizeof *r);
}

/* Last value served per clock id (replay). Absolute deadlines a program computes from
 * served clocks are in the recording's time; waits that libc times against the real
 * clock (condition variables, semaphores) get them translated, or they would expire at
 * once (or never) and change how often the program reads its clocks. */
static int64_t g_served_ns[16];

EXPORT int clock_gettime(clockid_t id, struct timespec *ts) {
    if (UNLIKELY(!real_clock_gettime)) RESOLVE(clock_gettime);
    if (!CLOCK_ACTIVE()) return real_clock_gettime(id, ts);
    tls_t *t = me();
    int32_t arg = (int32_t)id;
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_CLOCK, OP_CLOCK_GETTIME, &arg, 4, &n);
        if (LIKELY(p != NULL)) {
            clockrec_t r;
            memcpy(&r, p, sizeof r);
            if (r.rc) { errno = -r.rc; return -1; }
            ts->tv_sec = r.a;
            ts->tv_nsec = r.b;
            if ((unsigned)id < 16) g_served_ns[id] = r.a * 1000000000LL + r.b;
            return 0;
        }
        return real_clock_gettime(id, ts);
    }
    int rc = real_clock_gettime(id, ts);
    clockrec_t r = {arg, rc ? -errno : 0, rc ? 0 : ts->tv_sec, rc ? 0 : ts->tv_nsec};
    rec_clock(t, OP_CLOCK_GETTIME, &r);
    return rc;
}
EXPORT int __clock_gettime(clockid_t id, struct timespec *ts) { return clock_gettime(id, ts); }

/* Shared path for the clock ops that are not clock_gettime. */
static int clock_other(int op, int32_t arg, int64_t *a, int64_t *b, int *served) {
    tls_t *t = me();
    *served = 0;
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_CLOCK, op, &arg, 4, &n);
        if (p) {
            clockrec_t r;
            memcpy(&r, p, sizeof r);
            *a = r.a;
            *b = r.b;
            *served = 1;
            return r.rc;
        }
        return 0;
    }
    return 0;
}

static void clock_rec(int op, int32_t arg, int32_t rc, int64_t a, int64_t b) {
    clockrec_t r = {arg, rc, a, b};
    rec(me(), CH_CLOCK, op, &r, sizeof r);
}

EXPORT int gettimeofday(struct timeval *tv, void *tz) {
    RESOLVE(gettimeofday);
    if (!CLOCK_ACTIVE() || (void *)tv == g_null) return real_gettimeofday(tv, tz);
    int64_t a = 0, b = 0;
    int served;
    int rc = clock_other(OP_GETTIMEOFDAY, 0, &a, &b, &served);
    if (served) {
        if (tz) memset(tz, 0, sizeof(struct timezone));
        if (rc) { errno = -rc; return -1; }
        tv->tv_sec = a;
        tv->tv_usec = b;
        return 0;
    }
    int r = real_gettimeofday(tv, tz);
    if (g_mode == MODE_RECORD) clock_rec(OP_GETTIMEOFDAY, 0, r ? -errno : 0, tv->tv_sec, tv->tv_usec);
    return r;
}

EXPORT time_t time(time_t *out) {
    RESOLVE(time);
    if (!CLOCK_ACTIVE()) return real_time(out);
    int64_t a = 0, b = 0;
    int served;
    clock_other(OP_TIME, 0, &a, &b, &served);
    if (served) {
        if (out) *out = (time_t)a;
        return (time_t)a;
    }
    time_t v = real_time(out);
    if (g_mode == MODE_RECORD) clock_rec(OP_TIME, 0, 0, v, 0);
    return v;
}

EXPORT int timespec_get(struct timespec *ts, int base) {
    RESOLVE(timespec_get);
    if (!CLOCK_ACTIVE()) return real_timespec_get(ts, base);
    int64_t a = 0, b = 0;
    int served;
    int rc = clock_other(OP_TIMESPEC_GET, base, &a, &b, &served);
    if (served) {
        if (rc) { ts->tv_sec = a; ts->tv_nsec = b; }
        return rc;
    }
    int r = real_timespec_get(ts, base);
    if (g_mode == MODE_RECORD) clock_rec(OP_TIMESPEC_GET, base, r, r ? ts->tv_sec : 0, r ? ts->tv_nsec : 0);
    return r;
}

EXPORT clock_t clock(void) {
    RESOLVE(clock);
    if (!CLOCK_ACTIVE()) return real_clock();
    int64_t a = 0, b = 0;
    int served;
    clock_other(OP_CLOCK, 0, &a, &b, &served);
    if (served) return (clock_t)a;
    clock_t v = real_clock();
    if (g_mode == MODE_RECORD) clock_rec(OP_CLOCK, 0, 0, v, 0);
    return v;
}

/* ------------------------------------------------------------------ entropy */

#define ECHUNK 32768 /* bigger requests are split, identically in both modes */

static ssize_t entropy_chunk(int op, void *buf, uint32_t size, uint32_t flags, int fd) {
    tls_t *t = me();
    uint32_t args[2] = {size, flags};
    int gr = op == OP_GETRANDOM || op == OP_GETRANDOM_RAW;
    uint32_t argn = gr ? 8 : 4;
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_ENTROPY, op, args, argn, &n);
        if (p) {
            int32_t rc;
            memcpy(&rc, p + argn, 4);
            uint32_t hdr = argn + (gr ? 8 : 4);
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
        unsigned char head[16];
        int32_t rc = is_err(r) ? (int32_t)r : (op == OP_GETENTROPY ? 0 : (int32_t)r);
        uint32_t data = is_err(r) ? 0 : (uint32_t)r;
        memcpy(head, args, argn);
        memcpy(head + argn, &rc, 4);
        uint32_t hn = argn + 4;
        if (gr) { memset(head + hn, 0, 4); hn += 4; }
        rec2(t, CH_ENTROPY, op, head, hn, buf, data);
    }
    if (is_err(r)) { errno = (int)-r; return -1; }
    return op == OP_GETENTROPY ? 0 : r;
}

static ssize_t entropy(int op, void *buf, size_t size, uint32_t flags, int fd) {
    if (size <= ECHUNK) return entropy_chunk(op, buf, (uint32_t)size, flags, fd);
    size_t done = 0;
    while (done < size) {
        size_t n = size - done > ECHUNK ? ECHUNK : size - done;
        ssize_t r = entropy_chunk(op, (char *)buf + done, (uint32_t)n, flags, fd);
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
    return entropy(OP_GETRANDOM, buf, n, flags, -1);
}

EXPORT int getentropy(void *buf, size_t n) {
    if (n > 256) { errno = EIO; return -1; }
    if (!ACTIVE()) {
        long r = RS3(SYS_getrandom, buf, n, 0);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return 0;
    }
    return (int)entropy(OP_GETENTROPY, buf, n, 0, -1);
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

static int is_random_path(const char *p) {
    return p && starts(p, "/dev/") && (!strcmp(p + 5, "urandom") || !strcmp(p + 5, "random"));
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

/* ------------------------------------------------------------------ pipe I/O shape
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

static ssize_t io_read(int fd, void *buf, size_t n) {
    tls_t *t = me();
    uint32_t asked = n > 0x7fffffff ? 0x7fffffff : (uint32_t)n;
    if (g_mode == MODE_RECORD) {
        long r = RS3(SYS_read, fd, buf, n);
        int32_t out[2] = {(int32_t)asked, is_err(r) ? (int32_t)r : (int32_t)r};
        rec(t, CH_IO, OP_IO_READ, out, 8);
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
    memcpy(&want, p + 4, 4);
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
        int32_t out[3] = {opt, (int32_t)r, st};
        rec(t, CH_IO, OP_IO_WAIT, out, 12);
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
        memcpy(&res, p + 4, 4);
        if (res == 0) return 0;
        if (res < 0) { errno = -res; return -1; }
        do r = RS4(SYS_wait4, pid, status, options & ~WNOHANG, ru); while (r == -EINTR);
    }
    if (is_err(r)) { errno = (int)-r; return -1; }
    return (pid_t)r;
}

EXPORT pid_t wait4(pid_t pid, int *status, int options, struct rusage *ru) {
    if ((options & WNOHANG) && ACTIVE()) return io_wait4(pid, status, options, ru);
    long r = RS4(SYS_wait4, pid, status, options, ru);
    if (is_err(r)) { errno = (int)-r; return -1; }
    return (pid_t)r;
}
EXPORT pid_t waitpid(pid_t pid, int *status, int options) { return wait4(pid, status, options, NULL); }

EXPORT ssize_t read(int fd, void *buf, size_t n) {
    if (UNLIKELY(rfd_is(fd)) && ACTIVE()) return entropy(OP_RANDOM_READ, buf, n, 0, fd);
    if (UNLIKELY(pfd_is(fd)) && ACTIVE()) return io_read(fd, buf, n);
    RESOLVE(read);
    return real_read(fd, buf, n);
}

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

/* ------------------------------------------------------------------ identity */

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

/* ------------------------------------------------------------------ timed waits */

typedef struct { int64_t sec, nsec; int32_t rc, pad; int64_t rsec, rnsec; } sleeprec_t;

EXPORT int nanosleep(const struct timespec *req, struct timespec *rem) {
    if (!ACTIVE() || !req) {
        long r = RS2(SYS_nanosleep, req, rem);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return 0;
    }
    tls_t *t = me();
    int64_t args[2] = {req->tv_sec, req->tv_nsec};
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_WAIT, OP_NANOSLEEP, args, 16, &n);
        if (p) {
            sleeprec_t s; memcpy(&s, p, sizeof s);
            if (rem && s.rc) { rem->tv_sec = s.rsec; rem->tv_nsec = s.rnsec; }
            if (s.rc) { errno = -s.rc; return -1; }
            return 0;
        }
    }
    struct timespec r2 = {0, 0};
    long r = RS2(SYS_nanosleep, req, &r2);
    if (rem) *rem = r2;
    if (g_mode == MODE_RECORD) {
        sleeprec_t s = {args[0], args[1], is_err(r) ? (int32_t)r : 0, 0, r2.tv_sec, r2.tv_nsec};
        rec(t, CH_WAIT, OP_NANOSLEEP, &s, sizeof s);
    }
    if (is_err(r)) { errno = (int)-r; return -1; }
    return 0;
}

typedef struct { int32_t clock, flags; int64_t sec, nsec; int32_t rc, pad; int64_t rsec, rnsec; } csleeprec_t;

EXPORT int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem) {
    if (!ACTIVE() || !req) return (int)-RS4(SYS_clock_nanosleep, clk, flags, req, rem);
    tls_t *t = me();
    csleeprec_t s = {(int32_t)clk, flags, req->tv_sec, req->tv_nsec, 0, 0, 0, 0};
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_WAIT, OP_CLOCK_NANOSLEEP, &s, 24, &n);
        if (p) {
            memcpy(&s, p, sizeof s);
            if (rem && s.rc && !(flags & TIMER_ABSTIME)) { rem->tv_sec = s.rsec; rem->tv_nsec = s.rnsec; }
            return s.rc;
        }
    }
    struct timespec r2 = {0, 0};
    long r = RS4(SYS_clock_nanosleep, clk, flags, req, &r2);
    if (rem && r == -EINTR && !(flags & TIMER_ABSTIME)) *rem = r2;
    if (g_mode == MODE_RECORD) {
        s.rc = (int32_t)-r; s.rsec = r2.tv_sec; s.rnsec = r2.tv_nsec;
        rec(t, CH_WAIT, OP_CLOCK_NANOSLEEP, &s, sizeof s);
    }
    return (int)-r;
}

EXPORT unsigned int sleep(unsigned int secs) {
    if (!ACTIVE()) {
        struct timespec req = {secs, 0}, rem = {0, 0};
        if (is_err(RS2(SYS_nanosleep, &req, &rem))) return (unsigned)rem.tv_sec;
        return 0;
    }
    tls_t *t = me();
    uint32_t s[2] = {secs, 0};
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_WAIT, OP_SLEEP, s, 4, &n);
        if (p) { memcpy(s, p, 8); return s[1]; }
    }
    struct timespec req = {secs, 0}, rem = {0, 0};
    s[1] = is_err(RS2(SYS_nanosleep, &req, &rem)) ? (uint32_t)rem.tv_sec : 0;
    if (g_mode == MODE_RECORD) rec(t, CH_WAIT, OP_SLEEP, s, 8);
    return s[1];
}

EXPORT int usleep(useconds_t us) {
    struct timespec req = {us / 1000000, (long)(us % 1000000) * 1000};
    if (!ACTIVE()) {
        long r = RS2(SYS_nanosleep, &req, NULL);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return 0;
    }
    tls_t *t = me();
    int32_t s[2] = {(int32_t)us, 0};
    if (g_mode == MODE_REPLAY) {
        uint32_t n;
        const unsigned char *p = serve(t, CH_WAIT, OP_USLEEP, s, 4, &n);
        if (p) { memcpy(s, p, 8); if (s[1]) { errno = -s[1]; return -1; } return 0; }
    }
    long r = RS2(SYS_nanosleep, &req, NULL);
    s[1] = is_err(r) ? (int32_t)r : 0;
    if (g_mode == MODE_RECORD) rec(t, CH_WAIT, OP_USLEEP, s, 8);
    if (s[1]) { errno = -s[1]; return -1; }
    return 0;
}

/* Timed waits: 1 = the recording says this call timed out with nothing ready. */
static int wait_served(tls_t *t, int op, const void *args, uint32_t argn) {
    uint32_t n;
    const unsigned char *p = serve(t, CH_WAIT, op, args, argn, &n);
    if (!p) return 0;
    int32_t to; memcpy(&to, p + argn, 4);
    return to;
}

static void wait_rec(tls_t *t, int op, const void *args, uint32_t argn, int32_t timed_out) {
    unsigned char b[24];
    memcpy(b, args, argn);
    memcpy(b + argn, &timed_out, 4);
    rec(t, CH_WAIT, op, b, argn + 4);
}

#define IO_POLL_MAX 64

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

EXPORT int poll(struct pollfd *fds, nfds_t nfds, int timeout) {
    RESOLVE(poll);
    if (ACTIVE() && poll_shaped(fds, nfds)) return io_poll(fds, nfds, timeout);
    if (!ACTIVE() || timeout <= 0) return real_poll(fds, nfds, timeout);
    tls_t *t = me();
    int32_t args[2] = {timeout, (int32_t)nfds};
    if (g_mode == MODE_REPLAY) {
        if (wait_served(t, OP_POLL, args, 8)) {
            for (nfds_t i = 0; i < nfds; i++) fds[i].revents = 0;
            return 0;
        }
        return real_poll(fds, nfds, timeout);
    }
    int r = real_poll(fds, nfds, timeout);
    int e = errno;
    wait_rec(t, OP_POLL, args, 8, r == 0);
    errno = e;
    return r;
}

EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *tv) {
    RESOLVE(select);
    if (!ACTIVE() || !tv || (tv->tv_sec == 0 && tv->tv_usec == 0)) return real_select(nfds, r, w, x, tv);
    tls_t *t = me();
    int32_t a[4] = {nfds, 0, 0, 0};
    int64_t us = (int64_t)tv->tv_sec * 1000000 + tv->tv_usec;
    memcpy(a + 2, &us, 8);
    if (g_mode == MODE_REPLAY) {
        if (wait_served(t, OP_SELECT, a, 16)) {
            if (r) FD_ZERO(r);
            if (w) FD_ZERO(w);
            if (x) FD_ZERO(x);
            tv->tv_sec = 0; tv->tv_usec = 0;
            return 0;
        }
        return real_select(nfds, r, w, x, tv);
    }
    int rc = real_select(nfds, r, w, x, tv);
    int e = errno;
    wait_rec(t, OP_SELECT, a, 16, rc == 0);
    errno = e;
    return rc;
}

EXPORT int epoll_wait(int ep, struct epoll_event *ev, int max, int timeout) {
    RESOLVE(epoll_wait);
    if (!ACTIVE() || timeout <= 0) return real_epoll_wait(ep, ev, max, timeout);
    tls_t *t = me();
    int32_t args[2] = {timeout, max};
    if (g_mode == MODE_REPLAY) {
        if (wait_served(t, OP_EPOLL, args, 8)) return 0;
        return real_epoll_wait(ep, ev, max, timeout);
    }
    int r = real_epoll_wait(ep, ev, max, timeout);
    int e = errno;
    wait_rec(t, OP_EPOLL, args, 8, r == 0);
    errno = e;
    return r;
}

EXPORT int epoll_pwait(int ep, struct epoll_event *ev, int max, int timeout, const sigset_t *ss) {
    RESOLVE(epoll_pwait);
    if (!ACTIVE() || timeout <= 0) return real_epoll_pwait(ep, ev, max, timeout, ss);
    tls_t *t = me();
    int32_t args[2] = {timeout, max};
    if (g_mode == MODE_REPLAY) {
        if (wait_served(t, OP_EPOLL, args, 8)) return 0;
        return real_epoll_pwait(ep, ev, max, timeout, ss);
    }
    int r = real_epoll_pwait(ep, ev, max, timeout, ss);
    int e = errno;
    wait_rec(t, OP_EPOLL, args, 8, r == 0);
    errno = e;
    return r;
}

static const struct timespec *translate_deadline(int clk, const struct timespec *abs,
                                                 struct timespec *out) {
    if (g_mode != MODE_REPLAY || !abs || T.guard || gil_free()) return abs;
    int64_t want = abs->tv_sec * 1000000000LL + abs->tv_nsec;
    if (clk < 0) { /* unknown clock: the one whose served value is nearest */
        int64_t dm = want - g_served_ns[CLOCK_MONOTONIC], dr = want - g_served_ns[CLOCK_REALTIME];
        clk = (dm < 0 ? -dm : dm) < (dr < 0 ? -dr : dr) ? CLOCK_MONOTONIC : CLOCK_REALTIME;
    }
    if ((unsigned)clk >= 16 || !g_served_ns[clk]) return abs;
    struct timespec now;
    if (is_err(RS2(SYS_clock_gettime, clk, &now))) return abs;
    int64_t t = now.tv_sec * 1000000000LL + now.tv_nsec + (want - g_served_ns[clk]);
    out->tv_sec = t / 1000000000LL;
    out->tv_nsec = t % 1000000000LL;
    return out;
}

#define TIMED(ret, name, params, clk, absarg, call) \
    EXPORT ret name params { \
        static ret(*real) params; \
        if (!real) real = (ret(*) params)dlsym(RTLD_NEXT, #name); \
        struct timespec tr; \
        const struct timespec *absarg##_t = translate_deadline((clk), absarg, &tr); \
        return real call; \
    }
TIMED(int, pthread_cond_timedwait, (pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *a),
      -1, a, (c, m, a_t))
TIMED(int, pthread_cond_clockwait, (pthread_cond_t *c, pthread_mutex_t *m, clockid_t k, const struct timespec *a),
      (int)k, a, (c, m, k, a_t))
TIMED(int, sem_timedwait, (sem_t *s, const struct timespec *a), CLOCK_REALTIME, a, (s, a_t))
TIMED(int, sem_clockwait, (sem_t *s, clockid_t k, const struct timespec *a), (int)k, a, (s, k, a_t))
TIMED(int, pthread_mutex_timedlock, (pthread_mutex_t *m, const struct timespec *a), CLOCK_REALTIME, a, (m, a_t))
TIMED(int, pthread_mutex_clocklock, (pthread_mutex_t *m, clockid_t k, const struct timespec *a), (int)k, a, (m, k, a_t))

/* ------------------------------------------------------------------ syscall() */

EXPORT long syscall(long n, ...) {
    va_list ap;
    va_start(ap, n);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    if (g_mode) {
        switch (n) {
        case SYS_getpid: return getpid();
        case SYS_getppid: return getppid();
        case SYS_gettid: return gettid();
        case SYS_getrandom: return getrandom((void *)a, (size_t)b, (unsigned)c);
        case SYS_clock_gettime: return clock_gettime((clockid_t)a, (struct timespec *)b);
        case SYS_gettimeofday: return gettimeofday((struct timeval *)a, (void *)b);
        case SYS_time: return time((time_t *)a);
        case SYS_nanosleep: return nanosleep((const struct timespec *)a, (struct timespec *)b);
        }
    }
    long r = rsys(n, a, b, c, d, e, f);
    if (is_err(r)) { errno = (int)-r; return -1; }
    return r;
}

/* ------------------------------------------------------------------ directory listings */

typedef struct {
    DIR *d;
    unsigned char *block;
    size_t cap;
    struct dirent64 **ents;
    uint32_t count, next;
} dslot_t;

#define NDIRS 512

static unsigned char *block_get(void) {
    for (int i = 0; i < 2; i++)
        if (T.spare[i]) { unsigned char *b = T.spare[i]; T.spare[i] = NULL; return b; }
    return shim_map(DBLOCK, -1);
}

static void block_put(unsigned char *b) {
    for (int i = 0; i < 2; i++)
        if (!T.spare[i]) { T.spare[i] = b; return; }
    shim_unmap(b, DBLOCK);
}
static dslot_t g_dirs[NDIRS];
static int g_dirs_lock;

static dslot_t *dslot_find(DIR *d) {
    unsigned h = (unsigned)(((uintptr_t)d >> 4) % NDIRS);
    for (unsigned i = 0; i < NDIRS; i++) {
        dslot_t *s = &g_dirs[(h + i) % NDIRS];
        if (s->d == d) return s;
        if (!s->d && !s->block) return NULL;
    }
    return NULL;
}

static dslot_t *dslot_new(DIR *d) {
    unsigned h = (unsigned)(((uintptr_t)d >> 4) % NDIRS);
    spin_lock(&g_dirs_lock);
    for (unsigned i = 0; i < NDIRS; i++) {
        dslot_t *s = &g_dirs[(h + i) % NDIRS];
        if (!s->d) {
            s->d = d;
            spin_unlock(&g_dirs_lock);
            return s;
        }
    }
    spin_unlock(&g_dirs_lock);
    return NULL;
}

static uint64_t name_hash(const char *p) { /* FNV-1a, then a final mix */
    uint64_t h = 0xcbf29ce484222325ULL;
    while (*p) { h ^= (unsigned char)*p++; h *= 0x100000001b3ULL; }
    h ^= h >> 33; h *= 0xff51afd7ed558ccdULL; h ^= h >> 33;
    return h;
}

static int name_cmp(const char *a, const char *b) {
    while (*a && *a == *b) { a++; b++; }
    return (unsigned char)*a - (unsigned char)*b;
}

static void sort_ents(struct dirent64 **v, uint32_t n) { /* shell sort: no malloc, no recursion */
    static const uint32_t gaps[] = {1750, 701, 301, 132, 57, 23, 10, 4, 1};
    for (unsigned g = 0; g < sizeof gaps / sizeof *gaps; g++) {
        uint32_t gap = gaps[g];
        for (uint32_t i = gap; i < n; i++) {
            struct dirent64 *x = v[i];
            uint32_t j = i;
            while (j >= gap && name_cmp(v[j - gap]->d_name, x->d_name) > 0) { v[j] = v[j - gap]; j -= gap; }
            v[j] = x;
        }
    }
}

/* Add one entry to a listing block; entries grow up from the start, pointers down
 * from the end. */
static int block_add(dslot_t *s, size_t *used, uint64_t ino, unsigned char type,
                     const char *name, uint16_t nl) {
    size_t reclen = (offsetof(struct dirent64, d_name) + nl + 1 + 7) & ~(size_t)7;
    size_t ptrs = (size_t)(s->count + 1) * sizeof(void *);
    if (*used + reclen + ptrs > s->cap) return 0;
    struct dirent64 *e = (struct dirent64 *)(s->block + *used);
    e->d_ino = ino;
    e->d_off = (int64_t)(s->count + 1);
    e->d_reclen = (unsigned short)reclen;
    e->d_type = type;
    memcpy(e->d_name, name, nl);
    e->d_name[nl] = 0;
    s->ents = (struct dirent64 **)(s->block + s->cap) - (s->count + 1);
    /* pointers are kept in order of insertion: shift is avoided by writing at the end */
    s->ents[0] = e;
    s->count++;
    *used += reclen;
    return 1;
}

/* Read the live listing of d into s, sorted. ents[] ends up in reverse insertion
 * order; sorting fixes the order anyway. */
static int live_listing(dslot_t *s, DIR *d) {
    s->block = block_get();
    if (!s->block) return 0;
    s->cap = DBLOCK;
    s->count = 0;
    s->ents = (struct dirent64 **)(s->block + s->cap);
    size_t used = 0;
    struct dirent64 *e;
    while ((e = real_readdir64(d)) != NULL)
        if (!block_add(s, &used, e->d_ino, e->d_type, e->d_name, (uint16_t)s_len(e->d_name))) break;
    sort_ents(s->ents, s->count);
    return 1;
}

static void listing_record(tls_t *t, dslot_t *s, const char *path, int32_t err) {
    /* payload: u16 pathlen | path | i32 errno | u32 count | entries */
    size_t total = 2 + s_len(path) + 8;
    for (uint32_t i = 0; i < s->count; i++) total += 11 + s_len(s->ents[i]->d_name);
    unsigned char *buf = total <= DBLOCK ? block_get() : shim_map(total, -1);
    if (!buf) return;
    unsigned char *w = buf;
    uint16_t pl = (uint16_t)s_len(path);
    memcpy(w, &pl, 2); memcpy(w + 2, path, pl); w += 2 + pl;
    memcpy(w, &err, 4); memcpy(w + 4, &s->count, 4); w += 8;
    for (uint32_t i = 0; i < s->count; i++) {
        struct dirent64 *e = s->ents[i];
        uint16_t nl = (uint16_t)s_len(e->d_name);
        uint64_t ino = e->d_ino;
        memcpy(w, &ino, 8); w[8] = e->d_type; memcpy(w + 9, &nl, 2); memcpy(w + 11, e->d_name, nl);
        w += 11 + nl;
    }
    rec(t, CH_DIRENTS, OP_OPENDIR, buf, (uint32_t)total);
    if (total <= DBLOCK) block_put(buf);
    else shim_unmap(buf, total);
}

static void drift_report(tls_t *t, const char *path) {
    char line[1400];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, "drift\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tchannel=dirents\tpos="); p = u_put(p, end, t->st[CH_DIRENTS].pos - 1);
    p = s_put(p, end, "\trecorded=listing\tasked=opendir(path=");
    p = s_put(p, end, path);
    p = s_put(p, end, ") lists different entries now\n");
    append_report(line, (size_t)(p - line));
}

/* Replay: check path, serve the recorded listing, report a different live one as drift. */
static DIR *listing_replay(tls_t *t, const char *path, DIR *live, int live_err) {
    unsigned char args[2 + 1024];
    uint16_t pl = (uint16_t)s_len(path);
    if (pl > 1024) pl = 1024;
    memcpy(args, &pl, 2); memcpy(args + 2, path, pl);
    uint32_t n;
    const unsigned char *p = serve(t, CH_DIRENTS, OP_OPENDIR, args, 2u + pl, &n);
    if (!p) return (DIR *)-1; /* lenient: live */
    const unsigned char *q = p + 2 + pl;
    int32_t err; uint32_t count;
    memcpy(&err, q, 4); memcpy(&count, q + 4, 4); q += 8;
    if (err) {
        if (live) real_closedir(live);
        errno = err;
        return NULL;
    }
    (void)live_err;
    DIR *d = live ? live : real_opendir("/");
    if (!d) { errno = EIO; return NULL; }
    dslot_t *s = dslot_new(d);
    if (!s) return d;
    s->block = block_get();
    if (!s->block) { s->d = NULL; return d; }
    s->cap = DBLOCK;
    s->count = 0;
    s->next = 0;
    size_t used = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint64_t ino; uint16_t nl;
        memcpy(&ino, q, 8); memcpy(&nl, q + 9, 2);
        block_add(s, &used, ino, q[8], (const char *)q + 11, nl);
        q += 11 + nl;
    }
    /* ents[] was filled back to front: reverse into recorded order */
    for (uint32_t i = 0, j = s->count ? s->count - 1 : 0; i < j; i++, j--) {
        struct dirent64 *x = s->ents[i]; s->ents[i] = s->ents[j]; s->ents[j] = x;
    }
    /* compare with the live listing: the set of names, by count and an order-independent
     * digest (no copy, no sort); STENO_DRIFT=0 skips reading the live directory */
    int drift = live == NULL;
    if (live && g_drift) {
        uint64_t lsum = 0, lxor = 0, rsum = 0, rxor = 0;
        uint32_t lcount = 0;
        struct dirent64 *e;
        while ((e = real_readdir64(live)) != NULL) {
            uint64_t h = name_hash(e->d_name);
            lsum += h; lxor ^= h * 0x9e3779b97f4a7c15ULL; lcount++;
        }
        for (uint32_t i = 0; i < s->count; i++) {
            uint64_t h = name_hash(s->ents[i]->d_name);
            rsum += h; rxor ^= h * 0x9e3779b97f4a7c15ULL;
        }
        drift = lcount != s->count || lsum != rsum || lxor != rxor;
    }
    if (drift) drift_report(t, path);
    return d;
}

static DIR *dir_common(const char *path, DIR *live, int live_err) {
    tls_t *t = me();
    t->guard++;
    DIR *out = live;
    if (g_mode == MODE_REPLAY) {
        out = listing_replay(t, path, live, live_err);
        if (out == (DIR *)-1) {
            out = live;
            if (!live) errno = live_err;
            else { dslot_t *s = dslot_new(live); if (s && !live_listing(s, live)) s->d = NULL; }
        }
    } else {
        dslot_t tmp = {0};
        dslot_t *s = live ? dslot_new(live) : &tmp;
        if (s && live) {
            s->next = 0;
            if (!live_listing(s, live)) s->count = 0;
        }
        listing_record(t, s ? s : &tmp, path, live ? 0 : live_err);
        if (!live) errno = live_err;
    }
    t->guard--;
    return out;
}

EXPORT DIR *opendir(const char *path) {
    RESOLVE(opendir); RESOLVE(readdir64); RESOLVE(closedir);
    if (!ACTIVE()) return real_opendir(path);
    DIR *d = real_opendir(path);
    int err = d ? 0 : errno;
    return dir_common(path, d, err);
}

EXPORT DIR *fdopendir(int fd) {
    RESOLVE(fdopendir); RESOLVE(readdir64); RESOLVE(closedir); RESOLVE(opendir);
    if (!ACTIVE()) return real_fdopendir(fd);
    char link[64], path[1024];
    char *p = s_put(link, link + 63, "/proc/self/fd/");
    p = u_put(p, link + 63, (unsigned)fd);
    *p = 0;
    long n = RS4(SYS_readlinkat, AT_FDCWD, link, path, sizeof path - 1);
    path[n > 0 ? n : 0] = 0;
    DIR *d = real_fdopendir(fd);
    int err = d ? 0 : errno;
    return dir_common(path, d, err);
}

EXPORT struct dirent64 *readdir64(DIR *d) {
    RESOLVE(readdir64);
    if (g_mode) {
        dslot_t *s = dslot_find(d);
        if (s && s->block) {
            if (s->next >= s->count) return NULL;
            return s->ents[s->next++];
        }
    }
    return real_readdir64(d);
}

EXPORT struct dirent *readdir(DIR *d) { return (struct dirent *)readdir64(d); }

EXPORT void rewinddir(DIR *d) {
    RESOLVE(rewinddir);
    if (g_mode) {
        dslot_t *s = dslot_find(d);
        if (s && s->block) { s->next = 0; return; }
    }
    real_rewinddir(d);
}

EXPORT int closedir(DIR *d) {
    RESOLVE(closedir);
    if (g_mode) {
        dslot_t *s = dslot_find(d);
        if (s) {
            if (s->block && s->block != (unsigned char *)1) block_put(s->block);
            s->block = (unsigned char *)1; /* tombstone keeps probe chains intact */
            s->d = NULL;
            s->count = s->next = 0;
        }
    }
    return real_closedir(d);
}

/* glibc's scandir() opens the directory through an internal alias of opendir that this
 * library cannot interpose, so it is rebuilt here on the wrapped opendir/readdir64:
 * the listing is taped (and sorted) like any other. Not a hot path: malloc is fine. */
typedef int (*scan_filter_t)(const struct dirent64 *);
typedef int (*scan_compar_t)(const struct dirent64 **, const struct dirent64 **);

static int scandir_common(const char *path, struct dirent64 ***out, scan_filter_t filter,
                          scan_compar_t compar) {
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent64 **v = NULL;
    size_t n = 0, cap = 0;
    struct dirent64 *e;
    int err = 0;
    while ((e = readdir64(d)) != NULL) {
        if (filter && !filter(e)) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            struct dirent64 **nv = realloc(v, nc * sizeof *nv);
            if (!nv) { err = ENOMEM; break; }
            v = nv;
            cap = nc;
        }
        size_t sz = offsetof(struct dirent64, d_name) + s_len(e->d_name) + 1;
        struct dirent64 *c = malloc(sz < sizeof *c ? sizeof *c : sz);
        if (!c) { err = ENOMEM; break; }
        memcpy(c, e, sz);
        v[n++] = c;
    }
    closedir(d);
    if (err) {
        while (n) free(v[--n]);
        free(v);
        errno = err;
        return -1;
    }
    if (compar && n > 1)
        qsort(v, n, sizeof *v, (int (*)(const void *, const void *))compar);
    *out = v;
    return (int)n;
}

EXPORT int scandir64(const char *path, struct dirent64 ***out, scan_filter_t filter,
                     scan_compar_t compar) {
    if (!g_mode) {
        static int (*real)(const char *, struct dirent64 ***, scan_filter_t, scan_compar_t);
        if (!real) real = dlsym(RTLD_NEXT, "scandir64");
        return real(path, out, filter, compar);
    }
    return scandir_common(path, out, filter, compar);
}

EXPORT int scandir(const char *path, struct dirent ***out, int (*filter)(const struct dirent *),
                   int (*compar)(const struct dirent **, const struct dirent **)) {
    /* on x86_64 struct dirent and struct dirent64 have the same layout */
    return scandir64(path, (struct dirent64 ***)out, (scan_filter_t)filter,
                     (scan_compar_t)compar);
}

/* ------------------------------------------------------------------ threads */

struct tramp { void *(*fn)(void *); void *arg; uint32_t idx; };

static void *trampoline(void *p) {
    struct tramp tr = *(struct tramp *)p;
    free(p);
    T.tindex = tr.idx;
    T.init = 1;
    pthread_setspecific(g_key, (void *)1);
    return tr.fn(tr.arg);
}

EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    RESOLVE(pthread_create);
    if (!g_mode) return real_pthread_create(th, attr, fn, arg);
    struct tramp *tr = malloc(sizeof *tr);
    if (!tr) return EAGAIN;
    tr->fn = fn;
    tr->arg = arg;
    tr->idx = __atomic_fetch_add(&g_tnext, 1, __ATOMIC_RELAXED);
    int r = real_pthread_create(th, attr, trampoline, tr);
    if (r) free(tr);
    return r;
}

/* ------------------------------------------------------------------ processes */

static void child_path(char *out, size_t cap, uint32_t idx) {
    char *p = s_put(out, out + cap - 1, g_proc);
    p = s_put(p, out + cap - 1, ".");
    p = u_put(p, out + cap - 1, idx);
    *p = 0;
}

/* After fork: a new process path, thread 0, empty buffers, own connection, fresh streams. */
static void after_fork_child(uint32_t idx) {
    char np[256];
    g_vpid = g_vppid = 0;
    T.guard++;
    child_path(np, sizeof np, idx);
    memcpy(g_proc, np, s_len(np) + 1);
    g_proclen = (uint16_t)s_len(g_proc);
    g_tnext = 1;
    g_cnext = 0;
    g_barrier_lock = 0;
    g_dirs_lock = 0;
    if (g_sock >= 0) RS1(SYS_close, g_sock);
    g_sock = -1;
    T.tindex = 0;
    T.init = 1;
    for (int i = 0; i < MAXT; i++) {
        tbuf_t *b = g_slots[i];
        if (!b) break;
        b->len = 0;
        b->lock = 0;
        b->used = b == T.tb;
        if (b == T.tb) b->tindex = 0;
    }
    for (int c = 0; c < NCH; c++) T.st[c].mapped = 0;
    T.guard--;
    procinfo();
}

EXPORT pid_t fork(void) {
    RESOLVE(fork);
    if (!g_mode) return real_fork();
    if (T.guard) { /* paused by a Python hook: the child runs off the tape, unnumbered */
        pid_t pid = real_fork();
        if (pid == 0) {
            g_mode = MODE_OFF;
            if (g_sock >= 0) RS1(SYS_close, g_sock);
            g_sock = -1;
        }
        return pid;
    }
    tls_t *t = me();
    uint32_t idx = __atomic_add_fetch(&g_cnext, 1, __ATOMIC_RELAXED);
    if (g_mode == MODE_RECORD && t->tb) { /* flush before fork: nothing is duplicated */
        spin_lock(&t->tb->lock);
        ship_buf(t->tb);
        spin_unlock(&t->tb->lock);
    }
    pid_t pid = real_fork();
    if (pid == 0) after_fork_child(idx);
    return pid;
}

/* vfork shares the parent's memory, which would let the child overwrite the shim's
 * state; a real fork is what a vfork+exec means anyway. */
EXPORT pid_t vfork(void) { return fork(); }

/* Build a child environment: the given one without STENO_*, plus the shim's variables. */
static char **build_env(char *const *envp, const char *proc, uint32_t tbase, uint32_t cnext,
                        size_t *maplen) {
    size_t count = 0, strbytes = 0;
    const char *preload = NULL;
    for (char *const *e = envp; e && *e; e++) {
        count++;
        if (starts(*e, "LD_PRELOAD=")) preload = *e + 11;
    }
    strbytes = 3 * 1024 + s_len(g_shim) * 2 + s_len(g_tape) + s_len(g_sockpath) +
               (preload ? s_len(preload) : 0);
    size_t nextra = 0;
    for (size_t at = 0; at < g_extra_len; at += s_len(g_extra + at) + 1) nextra++;
    count += nextra;
    size_t len = (count + 12) * sizeof(char *) + strbytes;
    char **out = shim_map(len, -1);
    if (!out) return NULL;
    *maplen = len;
    char *sp = (char *)(out + count + 12), *end = (char *)out + len - 1;
    size_t k = 0;
    for (char *const *e = envp; e && *e; e++)
        if (!starts(*e, "STENO_") && !starts(*e, "LD_PRELOAD=")) out[k++] = *e;
#define ADD(...) do { char *s0 = sp; const char *parts[] = {__VA_ARGS__, NULL}; \
        for (int i = 0; parts[i]; i++) sp = s_put(sp, end, parts[i]); \
        *sp++ = 0; out[k++] = s0; } while (0)
    int has = 0;
    if (preload) {
        const char *h = strstr(preload, g_shim);
        has = h != NULL;
    }
    if (has) ADD("LD_PRELOAD=", preload);
    else if (preload && *preload) ADD("LD_PRELOAD=", g_shim, ":", preload);
    else ADD("LD_PRELOAD=", g_shim);
    ADD("STENO_MODE=", g_mode == MODE_RECORD ? "record" : "replay");
    if (g_mode == MODE_RECORD) ADD("STENO_SOCK=", g_sockpath);
    else ADD("STENO_TAPE=", g_tape);
    ADD("STENO_PROC=", proc);
    char nb[48];
    char *p = u_put(nb, nb + 47, tbase);
    *p++ = ',';
    p = u_put(p, nb + 47, cnext);
    *p = 0;
    ADD("STENO_NEXT=", nb);
    ADD("STENO_SHIM=", g_shim);
    if (g_lenient) ADD("STENO_LENIENT=1");
    if (g_nonet) ADD("STENO_NONET=1");
    if (g_filt[0]) ADD("STENO_FILT=", g_filt);
    if (!g_drift) ADD("STENO_DRIFT=0");
    for (size_t at = 0; at < g_extra_len && k < count + 11; at += s_len(g_extra + at) + 1)
        out[k++] = g_extra + at;
#undef ADD
    out[k] = NULL;
    return out;
}

static void before_exec(void) {
    if (g_mode != MODE_RECORD) return;
    T.guard++;
    flush_all();
    barrier(MSG_BARRIER);
    T.guard--;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    RESOLVE(execve);
    if (!g_mode) return real_execve(path, argv, envp);
    size_t ml = 0;
    char **env = build_env(envp, g_proc, g_tnext, g_cnext, &ml);
    before_exec();
    int r = real_execve(path, argv, env ? env : envp);
    int e = errno;
    if (env) shim_unmap(env, ml);
    errno = e;
    return r;
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    RESOLVE(execvpe);
    if (!g_mode) return real_execvpe(file, argv, envp);
    size_t ml = 0;
    char **env = build_env(envp, g_proc, g_tnext, g_cnext, &ml);
    before_exec();
    int r = real_execvpe(file, argv, env ? env : envp);
    int e = errno;
    if (env) shim_unmap(env, ml);
    errno = e;
    return r;
}

EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }
EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

#define COLLECT_ARGS(first, envout) \
    char *argv[4096]; size_t argc = 0; va_list ap; va_start(ap, first); \
    argv[argc++] = (char *)(first); \
    while (argc < 4095 && (argv[argc] = va_arg(ap, char *)) != NULL) argc++; \
    argv[argc] = NULL; envout; va_end(ap)

EXPORT int execl(const char *path, const char *arg, ...) {
    COLLECT_ARGS(arg, (void)0);
    return execve(path, argv, environ);
}
EXPORT int execlp(const char *file, const char *arg, ...) {
    COLLECT_ARGS(arg, (void)0);
    return execvpe(file, argv, environ);
}
EXPORT int execle(const char *path, const char *arg, ...) {
    char **envp;
    COLLECT_ARGS(arg, envp = va_arg(ap, char **));
    return execve(path, argv, envp);
}

static int spawn_common(int p, pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *at, char *const argv[], char *const envp[]) {
    uint32_t idx = __atomic_add_fetch(&g_cnext, 1, __ATOMIC_RELAXED);
    char cp[256];
    child_path(cp, sizeof cp, idx);
    size_t ml = 0;
    char **env = build_env(envp, cp, 0, 0, &ml);
    int r = p ? real_posix_spawnp(pid, path, fa, at, argv, env ? env : envp)
              : real_posix_spawn(pid, path, fa, at, argv, env ? env : envp);
    if (env) shim_unmap(env, ml);
    return r;
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *at, char *const argv[], char *const envp[]) {
    RESOLVE(posix_spawn);
    if (!g_mode || T.guard) return real_posix_spawn(pid, path, fa, at, argv, envp);
    return spawn_common(0, pid, path, fa, at, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *at, char *const argv[], char *const envp[]) {
    RESOLVE(posix_spawnp);
    if (!g_mode || T.guard) return real_posix_spawnp(pid, path, fa, at, argv, envp);
    return spawn_common(1, pid, path, fa, at, argv, envp);
}

/* system() and popen() spawn through glibc-internal posix_spawn, which this library
 * cannot see: give the child its path through a temporarily swapped environ. */
EXPORT int system(const char *cmd) {
    RESOLVE(system);
    if (!g_mode || !cmd || T.guard) return real_system(cmd);
    uint32_t idx = __atomic_add_fetch(&g_cnext, 1, __ATOMIC_RELAXED);
    char cp[256];
    child_path(cp, sizeof cp, idx);
    size_t ml = 0;
    char **env = build_env(environ, cp, 0, 0, &ml);
    char **saved = environ;
    if (env) environ = env;
    int r = real_system(cmd);
    environ = saved;
    if (env) shim_unmap(env, ml);
    return r;
}

EXPORT FILE *popen(const char *cmd, const char *type) {
    RESOLVE(popen);
    if (!g_mode || T.guard) return real_popen(cmd, type);
    uint32_t idx = __atomic_add_fetch(&g_cnext, 1, __ATOMIC_RELAXED);
    char cp[256];
    child_path(cp, sizeof cp, idx);
    size_t ml = 0;
    char **env = build_env(environ, cp, 0, 0, &ml);
    char **saved = environ;
    if (env) environ = env;
    FILE *f = real_popen(cmd, type);
    environ = saved;
    if (env) shim_unmap(env, ml);
    return f;
}

EXPORT void _exit(int status) {
    RESOLVE(_exit);
    final_flush();
    real__exit(status);
}
EXPORT void _Exit(int status) { _exit(status); }

/* ------------------------------------------------------------------ Python hook control */

/* Pause the tape for this thread (nestable): the Python hooks call these around work that
 * replay will not repeat -- their own I/O, and in record mode the real network or tool
 * call -- so none of it lands on the tape. Children spawned while paused run off the
 * tape and take no spawn number. */
EXPORT void steno_pause(void) { T.guard++; }
EXPORT void steno_resume(void) { if (T.guard > 0) T.guard--; }

/* The STENO_* settings the shim hid from the environment; STENO_PROC follows forks. */
EXPORT const char *steno_getenv(const char *name) {
    if (!name || !g_mode) return NULL;
    if (!strcmp(name, "STENO_MODE")) return g_mode == MODE_RECORD ? "record" : "replay";
    if (!strcmp(name, "STENO_PROC")) return g_proc;
    if (!strcmp(name, "STENO_TAPE")) return g_mode == MODE_REPLAY ? g_tape : NULL;
    if (!strcmp(name, "STENO_SOCK")) return g_mode == MODE_RECORD ? g_sockpath : NULL;
    if (!strcmp(name, "STENO_LENIENT")) return g_lenient ? "1" : NULL;
    size_t n = s_len(name);
    for (size_t at = 0; at < g_extra_len; at += s_len(g_extra + at) + 1) {
        const char *e = g_extra + at;
        if (!strncmp(e, name, n) && e[n] == '=') return e + n + 1;
    }
    return NULL;
}
