/* The scheduler: threads are an input like a clock.
 *
 * Which thread runs when decides how many clock reads a waiting thread makes, which
 * worker takes which task and in what order shared state changes. So once a process
 * has a second thread, its threads take turns holding one baton: a thread runs only
 * while it holds it, and hands it on only where it would block anyway (a lock, a
 * condition, a semaphore, a futex, a sleep, a pipe read, a poll, a wait for a child,
 * sched_yield). Each time a thread takes the baton is a *grant*, numbered per process
 * (0, 1, 2...). Record logs every grant on the taking thread's `sched` stream (grant
 * number and the outcome of the call it ends); replay hands the baton out in exactly
 * that order, and a thread whose next recorded grant is for another kind of call, or
 * with another outcome, is a divergence.
 *
 * Waits between threads never block in the kernel on the real primitive, in either
 * mode: a real sem_wait or mutex lock would take ownership at a moment no grant
 * orders, and other threads could see it. Record parks the waiter on an event count
 * for the object's address (bumped by sem_post, unlock, signal), takes a grant when
 * woken and retries the non-blocking form (sem_trywait, mutex trylock) under the
 * baton; replay skips the parking (the grant order says when) and retries at the
 * recorded grant. A condition wait becomes unlock, park, relock: a wake-up POSIX
 * allows (spurious wake-ups are legal, so callers re-check their predicate).
 *
 * CPython: the GIL is a mutex and a condition like any other, but between threads
 * that run only under the baton it is never contended (CPython drops the GIL before a
 * blocking call, where the baton is released, and takes it after the call, where the
 * baton was taken), so no time-based GIL hand-off happens while taped.
 *
 * A paused thread (a Python hook at work: its network call) keeps the baton and is not
 * scheduled: replay does not make those calls. Threads it starts run off the schedule.
 *
 * A holder that does not reach a blocking call the shim sees (a busy-wait, a blocking
 * call inside glibc) would stop every other thread for ever. Record gives up on the
 * schedule after stall_ns (2 s) of such a stall: the rest of the
 * process runs unscheduled, and replay reports the point as a divergence instead of
 * replaying what was not ordered. Replay gives up (and reports) after 30 times that.
 */

#include <limits.h>
#include <linux/futex.h>

typedef struct {
    uint64_t state;   /* grant count << 32 | holder (thread index + 1, 0 = free) */
    int word;         /* bumped on every release; waiters for the baton sleep on it */
    int nreq;         /* threads waiting for the baton */
    int on;           /* a second thread exists: the schedule is in force */
    int broken;       /* record: a stall was broken, the rest runs unscheduled */
    tls_t *holder;    /* the holding thread's state (record: stall checks) */
    int dying;        /* kernel tid of a thread that ended holding the baton */
    int64_t stall_ns;
    uint32_t promised[8]; /* resume: grants the prefix gave threads that had not taken them
                           * when the process went live (grant + 1; 0 = free slot) */
} sched_t;

static sched_t S = {.stall_ns = 2000000000LL};

typedef struct { uint32_t grant; int32_t result; } schedrec_t;
_Static_assert(sizeof(schedrec_t) == 8, "sched record layout");

#define SCHED_STOLEN INT32_MIN /* the grant a stall forced: nothing after it was ordered */

typedef struct { int epoch; int waiters; } bucket_t;
static bucket_t g_bk[256];

static inline bucket_t *bucket_of(const void *p) {
    uint64_t x = ((uintptr_t)p >> 3) * 0x9E3779B97F4A7C15ULL;
    return &g_bk[x >> 56];
}

static long futex_wait(int *w, int val, const struct timespec *abs, int realtime) {
    if (!abs) return RS4(SYS_futex, w, FUTEX_WAIT_PRIVATE, val, NULL);
    return RS6(SYS_futex, w, FUTEX_WAIT_BITSET_PRIVATE | (realtime ? FUTEX_CLOCK_REALTIME : 0),
               val, abs, NULL, FUTEX_BITSET_MATCH_ANY);
}
static void futex_wake_all(int *w) { RS3(SYS_futex, w, FUTEX_WAKE_PRIVATE, INT_MAX); }

/* Wake the threads parked on p's event count (record); a no-op when nobody waits. */
static inline void sched_notify(const void *p) {
    if (LIKELY(!S.on)) return;
    bucket_t *b = bucket_of(p);
    if (__atomic_load_n(&b->waiters, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&b->epoch, 1, __ATOMIC_SEQ_CST);
        futex_wake_all(&b->epoch);
    }
}

/* Is this call ordered by the schedule? */
static inline int sched_here(void) {
    return UNLIKELY(S.on) && !S.broken && ACTIVE() && !T.sched_off;
}

static int64_t mono_ns(void) {
    struct timespec ts;
    RS2(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The next turn after a thread's end starts only once that thread is gone: glibc puts a
 * detached thread's stack in its cache on the way out and reuses it only once the kernel
 * has cleared the thread's tid, so the next thread's stack -- and pthread_self(),
 * threading.get_ident() -- would depend on how fast the exit ran. */
static void reap_dying(void) {
    int tid = S.dying;
    if (!tid) return;
    long pid = RS0(SYS_getpid);
    while (RS3(SYS_tgkill, pid, tid, 0) != -ESRCH) {
        struct timespec ts = {0, 20000};
        RS2(SYS_nanosleep, &ts, NULL);
    }
    S.dying = 0;
}

static void sched_release(tls_t *t) {
    if (!t->holding) return;
    t->holding = 0;
    uint64_t st = __atomic_load_n(&S.state, __ATOMIC_ACQUIRE);
    __atomic_store_n(&S.state, st & ~0xffffffffULL, __ATOMIC_RELEASE);
    __atomic_add_fetch(&S.word, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&S.nreq, __ATOMIC_SEQ_CST)) futex_wake_all(&S.word);
}

/* A turn the replay cannot give as recorded: report it, and stop (or, lenient, run the
 * rest unscheduled). */
static void sched_report(tls_t *t, const char *what, uint32_t grant, int op) {
    char line[512];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, "divergence\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tchannel=sched\tpos="); p = u_put(p, end, t->st[CH_SCHED].pos);
    p = s_put(p, end, "\trecorded="); p = s_put(p, end, what);
    p = s_put(p, end, " (grant "); p = u_put(p, end, grant);
    p = s_put(p, end, ")\tasked="); p = s_put(p, end, op_name(CH_SCHED, op));
    *p++ = '\n';
    if (g_reports++ < 500) append_report(line, (size_t)(p - line));
    if (!g_lenient) diverged();
    S.broken = 1; /* lenient: the rest runs unscheduled */
}

/* Record: tell the recorder a stall was broken (a line in the directory of its socket),
 * so `stenograph record` can say at once that this recording will not replay past it. */
static void note_stall(tls_t *t, uint32_t grant, int holder) {
    char path[160], line[512];
    size_t n = s_len(g_sockpath);
    while (n && g_sockpath[n - 1] != '/') n--;
    if (!n || n > 100) return;
    memcpy(path, g_sockpath, n);
    memcpy(path + n, "stalls", 7);
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, "proc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tholder="); p = u_put(p, end, (unsigned)holder);
    p = s_put(p, end, "\tturn="); p = u_put(p, end, grant);
    *p++ = '\n';
    long fd = OWN4(SYS_openat, AT_FDCWD, path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (is_err(fd)) return;
    RS3(SYS_write, fd, line, p - line);
    RS1(SYS_close, fd);
}

/* A grant the recorded prefix of a resume gave a thread that was still waiting for it
 * when the process went live: the tape already says that thread takes it, so no other
 * thread may (take_replay goes on waiting for it). */
static int promised_to_other(uint32_t grant, tls_t *t) {
    for (int i = 0; i < 8; i++) {
        uint32_t p = __atomic_load_n(&S.promised[i], __ATOMIC_ACQUIRE);
        if (p == grant + 1 && t->promised != grant + 1) return 1;
    }
    return 0;
}

/* Resume: a thread served a recorded grant promises it before live threads may take
 * grants, never after. Between tape_step and its promise a thread counts in g_stepping;
 * go_live raises g_going_live, then waits for the count to drop before the mode changes,
 * and a thread that sees g_going_live before it steps waits for the change instead (its
 * step then answers STEP_RECORD). (A thread held off the CPU between the two was seen
 * to promise a grant a live thread had just taken: it waited for it for ever, "the turn
 * never came".) */
static int g_stepping, g_going_live;

static void sched_step_begin(tls_t *t) {
    __atomic_add_fetch(&g_stepping, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g_going_live, __ATOMIC_SEQ_CST)) {
        __atomic_sub_fetch(&g_stepping, 1, __ATOMIC_SEQ_CST);
        for (int i = 0; i < 20000 && __atomic_load_n(&g_mode, __ATOMIC_SEQ_CST) == MODE_REPLAY;
             i++) {
            struct timespec ts = {0, 50000};
            RS2(SYS_nanosleep, &ts, NULL);
        }
        __atomic_add_fetch(&g_stepping, 1, __ATOMIC_SEQ_CST);
    }
    t->stepping++;
}

static void sched_step_end(tls_t *t) {
    if (!t->stepping) return;
    t->stepping--;
    __atomic_sub_fetch(&g_stepping, 1, __ATOMIC_SEQ_CST);
}

/* resume_park: the thread's step reached its tape's end, so it holds no served grant, and
 * go_live (which it may call itself) must not wait for it. */
static void sched_step_drop(tls_t *t) {
    __atomic_sub_fetch(&g_stepping, t->stepping, __ATOMIC_SEQ_CST);
    t->stepping = 0;
}

/* go_live, before the mode changes: no thread is between a served grant and its promise
 * (bounded: a signal handler run inside the step could itself wait here). */
static void sched_before_live(void) {
    __atomic_store_n(&g_going_live, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 20000 && __atomic_load_n(&g_stepping, __ATOMIC_SEQ_CST) > 0; i++) {
        struct timespec ts = {0, 50000};
        RS2(SYS_nanosleep, &ts, NULL);
    }
}

static void promise(tls_t *t, uint32_t grant, int on) {
    for (int i = 0; i < 8; i++) {
        uint32_t want = on ? 0 : grant + 1;
        if (__atomic_compare_exchange_n(&S.promised[i], &want, on ? grant + 1 : 0, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            t->promised = on ? grant + 1 : 0;
            return;
        }
    }
}

/* Record: take the baton (whoever asks first), breaking a stall; return the grant
 * number, or -1 once the schedule is broken (the caller then runs unscheduled). */
static int64_t take_record(tls_t *t, int op) {
    int64_t waited_since = 0;
    for (;;) {
        uint64_t st = __atomic_load_n(&S.state, __ATOMIC_ACQUIRE);
        if (S.broken) return -1;
        if ((uint32_t)st == 0 && !promised_to_other((uint32_t)(st >> 32), t)) {
            uint64_t nst = (((st >> 32) + 1) << 32) | (t->tindex + 1);
            if (__atomic_compare_exchange_n(&S.state, &st, nst, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                t->holding = 1;
                S.holder = t;
                reap_dying();
                return (int64_t)(st >> 32);
            }
            continue;
        }
        int w = __atomic_load_n(&S.word, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&S.nreq, 1, __ATOMIC_SEQ_CST);
        if ((uint32_t)__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) != 0) {
            struct timespec rel = {0, 100 * 1000000L};
            RS4(SYS_futex, &S.word, FUTEX_WAIT_PRIVATE, w, &rel);
        }
        __atomic_sub_fetch(&S.nreq, 1, __ATOMIC_SEQ_CST);
        int64_t now = mono_ns();
        if (!waited_since) waited_since = now;
        tls_t *h = S.holder;
        if (h && h->guard) waited_since = now; /* a paused holder is at a hooked call */
        if (now - waited_since > S.stall_ns) {
            int zero = 0;
            if (__atomic_compare_exchange_n(&S.broken, &zero, 1, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                uint64_t st_now = __atomic_load_n(&S.state, __ATOMIC_ACQUIRE);
                schedrec_t r = {(uint32_t)(st_now >> 32), SCHED_STOLEN};
                rec(t, CH_SCHED, op, &r, sizeof r);
                note_stall(t, r.grant, (int)(uint32_t)st_now - 1);
                __atomic_add_fetch(&S.word, 1, __ATOMIC_SEQ_CST);
                futex_wake_all(&S.word);
            }
            return -1;
        }
    }
}

/* take_replay's answer when a resume went live while this thread waited for a recorded
 * grant: the caller goes on as record does from there (sched_take records the grant; a
 * wait between threads retries, and a condition or futex wait ends as the spurious
 * wake-up POSIX allows). */
#define SCHED_WENT_LIVE (INT32_MIN + 1)

/* Replay: take the baton at this thread's next recorded grant, which must be for `op`;
 * return the recorded outcome. A resume that goes live while this thread waits for a
 * grant it was served still gives it that grant (the tape has it): the grant is promised
 * to it from the moment it starts waiting, live threads take the others. (Promised only
 * once the waiter woke, a loaded machine let live threads take the grant first: the
 * resumed log then had it twice and its replay stopped, "the turn never came".) */
static int32_t take_replay(tls_t *t, int op) {
    served_t s;
    schedrec_t r;
    if (UNLIKELY(g_resume)) sched_step_begin(t);
    step_t step = tape_step(t, CH_SCHED, op, NULL, 0, &s);
    if (step == STEP_SERVED && s.n >= sizeof r) {
        memcpy(&r, s.p, sizeof r);
        if (UNLIKELY(g_resume) && !t->promised && r.result != SCHED_STOLEN)
            promise(t, r.grant, 1); /* before any waiting, and before live threads take */
    }
    if (UNLIKELY(g_resume)) sched_step_end(t);
    switch (step) {
    case STEP_RECORD: return SCHED_WENT_LIVE;
    case STEP_LIVE: return 0; /* lenient: run on unscheduled */
    case STEP_SERVED: break;
    }
    if (s.n < sizeof r) return 0;
    if (r.result == SCHED_STOLEN) {
        sched_report(t, "threads ran unscheduled from here (record broke a stall: a "
                        "busy-wait or a blocking call the shim does not see)", r.grant, op);
        return 0;
    }
    int64_t last = 0;
    uint64_t seen = ~0ULL;
    for (;;) {
        uint64_t st = __atomic_load_n(&S.state, __ATOMIC_ACQUIRE);
        if (S.broken) {
            if (t->promised) promise(t, r.grant, 0);
            return r.result;
        }
        if (UNLIKELY(g_mode == MODE_RECORD) && !t->promised) { /* the process went live */
            if ((uint32_t)(st >> 32) > r.grant) return SCHED_WENT_LIVE; /* cannot be kept */
            promise(t, r.grant, 1);
        }
        if ((uint32_t)st == 0 && (uint32_t)(st >> 32) == r.grant) {
            uint64_t nst = ((uint64_t)(r.grant + 1) << 32) | (t->tindex + 1);
            if (__atomic_compare_exchange_n(&S.state, &st, nst, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                t->holding = 1;
                S.holder = t;
                if (t->promised) promise(t, r.grant, 0);
                reap_dying();
                return r.result;
            }
            continue;
        }
        int w = __atomic_load_n(&S.word, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&S.nreq, 1, __ATOMIC_SEQ_CST);
        st = __atomic_load_n(&S.state, __ATOMIC_ACQUIRE);
        if (!((uint32_t)st == 0 && (uint32_t)(st >> 32) == r.grant)) {
            struct timespec rel = {0, 100 * 1000000L};
            RS4(SYS_futex, &S.word, FUTEX_WAIT_PRIVATE, w, &rel);
        }
        __atomic_sub_fetch(&S.nreq, 1, __ATOMIC_SEQ_CST);
        int64_t now = mono_ns();
        if (st != seen) { seen = st; last = now; }
        if (now - last > 30 * S.stall_ns) {
            if (t->promised) promise(t, r.grant, 0);
            sched_report(t, "the turn never came: the thread holding it did not reach the "
                            "blocking call it made when recorded", r.grant, op);
            return r.result;
        }
    }
}

/* Take the baton after a blocking call whose outcome was `result` (record), or at the
 * recorded grant (replay, which returns the recorded outcome). */
static int32_t sched_take(tls_t *t, int op, int32_t result) {
    t->clock_run = 0;
    if (g_mode == MODE_REPLAY) {
        int32_t r = take_replay(t, op);
        if (r != SCHED_WENT_LIVE) return r;
    }
    int64_t g = take_record(t, op);
    if (g >= 0) {
        schedrec_t r = {(uint32_t)g, result};
        rec(t, CH_SCHED, op, &r, sizeof r);
    }
    return result;
}

/* A wait for another thread on `obj`: `try` is the non-blocking form (0 = got it,
 * EAGAIN = not yet, anything else = an error to return). `abs` is an absolute deadline
 * on `clk` (NULL: none). Called holding the baton; returns holding it. */
typedef int (*try_fn)(void *obj);

#define SCHED_REAL (-1) /* the schedule is off (broken): the caller waits for real */

static long park(bucket_t *b, int e, const struct timespec *abs, int clk) {
    if (!abs || clk == CLOCK_REALTIME || clk == CLOCK_MONOTONIC)
        return futex_wait(&b->epoch, e, abs, abs && clk == CLOCK_REALTIME);
    struct timespec now, at;  /* another clock: the same distance on the monotonic one */
    RS2(SYS_clock_gettime, clk, &now);
    int64_t left = (abs->tv_sec - now.tv_sec) * 1000000000LL + abs->tv_nsec - now.tv_nsec;
    RS2(SYS_clock_gettime, CLOCK_MONOTONIC, &now);
    int64_t at_ns = now.tv_sec * 1000000000LL + now.tv_nsec + (left > 0 ? left : 0);
    at.tv_sec = at_ns / 1000000000LL;
    at.tv_nsec = at_ns % 1000000000LL;
    return futex_wait(&b->epoch, e, &at, 0);
}

/* Process-shared objects (sem_open, PTHREAD_PROCESS_SHARED: multiprocessing's locks and
 * queues) are posted by another process, which no event count here hears. So even the
 * first try of a wait on one is taken at a grant, record parks at most a poll interval
 * at a time (doubling up to SHARED_POLL_MAX) before it retries, and replay never tries
 * at a grant recorded "not yet"; at one recorded "got it" it waits for the object (the
 * other process, replayed too, posts at its own pace). glibc's layouts: a semaphore's
 * `private` word is 0 unless shared (glibc's LLL_SHARED is the futex private flag: it
 * is XORed into the op), a mutex's kind has
 * PTHREAD_MUTEX_PSHARED_BIT, a condition's __wrefs bit 0. */
#define SHARED_POLL_MIN 50000LL    /* ns */
#define SHARED_POLL_MAX 5000000LL
static int sem_shared(const sem_t *s) { return ((const int *)s)[2] != 0; }
static int mutex_shared(const pthread_mutex_t *m) { return (m->__data.__kind & 128) != 0; }
static int cond_shared(const pthread_cond_t *c) { return c->__data.__wrefs & 1; }

/* Nanoseconds until `abs` on `clk`. */
static int64_t left_ns(const struct timespec *abs, int clk) {
    struct timespec now;
    RS2(SYS_clock_gettime, clk, &now);
    return (abs->tv_sec - now.tv_sec) * 1000000000LL + abs->tv_nsec - now.tv_nsec;
}

/* park() for a shared object: 0 when the poll interval ended it. */
static long park_shared(bucket_t *b, int e, const struct timespec *abs, int clk, int64_t *poll) {
    int64_t wait = *poll;
    if (*poll < SHARED_POLL_MAX) *poll *= 2;
    if (abs && left_ns(abs, clk) <= wait) return park(b, e, abs, clk);
    int64_t until = mono_ns() + wait;
    struct timespec at = {until / 1000000000LL, until % 1000000000LL};
    long r = futex_wait(&b->epoch, e, &at, 0);
    return r == -ETIMEDOUT ? 0 : r;
}

/* Replay, at a grant recorded "got it" on a shared object: try until the other process
 * has posted; EAGAIN if it never does (a divergence the caller reports). */
static int await_shared(void *obj, int (*try)(void *)) {
    int64_t start = mono_ns(), ns = 20000;
    for (;;) {
        int r = try(obj);
        if (r != EAGAIN || mono_ns() - start > 30 * S.stall_ns) return r;
        struct timespec ts = {0, ns};
        RS2(SYS_nanosleep, &ts, NULL);
        if (ns < 2000000) ns *= 2;
    }
}

/* Record: take a grant, retry the non-blocking form under it, tape both; SCHED_REAL
 * (unregistered) once the schedule is broken. */
static int retry_at_grant(tls_t *t, int op, bucket_t *b, int *e, void *obj, try_fn try) {
    int64_t g = take_record(t, op);
    if (g < 0) {
        __atomic_sub_fetch(&b->waiters, 1, __ATOMIC_SEQ_CST);
        return SCHED_REAL;
    }
    *e = __atomic_load_n(&b->epoch, __ATOMIC_SEQ_CST);
    int r = try(obj);
    schedrec_t sr = {(uint32_t)g, r};
    rec(t, CH_SCHED, op, &sr, sizeof sr);
    return r;
}

static int sched_wait_for(tls_t *t, int op, void *obj, try_fn try, const struct timespec *abs,
                          int clk, int shared) {
    bucket_t *b = bucket_of(obj);
    int recording = g_mode == MODE_RECORD, e = 0, fresh = shared;
    int64_t poll = SHARED_POLL_MIN;
    if (recording) { /* registered before the first try: a wake-up between is not lost */
        __atomic_add_fetch(&b->waiters, 1, __ATOMIC_SEQ_CST);
        e = __atomic_load_n(&b->epoch, __ATOMIC_SEQ_CST);
    }
    int r = shared ? EAGAIN : try(obj);
    for (;;) {
        if (r != EAGAIN) {
            if (recording) __atomic_sub_fetch(&b->waiters, 1, __ATOMIC_SEQ_CST);
            return r;
        }
        sched_release(t);
        if (recording) {
            long fr = fresh ? 0 : shared ? park_shared(b, e, abs, clk, &poll) : park(b, e, abs, clk);
            fresh = 0;
            if (fr == -ETIMEDOUT) {
                __atomic_sub_fetch(&b->waiters, 1, __ATOMIC_SEQ_CST);
                sched_take(t, op, ETIMEDOUT);
                return ETIMEDOUT;
            }
            if ((r = retry_at_grant(t, op, b, &e, obj, try)) == SCHED_REAL) return SCHED_REAL;
            continue;
        }
        int32_t want = take_replay(t, op);
        if (want == SCHED_WENT_LIVE) { /* a resume went live: on as record does */
            recording = 1;
            __atomic_add_fetch(&b->waiters, 1, __ATOMIC_SEQ_CST);
            if ((r = retry_at_grant(t, op, b, &e, obj, try)) == SCHED_REAL) return SCHED_REAL;
            continue;
        }
        if (S.broken) return SCHED_REAL;
        if (want == ETIMEDOUT) return ETIMEDOUT;
        r = !shared ? try(obj) : want == 0 ? await_shared(obj, try) : want;
        if (r != want) {
            sched_report(t, want == 0 ? "the wait was over" : "the wait was not over yet",
                         (uint32_t)t->st[CH_SCHED].pos, op);
        }
    }
}

/* ------------------------------------------------------------------ gated primitives */

static int try_mutex(void *m) {
    RESOLVE(pthread_mutex_trylock);
    int r = real_pthread_mutex_trylock((pthread_mutex_t *)m);
    return r == EBUSY ? EAGAIN : r;
}

static int try_sem(void *s) {
    RESOLVE(sem_trywait);
    return real_sem_trywait((sem_t *)s) == 0 ? 0 : (errno == EAGAIN ? EAGAIN : errno);
}

/* A non-blocking try on a shared object: its outcome is the other process's timing, so
 * it is one turn (record tapes the outcome, replay serves it). */
static int try_shared_turn(tls_t *t, int op, void *obj, try_fn try) {
    sched_release(t);
    if (g_mode == MODE_REPLAY) {
        int32_t want = take_replay(t, op);
        if (want != SCHED_WENT_LIVE) {
            int r = want == 0 ? await_shared(obj, try) : want;
            if (r != want) {
                sched_report(t, "the wait was over", (uint32_t)t->st[CH_SCHED].pos, op);
            }
            return r;
        }
    }
    int64_t g = take_record(t, op);
    int r = try(obj);
    if (g >= 0) {
        schedrec_t sr = {(uint32_t)g, r};
        rec(t, CH_SCHED, op, &sr, sizeof sr);
    }
    return r;
}

static int mutex_gated(pthread_mutex_t *m, const struct timespec *abs, int clk) {
    int shared = mutex_shared(m), r = shared ? EAGAIN : try_mutex(m);
    if (r != EAGAIN) return r;
    if (m->__data.__owner == (int)RS0(SYS_gettid)) { /* relock by the owner: its own answer */
        RESOLVE(pthread_mutex_lock);
        return real_pthread_mutex_lock(m);
    }
    r = sched_wait_for(&T, OP_SCHED_MUTEX, m, try_mutex, abs, clk, shared);
    if (r != SCHED_REAL) return r;
    if (abs) {
        RESOLVE(pthread_mutex_clocklock);
        return real_pthread_mutex_clocklock(m, (clockid_t)clk, abs);
    }
    RESOLVE(pthread_mutex_lock);
    return real_pthread_mutex_lock(m);
}

EXPORT int pthread_mutex_lock(pthread_mutex_t *m) {
    if (LIKELY(!sched_here())) {
        RESOLVE(pthread_mutex_lock);
        return real_pthread_mutex_lock(m);
    }
    return mutex_gated(m, NULL, 0);
}

EXPORT int pthread_mutex_trylock(pthread_mutex_t *m) {
    if (LIKELY(!sched_here()) || !mutex_shared(m)) {
        RESOLVE(pthread_mutex_trylock);
        return real_pthread_mutex_trylock(m);
    }
    int r = try_shared_turn(&T, OP_SCHED_MUTEX, m, try_mutex);
    return r == EAGAIN ? EBUSY : r;
}

EXPORT int pthread_mutex_unlock(pthread_mutex_t *m) {
    RESOLVE(pthread_mutex_unlock);
    int r = real_pthread_mutex_unlock(m);
    sched_notify(m);
    return r;
}

/* Replay, unscheduled: an absolute deadline computed from served clocks, in real time. */
static const struct timespec *translate_deadline(int clk, const struct timespec *abs,
                                                 struct timespec *out);

EXPORT int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *a) {
    if (sched_here()) return mutex_gated(m, a, CLOCK_REALTIME);
    RESOLVE(pthread_mutex_timedlock);
    struct timespec tr;
    return real_pthread_mutex_timedlock(m, translate_deadline(CLOCK_REALTIME, a, &tr));
}

EXPORT int pthread_mutex_clocklock(pthread_mutex_t *m, clockid_t k, const struct timespec *a) {
    if (sched_here()) return mutex_gated(m, a, (int)k);
    RESOLVE(pthread_mutex_clocklock);
    struct timespec tr;
    return real_pthread_mutex_clocklock(m, k, translate_deadline((int)k, a, &tr));
}

/* glibc keeps a condition's clock in bit 1 of __wrefs (0 realtime, 1 monotonic). */
static int cond_clock(const pthread_cond_t *c) {
    return (c->__data.__wrefs >> 1) & 1 ? CLOCK_MONOTONIC : CLOCK_REALTIME;
}

static int cond_gated(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *abs,
                      int clk) {
    tls_t *t = &T;
    bucket_t *b = bucket_of(c);
    int e = 0;
    if (g_mode == MODE_RECORD) {
        __atomic_add_fetch(&b->waiters, 1, __ATOMIC_SEQ_CST);
        e = __atomic_load_n(&b->epoch, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(m);
    sched_release(t);
    int32_t res;
    if (g_mode == MODE_RECORD) {
        int64_t poll = SHARED_POLL_MAX; /* shared: the wake-up ends as a spurious one */
        long fr = cond_shared(c) ? park_shared(b, e, abs, clk, &poll)
                                 : futex_wait(&b->epoch, e, abs, abs && clk == CLOCK_REALTIME);
        __atomic_sub_fetch(&b->waiters, 1, __ATOMIC_SEQ_CST);
        res = fr == -ETIMEDOUT ? ETIMEDOUT : 0;
        sched_take(t, OP_SCHED_COND, res);
    } else {
        res = take_replay(t, OP_SCHED_COND);
        if (res == SCHED_WENT_LIVE) res = sched_take(t, OP_SCHED_COND, 0);
    }
    int r = sched_here() ? mutex_gated(m, NULL, 0) : pthread_mutex_lock(m);
    return r ? r : res;
}

EXPORT int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m) {
    if (sched_here()) return cond_gated(c, m, NULL, 0);
    RESOLVE(pthread_cond_wait);
    return real_pthread_cond_wait(c, m);
}

EXPORT int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *a) {
    if (sched_here()) return cond_gated(c, m, a, cond_clock(c));
    RESOLVE(pthread_cond_timedwait);
    struct timespec tr;
    return real_pthread_cond_timedwait(c, m, translate_deadline(-1, a, &tr));
}

EXPORT int pthread_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *m, clockid_t k,
                                  const struct timespec *a) {
    if (sched_here()) return cond_gated(c, m, a, (int)k);
    RESOLVE(pthread_cond_clockwait);
    struct timespec tr;
    return real_pthread_cond_clockwait(c, m, k, translate_deadline((int)k, a, &tr));
}

EXPORT int pthread_cond_signal(pthread_cond_t *c) {
    RESOLVE(pthread_cond_signal);
    int r = real_pthread_cond_signal(c);
    sched_notify(c);
    return r;
}

EXPORT int pthread_cond_broadcast(pthread_cond_t *c) {
    RESOLVE(pthread_cond_broadcast);
    int r = real_pthread_cond_broadcast(c);
    sched_notify(c);
    return r;
}

static int sem_gated(sem_t *s, const struct timespec *abs, int clk) {
    int r = sched_wait_for(&T, OP_SCHED_SEM, s, try_sem, abs, clk, sem_shared(s));
    if (r == SCHED_REAL) {
        RESOLVE(sem_wait); RESOLVE(sem_clockwait);
        return abs ? real_sem_clockwait(s, (clockid_t)clk, abs) : real_sem_wait(s);
    }
    if (r) { errno = r; return -1; }
    return 0;
}

/* Replay, a wait on a semaphore shared with other processes outside the schedule (a
 * single-threaded pool worker waiting for the task queue's lock): in slices, so that a
 * death the replayed killer sent (pool.terminate()'s SIGTERM, deferred to this process's
 * tape end) ends it once its tape is spent -- the recorded worker died waiting here, and
 * a wait that never returns never reaches the tape end the death waits for. A process
 * whose recording went past this wait to its exit, still waiting after
 * SHARED_WAIT_LIMIT_NS, has diverged: its peers took the lock in another order (the pool's main process holds
 * the queue's lock to drain it while this worker never got its sentinel), and its
 * parent waits for it for ever. */
#define SHARED_WAIT_LIMIT_NS (20 * 1000000000LL)
static int sem_wait_killable(sem_t *s) {
    RESOLVE(sem_timedwait);
    int64_t since = mono_ns();
    for (;;) {
        if (g_deferred_kill && tape_spent(&T)) die_as_recorded(g_deferred_kill);
        /* the recording went on from here to its exit, untaped; this one is held by
         * another process that took what it took in another order (a pool's other
         * worker, its main process draining the queue): a divergence, said, not a hang */
        if (mono_ns() - since > SHARED_WAIT_LIMIT_NS && recorded_exit())
            sched_report(&T, "the process went on to its exit", (uint32_t)T.st[CH_SCHED].pos,
                         OP_SCHED_SEM);
        struct timespec at;
        RS2(SYS_clock_gettime, CLOCK_REALTIME, &at);
        at.tv_nsec += 100 * 1000000L;
        if (at.tv_nsec >= 1000000000L) at.tv_sec++, at.tv_nsec -= 1000000000L;
        int r = real_sem_timedwait(s, &at);
        if (r == 0 || errno != ETIMEDOUT) return r;
    }
}

EXPORT int sem_wait(sem_t *s) {
    if (sched_here()) return sem_gated(s, NULL, 0);
    if (UNLIKELY(g_mode == MODE_REPLAY) && sem_shared(s)) return sem_wait_killable(s);
    RESOLVE(sem_wait);
    return real_sem_wait(s);
}

EXPORT int sem_timedwait(sem_t *s, const struct timespec *a) {
    if (sched_here()) return sem_gated(s, a, CLOCK_REALTIME);
    RESOLVE(sem_timedwait);
    struct timespec tr;
    return real_sem_timedwait(s, translate_deadline(CLOCK_REALTIME, a, &tr));
}

EXPORT int sem_clockwait(sem_t *s, clockid_t k, const struct timespec *a) {
    if (sched_here()) return sem_gated(s, a, (int)k);
    RESOLVE(sem_clockwait);
    struct timespec tr;
    return real_sem_clockwait(s, k, translate_deadline((int)k, a, &tr));
}

EXPORT int sem_trywait(sem_t *s) {
    if (LIKELY(!sched_here()) || !sem_shared(s)) {
        RESOLVE(sem_trywait);
        return real_sem_trywait(s);
    }
    int r = try_shared_turn(&T, OP_SCHED_SEM, s, try_sem);
    if (r) { errno = r; return -1; }
    return 0;
}

EXPORT int sem_post(sem_t *s) {
    RESOLVE(sem_post);
    int r = real_sem_post(s);
    sched_notify(s);
    return r;
}

/* An external wait (sleep, I/O, a child, a thread's exit): release the baton around
 * the real (record) or served (replay) call, then take a grant. */
static inline int gate_out(void) {
    int forced = T.gate_next;
    T.gate_next = 0;
    if (!sched_here() && !(forced && g_mode && S.on && !S.broken && !T.sched_off)) return 0;
    sched_release(&T);
    return 1;
}

static inline void gate_in(int gated, int op, int32_t result) {
    if (gated) sched_take(&T, op, result);
}

/* The one shape of every external wait: the taped call between a release and a take
 * (`when`: the call can block at all). errno is the call's. */
#define GATED(op, when, call)                                  \
    __extension__({                                            \
        int g_ = (when) ? gate_out() : 0;                      \
        __typeof__(call) r_ = (call);                          \
        if (g_) { int e_ = errno; gate_in(g_, op, 0); errno = e_; } \
        r_;                                                    \
    })

EXPORT int pthread_join(pthread_t th, void **ret) {
    RESOLVE(pthread_join);
    return GATED(OP_SCHED_JOIN, 1, real_pthread_join(th, ret));
}

/* A thread that waits for another by reading the clock in a loop (Node's main thread as
 * it ends, waiting for a worker) never blocks, so the baton never goes to the thread it
 * waits for. Every SPIN_RUN taped clock reads with no turn between, it hands the baton on
 * and takes a turn (OP_SCHED_SPIN): a point that depends only on the thread's own calls,
 * so replay comes to it at the same read, and takes the turn when the tape has it there
 * (a tape made before these turns has none: no turn). */
#define SPIN_RUN 4096

static void clock_spin(tls_t *t) {
    if (LIKELY(++t->clock_run < SPIN_RUN)) return;
    t->clock_run = 0;
    if (g_mode == MODE_REPLAY && tape_peek(t, CH_SCHED, OP_SCHED_SPIN, NULL, 0) != 1) return;
    int g = gate_out();
    gate_in(g, OP_SCHED_SPIN, 0);
}

EXPORT int sched_yield(void) {
    RESOLVE(sched_yield);
    int g = gate_out();
    int r = g_mode == MODE_REPLAY && g ? 0 : real_sched_yield();
    gate_in(g, OP_SCHED_YIELD, 0);
    return r;
}

/* futex(2) through syscall() (Rust's std, and anything else that parks on a word).
 * Record waits for real; replay returns the recorded outcome at the recorded grant
 * (a futex wait may return spuriously: callers re-check their word). */
static long sched_futex(long a, long b, long c, long d, long e, long f) {
    int cmd = (int)b & FUTEX_CMD_MASK;
    if ((cmd != FUTEX_WAIT && cmd != FUTEX_WAIT_BITSET) || !sched_here())
        return rsys(SYS_futex, a, b, c, d, e, f);
    sched_release(&T);
    long r = 0;
    if (g_mode == MODE_RECORD) {
        r = rsys(SYS_futex, a, b, c, d, e, f);
        sched_take(&T, OP_SCHED_FUTEX, (int32_t)r);
    } else {
        r = take_replay(&T, OP_SCHED_FUTEX);
        if (r == SCHED_WENT_LIVE) r = sched_take(&T, OP_SCHED_FUTEX, 0);
    }
    return r;
}

/* ------------------------------------------------------------------ thread lifetime */

/* The first on-schedule thread start turns the schedule on, with the creator holding. */
static void sched_thread_created(void) {
    if (S.on || !g_mode || g_build) return; /* build replay: threads run unscheduled */
    tls_t *t = me();
    __atomic_store_n(&S.state, (uint64_t)(t->tindex + 1), __ATOMIC_RELEASE);
    t->holding = 1;
    S.holder = t;
    __atomic_store_n(&S.on, 1, __ATOMIC_RELEASE);
}

static void sched_thread_start(void) {
    if (sched_here()) sched_take(&T, OP_SCHED_START, 0);
}

static void sched_thread_end(void) {
    if (T.holding) S.dying = (int)RS0(SYS_gettid);
    sched_release(&T);
    T.sched_off = 1;
}

EXPORT void pthread_exit(void *ret) {
    RESOLVE(pthread_exit);
    if (g_mode) sched_thread_end();
    if (T.counted) __atomic_sub_fetch(&g_live_threads, 1, __ATOMIC_SEQ_CST);
    T.counted = 0;
    real_pthread_exit(ret);
    __builtin_unreachable();
}

static void sched_after_fork_child(void) {
    int64_t stall = S.stall_ns;
    memset(&S, 0, sizeof S);
    S.stall_ns = stall;
    memset(g_bk, 0, sizeof g_bk);
    T.holding = 0;
    g_stepping = T.stepping; /* only this thread came along */
    g_peer_waits = T.peer_waits;
}

/* Only a call that can block hands the baton on. One that cannot (a non-blocking socket,
 * MSG_DONTWAIT) keeps it: released, whether it found data or EAGAIN would depend on
 * whether another thread's write came first -- asyncio's self-pipe drain loops on recv
 * until EAGAIN, so the number of its recvs was timing -- and nothing tapes that. */
static int may_block(int fd, int flags) {
    if (flags & MSG_DONTWAIT) return 0;
    long fl = RS2(SYS_fcntl, fd, F_GETFL);
    return is_err(fl) || !(fl & O_NONBLOCK);
}

