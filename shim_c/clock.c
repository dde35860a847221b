/* Channel clock: clock_gettime, gettimeofday, time, timespec_get, clock. */

typedef struct { int32_t arg; int32_t rc; int64_t a; int64_t b; } clockrec_t;
_Static_assert(sizeof(clockrec_t) == 24, "clock payload: i32 arg | i32 rc | i64 a | i64 b");

/* The hot path of record mode: one fixed-size clock record appended to this thread's
 * ring with constant-size copies the compiler inlines; anything unusual (no ring yet,
 * a nudge mark to pass -- the ring's end is one --, a full ring, a handler's records
 * pending) takes rec(). */
static inline void rec_clock(tls_t *t, int op, const clockrec_t *r) {
    ring_t *b = t->tb;
    if (LIKELY(b != NULL) && LIKELY(!t->sigpend_n)) {
        inshim_enter(); /* before reading head: a handler's record must not be overwritten */
        uint64_t at = b->head, end = at + 8 + sizeof *r;
        if (LIKELY(NUDGE_BLOCK(at) == NUDGE_BLOCK(end)) &&
            LIKELY(end - __atomic_load_n(&b->tail, __ATOMIC_ACQUIRE) <= RING_CAP)) {
            unsigned char *w = b->data + (at & RING_MASK);
            uint32_t head = (uint32_t)CH_CLOCK | (uint32_t)op << 8 | (uint32_t)t->site << 16;
            uint32_t n = sizeof *r;
            t->site = 0;
            memcpy(w, &head, 4);
            memcpy(w + 4, &n, 4);
            memcpy(w + 8, r, sizeof *r);
            __atomic_store_n(&b->head, end, __ATOMIC_RELEASE);
            inshim_leave();
            t->nrec++; /* as rec2 counts (signals.c) */
            t->sigk = 0;
            return;
        }
        inshim_leave();
    }
    rec(t, CH_CLOCK, op, r, sizeof *r);
}

/* Last value served per clock id (replay). Absolute deadlines a program computes from
 * served clocks are in the recording's time; waits that libc times against the real
 * clock (condition variables, semaphores) get them translated, or they would expire at
 * once (or never) and change how often the program reads its clocks. */
static int64_t g_served_ns[16];

/* Resume: once the recorded prefix has been served and the process goes live, a clock
 * whose live value is behind the last one served (another boot, another machine) is
 * shifted forward by the difference, so the program never sees time run backwards; the
 * shifted values are what is taped. Absolute deadlines the program then computes are in
 * shifted time and are shifted back before they reach the kernel (clock_unshift). */
static int g_clock_shift;
static int64_t g_shift_ns[16];

static void clock_go_live(void) {
    for (int id = 0; id < 16; id++) {
        struct timespec now;
        if (!g_served_ns[id] || id == CLOCK_THREAD_CPUTIME_ID) continue;
        if (is_err(RS2(SYS_clock_gettime, id, &now))) continue;
        int64_t behind = g_served_ns[id] - (now.tv_sec * 1000000000LL + now.tv_nsec);
        if (behind > 0) { g_shift_ns[id] = behind + 1000; g_clock_shift = 1; }
    }
}

/* Build replay: a live read after a served one continues from it (1 us later), at the
 * real clock's pace, until the next served value re-anchors the clock. */
static int64_t g_anchor_ns[16];
static void build_anchor(int id, const struct timespec *real) {
    int64_t s = g_served_ns[id];
    if (!s || s == g_anchor_ns[id] || id == CLOCK_THREAD_CPUTIME_ID ||
        id == CLOCK_PROCESS_CPUTIME_ID)
        return;
    g_anchor_ns[id] = s;
    int64_t shift = s - (real->tv_sec * 1000000000LL + real->tv_nsec) + 1000;
    g_shift_ns[id] = shift ? shift : 1;
}

static inline void clock_shift(int id, struct timespec *ts) {
    if ((unsigned)id >= 16) return;
    if (UNLIKELY(g_build)) build_anchor(id, ts);
    if (!g_shift_ns[id]) return;
    int64_t v = ts->tv_sec * 1000000000LL + ts->tv_nsec + g_shift_ns[id];
    ts->tv_sec = v / 1000000000LL;
    ts->tv_nsec = v % 1000000000LL;
}

static const struct timespec *clock_unshift(int id, const struct timespec *abs,
                                            struct timespec *out) {
    if ((unsigned)id >= 16 || !g_shift_ns[id]) return abs;
    int64_t v = abs->tv_sec * 1000000000LL + abs->tv_nsec - g_shift_ns[id];
    out->tv_sec = v / 1000000000LL;
    out->tv_nsec = v % 1000000000LL;
    return out;
}

/* Bookkeeping reads: clock reads made inside an interpreter's own deadline helpers, whose
 * value only ever becomes the deadline of a wait the shim itself wraps (whose outcome is
 * on the tape) or is subtracted from another such read. CPython 3.11 reads CLOCK_MONOTONIC
 * on every lock acquisition, even an uncontended one (PyThread_acquire_lock_timed computes
 * a deadline first), and on every first use of an interned identifier: most of a Python
 * program's clock reads, and ones made wherever the interpreter happens to take a lock --
 * inside a hook's real network call at record, in the program at replay -- so taping them
 * makes replay depend on what the hooks did. They go live and untaped; the next wait's
 * deadline is then live too and is not translated (T.live_deadline). The helpers are found
 * by name (dynamic symbols) in whatever interpreter the process runs. */
static const char *const BOOKKEEPING[] = {
    "_PyTime_GetMonotonicClock", /* 3.10-3.12: _PyDeadline_*, lock waits, socket timeouts */
    "PyTime_MonotonicRaw",       /* 3.13: the same role, plus PyMutex and semaphores */
    "PyThread_acquire_lock_timed", /* 3.10: reads the clock itself */
};
#define NBOOK (sizeof BOOKKEEPING / sizeof *BOOKKEEPING)
static uintptr_t g_book_lo[NBOOK], g_book_hi[NBOOK];
static int g_book_ready;

static void bookkeeping_resolve(void) {
    for (size_t i = 0; i < NBOOK; i++) {
        void *p = dlsym(RTLD_DEFAULT, BOOKKEEPING[i]);
        Dl_info info;
        const ElfW(Sym) *sym = NULL;
        if (p && dladdr1(p, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size) {
            g_book_lo[i] = (uintptr_t)p;
            g_book_hi[i] = (uintptr_t)p + sym->st_size;
        }
    }
    __atomic_store_n(&g_book_ready, 1, __ATOMIC_RELEASE);
}

static inline int bookkeeping(uintptr_t ra) {
    if (UNLIKELY(!__atomic_load_n(&g_book_ready, __ATOMIC_ACQUIRE))) bookkeeping_resolve();
    for (size_t i = 0; i < NBOOK; i++)
        if (ra - g_book_lo[i] < g_book_hi[i] - g_book_lo[i]) return 1;
    return 0;
}

static void clock_spin(tls_t *t); /* sched.c: a turn now and then in a run of clock reads */

static inline int clock_gettime_at(uintptr_t ra, clockid_t id, struct timespec *ts) {
    if (UNLIKELY(!real_clock_gettime)) RESOLVE(clock_gettime);
    if (!CLOCK_ACTIVE()) return real_clock_gettime(id, ts);
    tls_t *t = me();
    if (bookkeeping(ra)) {
        t->live_deadline = 1;
        return real_clock_gettime(id, ts);
    }
    t->live_deadline = 0;
    t->site = SITE_OF(ra);
    int32_t arg = (int32_t)id;
    served_t s;
    int rc;
    switch (tape_step(t, CH_CLOCK, OP_CLOCK_GETTIME, &arg, 4, &s)) {
    case STEP_SERVED: {
        clockrec_t r;
        memcpy(&r, s.p, sizeof r);
        if (r.rc) { errno = -r.rc; return -1; }
        ts->tv_sec = r.a;
        ts->tv_nsec = r.b;
        if ((unsigned)id < 16) g_served_ns[id] = r.a * 1000000000LL + r.b;
        clock_spin(t);
        return 0;
    }
    case STEP_LIVE:
        rc = real_clock_gettime(id, ts);
        if (UNLIKELY(g_build) && !rc) clock_shift(id, ts);
        return rc;
    case STEP_RECORD:
        break;
    }
    rc = real_clock_gettime(id, ts);
    if (UNLIKELY(g_clock_shift) && !rc) clock_shift(id, ts);
    clockrec_t r = {arg, rc ? -errno : 0, rc ? 0 : ts->tv_sec, rc ? 0 : ts->tv_nsec};
    rec_clock(t, OP_CLOCK_GETTIME, &r);
    clock_spin(t);
    return rc;
}
EXPORT int clock_gettime(clockid_t id, struct timespec *ts) {
    return clock_gettime_at(RETURN_ADDRESS(), id, ts);
}
EXPORT int __clock_gettime(clockid_t id, struct timespec *ts) {
    return clock_gettime_at(RETURN_ADDRESS(), id, ts);
}

/* The clock ops that are not clock_gettime: the step, with the record when served; the
 * wrapper makes the call unless served, and tapes it (clock_rec) when the step says so. */
static step_t clock_step(uint16_t site, int op, int32_t arg, clockrec_t *r) {
    tls_t *t = me();
    t->site = site;
    t->live_deadline = 0;
    served_t s;
    step_t step = tape_step(t, CH_CLOCK, op, &arg, 4, &s);
    if (step == STEP_SERVED) memcpy(r, s.p, sizeof *r);
    return step;
}

static void clock_rec(uint16_t site, int op, int32_t arg, int32_t rc, int64_t a, int64_t b) {
    clockrec_t r = {arg, rc, a, b};
    tls_t *t = me();
    t->site = site;
    rec(t, CH_CLOCK, op, &r, sizeof r);
}

EXPORT int gettimeofday(struct timeval *tv, void *tz) {
    RESOLVE(gettimeofday);
    if (!CLOCK_ACTIVE() || (void *)tv == g_null) return real_gettimeofday(tv, tz);
    uint16_t site = CALL_SITE();
    clockrec_t c;
    step_t step = clock_step(site, OP_GETTIMEOFDAY, 0, &c);
    if (step == STEP_SERVED) {
        if (tz) memset(tz, 0, sizeof(struct timezone));
        if (c.rc) { errno = -c.rc; return -1; }
        tv->tv_sec = c.a;
        tv->tv_usec = c.b;
        g_served_ns[CLOCK_REALTIME] = c.a * 1000000000LL + c.b * 1000;
        return 0;
    }
    int r = real_gettimeofday(tv, tz);
    if (UNLIKELY(g_clock_shift) && !r) {
        struct timespec ts = {tv->tv_sec, tv->tv_usec * 1000};
        clock_shift(CLOCK_REALTIME, &ts);
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    if (step == STEP_RECORD) clock_rec(site, OP_GETTIMEOFDAY, 0, r ? -errno : 0, tv->tv_sec, tv->tv_usec);
    return r;
}

EXPORT time_t time(time_t *out) {
    RESOLVE(time);
    if (!CLOCK_ACTIVE()) return real_time(out);
    uint16_t site = CALL_SITE();
    clockrec_t c;
    step_t step = clock_step(site, OP_TIME, 0, &c);
    if (step == STEP_SERVED) {
        if (out) *out = (time_t)c.a;
        g_served_ns[CLOCK_REALTIME] = c.a * 1000000000LL;
        return (time_t)c.a;
    }
    time_t v = real_time(out);
    if (UNLIKELY(g_clock_shift)) {
        struct timespec ts = {v, 0};
        clock_shift(CLOCK_REALTIME, &ts);
        v = ts.tv_sec;
        if (out) *out = v;
    }
    if (step == STEP_RECORD) clock_rec(site, OP_TIME, 0, 0, v, 0);
    return v;
}

EXPORT int timespec_get(struct timespec *ts, int base) {
    RESOLVE(timespec_get);
    if (!CLOCK_ACTIVE()) return real_timespec_get(ts, base);
    uint16_t site = CALL_SITE();
    clockrec_t c;
    step_t step = clock_step(site, OP_TIMESPEC_GET, base, &c);
    if (step == STEP_SERVED) {
        if (c.rc) { ts->tv_sec = c.a; ts->tv_nsec = c.b; }
        return c.rc;
    }
    int r = real_timespec_get(ts, base);
    if (UNLIKELY(g_clock_shift) && r == TIME_UTC) clock_shift(CLOCK_REALTIME, ts);
    if (step == STEP_RECORD) clock_rec(site, OP_TIMESPEC_GET, base, r, r ? ts->tv_sec : 0, r ? ts->tv_nsec : 0);
    return r;
}

EXPORT clock_t clock(void) {
    RESOLVE(clock);
    if (!CLOCK_ACTIVE()) return real_clock();
    uint16_t site = CALL_SITE();
    clockrec_t c;
    step_t step = clock_step(site, OP_CLOCK, 0, &c);
    if (step == STEP_SERVED) return (clock_t)c.a;
    clock_t v = real_clock();
    if (step == STEP_RECORD) clock_rec(site, OP_CLOCK, 0, 0, v, 0);
    return v;
}
