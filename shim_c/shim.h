/* Private header of the shim's unity build (steno_shim.c includes it first): system
 * includes, raw syscalls, the process-wide state, the per-thread state, and the gates
 * every wrapper opens with. Wire constants shared with Python are in steno_shim.h. */
#ifndef STENO_SHIM_PRIVATE_H
#define STENO_SHIM_PRIVATE_H

#undef _FORTIFY_SOURCE
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
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
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
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
/* The cookie the shim's own trapped-call stand-ins put in the unused sixth argument: the
 * seccomp filters (seccomp.c, pathmap.c) let a call carrying it through. */
#define NET_COOKIE_LO 0x6e657453u /* "Sten" */
#define NET_COOKIE_HI 0x70726f67u /* "ogrp" */
#define NET_COOKIE ((long)(((uint64_t)NET_COOKIE_HI << 32) | NET_COOKIE_LO))
#define RS0(n) rsys((n), 0, 0, 0, 0, 0, 0)
#define RS1(n, a) rsys((n), (long)(a), 0, 0, 0, 0, 0)
#define RS2(n, a, b) rsys((n), (long)(a), (long)(b), 0, 0, 0, 0)
#define RS3(n, a, b, c) rsys((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define RS4(n, a, b, c, d) rsys((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
/* The shim's calls on its own files (the tape, reports): with the cookie, so the replay's
 * path-mapping filter lets them through untrapped (pathmap.c); calls the shim makes on
 * the program's behalf use the plain forms and are mapped like the program's own. */
#define OWN1(n, a) rsys((n), (long)(a), 0, 0, 0, 0, NET_COOKIE)
#define OWN3(n, a, b, c) rsys((n), (long)(a), (long)(b), (long)(c), 0, 0, NET_COOKIE)
#define OWN4(n, a, b, c, d) rsys((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, NET_COOKIE)
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
static int g_anysite; /* replay of an edited program: call sites are not compared */
static char g_proc[256];
static uint16_t g_proclen;
static char g_sockpath[108];
static char g_tape[1024];
static char g_shim[1024];
static uint32_t g_tnext = 1;  /* next thread index to hand out */
static uint32_t g_cnext;      /* children spawned so far by this process */
static int g_sock = -1;
static unsigned long g_sock_ino;
static int g_final;           /* the exit barrier has been sent */
static int g_barrier_lock;
static int g_reports;
static int g_nonet;
static int g_drift = 1; /* STENO_DRIFT=0: replay does not read live directories to check drift */
/* STENO_RESUME=1 (stenograph resume): replay the recorded prefix, then go live (live.c).
 * g_virt: the pids the program sees are the recorded ones (replay, and after going live). */
static int g_resume;
static int g_virt;
/* The protocol of the tape being replayed (TAPE/protocol; this shim's own when recording):
 * what a newer shim tapes that an older recording did not is left as that shim left it. */
static int g_tape_proto = STENO_PROTOCOL;
#define SINCE(v) (g_tape_proto >= (v))

/* Resume: the longest a process waits for its taped threads to reach their cut before
 * it goes live anyway (live.c), and a replayed wait for another thread's fds before it
 * does the same (netio.c). */
#define LIVE_WAIT_MS 2000
#define LIVE_WAIT_PEER_MS 10000 /* ...while a thread waits in a replayed call (live.c) */
#define LIVE_WAIT_CAP_MS 60000  /* ...however busy the other threads look */
/* Replay: how long a wait for fds another thread makes ready (an epoll wait that found
 * them ready when recorded, netio.c) goes on with no record served before it is a
 * divergence. */
#define NET_OTHERS_WAIT_MS 10000
#define NET_OTHERS_WAIT_S "10"
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
                                          "io", "sched", "meta", "signal", "net"};

/* ------------------------------------------------------------------ wrapped symbols */

/* wrapped.def lists every symbol the shim intercepts. Each row declares its wrapper (so
 * a definition that does not match its row fails to compile) and, for REAL rows,
 * real_<name>: libc's own, set by resolve_all() at start-up and by RESOLVE(name) in a
 * wrapper that can run before the constructor. */
#define REAL_DECL(ret, name, args) static ret(*real_##name) args
#define REAL(name, ret, params) REAL_DECL(ret, name, params); EXPORT ret name params;
#define RAW(name, ret, params) EXPORT ret name params;
#include "wrapped.def"

#define RESOLVE(name) \
    do { \
        if (!real_##name) real_##name = (__typeof__(real_##name))dlsym(RTLD_NEXT, #name); \
    } while (0)

/* ------------------------------------------------------------------ per-thread state */

/* One thread's ring in the shared arena (layout: steno_shim.h). */
typedef struct ring {
    uint32_t used;   /* a live thread owns it */
    uint32_t tindex; /* that thread's index */
    unsigned char pad0[RING_OFF_HEAD - 8];
    uint64_t head;   /* bytes ever written; stored by the owner only */
    unsigned char pad1[RING_OFF_TAIL - RING_OFF_HEAD - 8];
    uint64_t tail;   /* bytes ever drained; stored by the recorder only */
    unsigned char pad2[RING_HDR - RING_OFF_TAIL - 8];
    unsigned char data[RING_CAP];
} ring_t;

typedef struct arena {
    char magic[4];
    uint32_t version;
    uint32_t nslots; /* slots handed out so far (grows; the recorder scans this many) */
    int32_t pid;
    uint64_t id;
    unsigned char pad[ARENA_HDR - 24];
    ring_t slot[RING_SLOTS];
} arena_t;

_Static_assert(offsetof(ring_t, tindex) == RING_OFF_TINDEX, "ring layout");
_Static_assert(offsetof(ring_t, head) == RING_OFF_HEAD, "ring layout");
_Static_assert(offsetof(ring_t, tail) == RING_OFF_TAIL, "ring layout");
_Static_assert(offsetof(ring_t, data) == RING_HDR, "ring layout");
_Static_assert(sizeof(ring_t) == RING_SLOT, "ring layout");
_Static_assert((RING_CAP & (RING_CAP - 1)) == 0, "ring capacity is a power of two");
_Static_assert(offsetof(arena_t, nslots) == ARENA_OFF_NSLOTS, "arena layout");
_Static_assert(offsetof(arena_t, pid) == ARENA_OFF_PID, "arena layout");
_Static_assert(offsetof(arena_t, id) == ARENA_OFF_ID, "arena layout");
_Static_assert(offsetof(arena_t, slot) == ARENA_HDR, "arena layout");

typedef struct {
    const unsigned char *base;
    size_t size, off;
    size_t dropped; /* the pages before this offset were given back (core.c stream_release) */
    uint32_t pos;
    int mapped;
} stream_t;

enum {
    STREAM_WINDOW = 1 << 20, /* served past the last release by this much: release again */
    STREAM_LAG = 256 << 10   /* kept behind the read offset (a payload still in use) */
};

typedef struct {
    int init;
    int guard;  /* paused (steno_pause) or inside a wrapper that calls libc: pass through */
    int inshim; /* depth of critical sections (a spin lock held, a stream advancing) */
    int sched_off; /* not ordered by the scheduler (started off the tape, or ended) */
    int holding;   /* holds the scheduler's baton (sched.c) */
    int gate_next; /* the next wait is scheduled though paused (steno_gate_next) */
    uint16_t site;     /* the wrapper's caller (CALL_SITE), taken by the next rec2/serve */
    int live_deadline; /* the last clock read was a live bookkeeping read (clock.c) */
    uint32_t promised; /* resume: the grant (+1) this thread was served and waits for as the
                        * process goes live (sched.c promise) */
    int stepping;      /* resume: inside take_replay between its step and its promise */
    int peer_waits;    /* resume: blocked in replayed calls for what was recorded (core.c) */
    int counted;       /* a thread counted in g_live_threads (threads.c) */
    uint32_t tindex;
    ring_t *tb; /* record: this thread's ring (ring.c) */
    stream_t st[NCH];
    unsigned char *spare[2]; /* listing blocks kept for reuse: no mmap/munmap/faults per listing */
    uint32_t nrec;     /* record: records written on streams other than signal (signals.c) */
    uint32_t clock_run; /* taped clock reads since this thread last took a turn (sched.c) */
    int nrec_based;    /* resume: nrec now counts the records the prefix served too */
    uint32_t sigk;     /* signal-mask calls since this thread's last record (signals.c) */
    int in_sigpoint;   /* replay: running handlers at a point (signals.c) */
    int in_mask;       /* record: inside a mask call, whose unblock may deliver (signals.c) */
    int sigpend_n;     /* record: handler runs that interrupted the shim, taped at the next record */
    struct { uint32_t pos, k; int32_t sig; uint32_t flags; unsigned char info[128]; } sigpend[4];
} tls_t;

/* signals.c: handlers run at recorded points; core.c calls these */
static int g_sigtape; /* replay: the program installed a handler the shim is in front of */
static void sig_at_serve(tls_t *t);
static void sig_flush_pending(tls_t *t);

static __thread tls_t T __attribute__((tls_model("initial-exec")));

/* Where a wrapper was called from, as the return address modulo the page: the same in
 * every run of the same binaries whatever ASLR chose, so a record served to another call
 * site (a monotonic read taking the place of another one) is caught, not served. The top
 * bit marks "known"; 0 is a record from before sites existed, and is not checked. Used
 * only where the record's arguments alone cannot tell two readers apart (clock, entropy).
 * Must be expanded in the exported wrapper itself. */
#define RETURN_ADDRESS() ((uintptr_t)__builtin_return_address(0))
#define SITE_OF(ra) ((uint16_t)(0x8000u | ((ra) & 0xfffu)))
#define CALL_SITE() SITE_OF(RETURN_ADDRESS())

static void thread_init(void) { /* a thread not started through pthread_create */
    T.tindex = __atomic_fetch_add(&g_tnext, 1, __ATOMIC_RELAXED);
    T.init = 1;
    T.sched_off = 1;
    if (g_inited) pthread_setspecific(g_key, (void *)1);
}

static inline tls_t *me(void) {
    if (UNLIKELY(!T.init)) thread_init();
    return &T;
}

#define DBLOCK (64u << 20) /* listing blocks: virtual, MAP_NORESERVE: only touched pages cost */

/* Wrapped calls run live and untaped because they interrupted the shim (see reentered). */
static unsigned long g_reentries;

/* A wrapper entered while its own thread is inside a critical section of the shim can only
 * come from a signal handler that interrupted it. Taping would spin forever on the lock
 * that thread holds, or serve the record being served: the call runs live, and is
 * counted. */
static inline int reentered(void) {
    if (LIKELY(!T.inshim)) return 0;
    __atomic_fetch_add(&g_reentries, 1, __ATOMIC_RELAXED);
    return 1;
}

/* Fast gate: are we recording or replaying, and not inside the shim already? */
#define ACTIVE() (LIKELY(g_mode) && LIKELY(!T.guard) && !reentered())

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
 * so start-up and shut-down reads of the main thread stay taped. Reads made with the GIL
 * held inside CPython's deadline helpers are the same kind: see BOOKKEEPING (clock.c). */
static inline int gil_free(void) {
    return g_py_gil_check && !g_py_gil_check();
}
#define CLOCK_ACTIVE() (ACTIVE() && LIKELY(!gil_free()))

#endif
