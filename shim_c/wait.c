/* Channel wait: sleeps, poll/select/epoll timeouts, and the translation of absolute
 * deadlines given to cond/sem/mutex timed waits (replay). */

/* Payloads; the arguments are the fields before rc (before timed_out for the waits). */
typedef struct { int64_t sec, nsec; int32_t rc, pad; int64_t rsec, rnsec; } sleeprec_t;
typedef struct { int32_t clock, flags; int64_t sec, nsec; int32_t rc, pad; int64_t rsec, rnsec; } csleeprec_t;
typedef struct { uint32_t secs, rc; } secsrec_t; /* sleep */
typedef struct { uint32_t usec; int32_t rc; } usrec_t; /* usleep */
typedef struct { int32_t timeout_ms; uint32_t nfds; } pollargs_t; /* then i32 timed_out */
typedef struct { int32_t nfds, zero; int64_t timeout_us; } selargs_t; /* then i32 timed_out */
typedef struct { int32_t timeout_ms, maxevents; } epollargs_t; /* then i32 timed_out */
_Static_assert(sizeof(sleeprec_t) == 40 && offsetof(sleeprec_t, rc) == 16,
               "OP_NANOSLEEP payload: i64 sec | i64 nsec | i32 rc | i32 0 | i64 rem sec | i64 rem nsec");
_Static_assert(sizeof(csleeprec_t) == 48 && offsetof(csleeprec_t, rc) == 24,
               "OP_CLOCK_NANOSLEEP payload: i32 clock | i32 flags | i64 sec | i64 nsec | i32 rc | i32 0 | rem");
_Static_assert(sizeof(secsrec_t) == 8, "OP_SLEEP payload: u32 seconds | u32 rc");
_Static_assert(sizeof(usrec_t) == 8, "OP_USLEEP payload: u32 usec | i32 rc");
_Static_assert(sizeof(pollargs_t) == 8, "OP_POLL payload: i32 timeout_ms | u32 nfds | i32 timed_out");
_Static_assert(sizeof(selargs_t) == 16, "OP_SELECT payload: i32 nfds | i32 0 | i64 timeout_us | i32 timed_out");
_Static_assert(sizeof(epollargs_t) == 8, "OP_EPOLL payload: i32 timeout_ms | i32 maxevents | i32 timed_out");

static int nanosleep_taped(const struct timespec *req, struct timespec *rem) {
    if (!ACTIVE() || !req) {
        long r = RS2(SYS_nanosleep, req, rem);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return 0;
    }
    tls_t *t = me();
    int64_t args[2] = {req->tv_sec, req->tv_nsec};
    served_t got;
    step_t step = tape_step(t, CH_WAIT, OP_NANOSLEEP, args, 16, &got);
    if (step == STEP_SERVED) {
        sleeprec_t s; memcpy(&s, got.p, sizeof s);
        if (rem && s.rc) { rem->tv_sec = s.rsec; rem->tv_nsec = s.rnsec; }
        if (s.rc) { errno = -s.rc; return -1; }
        return 0;
    }
    struct timespec r2 = {0, 0};
    long r = RS2(SYS_nanosleep, req, &r2);
    if (rem) *rem = r2;
    if (step == STEP_RECORD) {
        sleeprec_t s = {args[0], args[1], is_err(r) ? (int32_t)r : 0, 0, r2.tv_sec, r2.tv_nsec};
        rec(t, CH_WAIT, OP_NANOSLEEP, &s, sizeof s);
    }
    if (is_err(r)) { errno = (int)-r; return -1; }
    return 0;
}
EXPORT int nanosleep(const struct timespec *req, struct timespec *rem) {
    return GATED(OP_SCHED_SLEEP, 1, nanosleep_taped(req, rem));
}

/* A sleep a replay runs live (build replay, a lenient one past a divergence) until an
 * absolute deadline the program computed from a served clock: the same distance from
 * now as from the last value served (time.sleep computes the deadline holding the GIL,
 * then sleeps without it: translate_deadline's CPython guards do not apply). */
static const struct timespec *served_deadline(int clk, const struct timespec *abs,
                                              struct timespec *out) {
    if ((unsigned)clk >= 16 || !g_served_ns[clk]) return abs;
    struct timespec now;
    if (is_err(RS2(SYS_clock_gettime, clk, &now))) return abs;
    int64_t t = now.tv_sec * 1000000000LL + now.tv_nsec +
                (abs->tv_sec * 1000000000LL + abs->tv_nsec - g_served_ns[clk]);
    out->tv_sec = t / 1000000000LL;
    out->tv_nsec = t % 1000000000LL;
    return out;
}

static int clock_nanosleep_taped(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem) {
    if (!ACTIVE() || !req) return (int)-RS4(SYS_clock_nanosleep, clk, flags, req, rem);
    tls_t *t = me();
    csleeprec_t s = {(int32_t)clk, flags, req->tv_sec, req->tv_nsec, 0, 0, 0, 0};
    served_t got;
    step_t step = tape_step(t, CH_WAIT, OP_CLOCK_NANOSLEEP, &s, 24, &got);
    if (step == STEP_SERVED) {
        memcpy(&s, got.p, sizeof s);
        if (rem && s.rc && !(flags & TIMER_ABSTIME)) { rem->tv_sec = s.rsec; rem->tv_nsec = s.rnsec; }
        return s.rc;
    }
    struct timespec r2 = {0, 0}, shifted;
    if (flags & TIMER_ABSTIME) {
        if (step == STEP_LIVE && (unsigned)clk < 16 && g_served_ns[clk] &&
            g_anchor_ns[clk] != g_served_ns[clk]) /* the clock was last served, not read live */
            req = served_deadline(clk, req, &shifted);
        else if (UNLIKELY(g_clock_shift))
            req = clock_unshift(clk, req, &shifted);
    }
    long r = RS4(SYS_clock_nanosleep, clk, flags, req, &r2);
    if (rem && r == -EINTR && !(flags & TIMER_ABSTIME)) *rem = r2;
    if (step == STEP_RECORD) {
        s.rc = (int32_t)-r; s.rsec = r2.tv_sec; s.rnsec = r2.tv_nsec;
        rec(t, CH_WAIT, OP_CLOCK_NANOSLEEP, &s, sizeof s);
    }
    return (int)-r;
}
EXPORT int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem) {
    return GATED(OP_SCHED_SLEEP, 1, clock_nanosleep_taped(clk, flags, req, rem));
}

static unsigned int sleep_taped(unsigned int secs) {
    if (!ACTIVE()) {
        struct timespec req = {secs, 0}, rem = {0, 0};
        if (is_err(RS2(SYS_nanosleep, &req, &rem))) return (unsigned)rem.tv_sec;
        return 0;
    }
    tls_t *t = me();
    secsrec_t s = {secs, 0};
    served_t got;
    step_t step = tape_step(t, CH_WAIT, OP_SLEEP, &s, 4, &got);
    if (step == STEP_SERVED) { memcpy(&s, got.p, sizeof s); return s.rc; }
    struct timespec req = {secs, 0}, rem = {0, 0};
    s.rc = is_err(RS2(SYS_nanosleep, &req, &rem)) ? (uint32_t)rem.tv_sec : 0;
    if (step == STEP_RECORD) rec(t, CH_WAIT, OP_SLEEP, &s, sizeof s);
    return s.rc;
}
EXPORT unsigned int sleep(unsigned int secs) {
    return GATED(OP_SCHED_SLEEP, 1, sleep_taped(secs));
}

static int usleep_taped(useconds_t us) {
    struct timespec req = {us / 1000000, (long)(us % 1000000) * 1000};
    if (!ACTIVE()) {
        long r = RS2(SYS_nanosleep, &req, NULL);
        if (is_err(r)) { errno = (int)-r; return -1; }
        return 0;
    }
    tls_t *t = me();
    usrec_t s = {us, 0};
    served_t got;
    step_t step = tape_step(t, CH_WAIT, OP_USLEEP, &s, 4, &got);
    if (step == STEP_SERVED) {
        memcpy(&s, got.p, sizeof s);
        if (s.rc) { errno = -s.rc; return -1; }
        return 0;
    }
    long r = RS2(SYS_nanosleep, &req, NULL);
    s.rc = is_err(r) ? (int32_t)r : 0;
    if (step == STEP_RECORD) rec(t, CH_WAIT, OP_USLEEP, &s, sizeof s);
    if (s.rc) { errno = -s.rc; return -1; }
    return 0;
}
EXPORT int usleep(useconds_t us) {
    return GATED(OP_SCHED_SLEEP, 1, usleep_taped(us));
}

/* Timed waits: the step, where a served record that did not time out means the call
 * runs live (what was ready is the program's own business: its fds are live) and is
 * not taped again (STEP_READY) -- STEP_TIMED_OUT when the recording says it timed out
 * with nothing ready, served as that. A wait the recording saw end with something
 * ready waits for it at replay however long that takes (READY_WAIT_MS at most): its
 * peer is replayed too, and on a loaded machine may come later than the program's own
 * timeout -- which, taken live, would send the program round its loop once more than
 * the recording went (a server's select(0.5) timing out before the replayed client
 * connects: its next scheduled turn is then not the recorded one). */
#define STEP_TIMED_OUT STEP_SERVED
#define STEP_READY 3 /* (a wait_step answer, beside the step_t ones) */
#define READY_WAIT_MS 60000
static int wait_step(tls_t *t, int op, const void *args, uint32_t argn) {
    served_t s;
    step_t step = tape_step(t, CH_WAIT, op, args, argn, &s);
    if (step != STEP_SERVED) return (int)step;
    int32_t to; memcpy(&to, s.p + argn, 4);
    return to ? STEP_TIMED_OUT : STEP_READY;
}

static int patient(int timeout_ms) {
    return timeout_ms < 0 || timeout_ms > READY_WAIT_MS ? timeout_ms : READY_WAIT_MS;
}

static void wait_rec(tls_t *t, int op, const void *args, uint32_t argn, int32_t timed_out) {
    unsigned char b[24];
    memcpy(b, args, argn);
    memcpy(b + argn, &timed_out, 4);
    rec(t, CH_WAIT, op, b, argn + 4);
}

static int poll_taped(struct pollfd *fds, nfds_t nfds, int timeout) {
    RESOLVE(poll);
    int active = ACTIVE();
    if (active && poll_shaped(fds, nfds)) return io_poll(fds, nfds, timeout);
    if (!active || timeout <= 0) return real_poll(fds, nfds, timeout);
    tls_t *t = me();
    pollargs_t args = {timeout, (uint32_t)nfds};
    switch (wait_step(t, OP_POLL, &args, sizeof args)) {
    case STEP_TIMED_OUT:
        for (nfds_t i = 0; i < nfds; i++) fds[i].revents = 0;
        return 0;
    case STEP_READY: {
        int peer = peer_wait_in(), r = real_poll(fds, nfds, patient(timeout)), e = errno;
        peer_wait_out(peer);
        errno = e;
        return r;
    }
    case STEP_LIVE:
        return real_poll(fds, nfds, timeout);
    case STEP_RECORD:
        break;
    }
    int r = real_poll(fds, nfds, timeout);
    int e = errno;
    wait_rec(t, OP_POLL, &args, sizeof args, r == 0);
    errno = e;
    return r;
}
EXPORT int poll(struct pollfd *fds, nfds_t nfds, int timeout) {
    return GATED(OP_SCHED_IO, timeout != 0 || T.gate_next, poll_taped(fds, nfds, timeout));
}

static int select_as_ppoll(int nfds, fd_set *r, fd_set *w, fd_set *x, int ms,
                           const struct timespec *ts, const sigset_t *mask);

/* select() of sets holding a taped connection: asked as the poll() it amounts to, so the
 * connection's readiness is taped and served like a poll's (io_poll). */
static int select_as_poll(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *tv) {
    int ms = tv ? (int)(tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000) : -1;
    int k = select_as_ppoll(nfds, r, w, x, ms, NULL, NULL);
    if (k >= 0 && tv && !k) tv->tv_sec = tv->tv_usec = 0;
    return k;
}

static int select_as_ppoll(int nfds, fd_set *r, fd_set *w, fd_set *x, int ms,
                           const struct timespec *ts, const sigset_t *mask) {
    struct pollfd pf[IO_POLL_MAX];
    nfds_t n = 0;
    for (int fd = 0; fd < nfds && fd < FD_SETSIZE; fd++) {
        short ev = (short)((r && FD_ISSET(fd, r) ? POLLIN : 0) | (w && FD_ISSET(fd, w) ? POLLOUT : 0) |
                           (x && FD_ISSET(fd, x) ? POLLPRI : 0));
        if (!ev) continue;
        if (n == IO_POLL_MAX) return -2;
        pf[n++] = (struct pollfd){fd, ev, 0};
    }
    int k = io_poll_masked(pf, n, ms, ts, mask);
    if (k < 0) return -1;
    if (r) FD_ZERO(r);
    if (w) FD_ZERO(w);
    if (x) FD_ZERO(x);
    int bits = 0;
    for (nfds_t i = 0; i < n; i++) {
        short rv = pf[i].revents;
        if (r && (pf[i].events & POLLIN) && (rv & (POLLIN | POLLHUP | POLLERR))) { FD_SET(pf[i].fd, r); bits++; }
        if (w && (pf[i].events & POLLOUT) && (rv & (POLLOUT | POLLERR))) { FD_SET(pf[i].fd, w); bits++; }
        if (x && (pf[i].events & POLLPRI) && (rv & POLLPRI)) { FD_SET(pf[i].fd, x); bits++; }
    }
    return bits;
}

static int select_has_net(int nfds, const fd_set *r, const fd_set *w, const fd_set *x) {
    for (int fd = 0; fd < nfds && fd < FD_SETSIZE && fd < NET_FDS; fd++)
        if (nfd_is(fd) && ((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (x && FD_ISSET(fd, x))))
            return 1;
    return 0;
}

static int select_taped(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *tv) {
    RESOLVE(select);
    if (UNLIKELY(g_nconns) && ACTIVE() && select_has_net(nfds, r, w, x)) {
        int k = select_as_poll(nfds, r, w, x, tv);
        if (k != -2) return k;
    }
    if (!ACTIVE() || !tv || (tv->tv_sec == 0 && tv->tv_usec == 0)) return real_select(nfds, r, w, x, tv);
    tls_t *t = me();
    selargs_t a = {nfds, 0, (int64_t)tv->tv_sec * 1000000 + tv->tv_usec};
    switch (wait_step(t, OP_SELECT, &a, sizeof a)) {
    case STEP_TIMED_OUT:
        if (r) FD_ZERO(r);
        if (w) FD_ZERO(w);
        if (x) FD_ZERO(x);
        tv->tv_sec = 0; tv->tv_usec = 0;
        return 0;
    case STEP_READY: {
        struct timeval longer = {READY_WAIT_MS / 1000, 0};
        int peer = peer_wait_in();
        int k = real_select(nfds, r, w, x, tv->tv_sec >= longer.tv_sec ? tv : &longer), e = errno;
        peer_wait_out(peer);
        errno = e;
        return k;
    }
    case STEP_LIVE:
        return real_select(nfds, r, w, x, tv);
    case STEP_RECORD:
        break;
    }
    int rc = real_select(nfds, r, w, x, tv);
    int e = errno;
    wait_rec(t, OP_SELECT, &a, sizeof a, rc == 0);
    errno = e;
    return rc;
}
EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *tv) {
    return GATED(OP_SCHED_IO, !tv || tv->tv_sec || tv->tv_usec || T.gate_next, select_taped(nfds, r, w, x, tv));
}

/* pselect and ppoll: a wait with a signal mask of its own (GNU make -j blocks SIGCHLD and
 * waits for its jobserver pipe with it unblocked only inside pselect, so the child's
 * SIGCHLD handler runs there). Since protocol 7 each is taped as the poll it amounts to
 * (io op 2) under that mask (io_poll_masked). */
static int ts_ms(const struct timespec *ts) {
    if (!ts) return -1;
    long long ms = (long long)ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000;
    return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *x, const struct timespec *ts,
                   const sigset_t *mask) {
    RESOLVE(pselect);
    if (!ACTIVE() || !SINCE(7)) return real_pselect(nfds, r, w, x, ts, mask);
    int ms = ts_ms(ts);
    int k = GATED(OP_SCHED_IO, ms != 0, select_as_ppoll(nfds, r, w, x, ms, ts, mask));
    return k == -2 ? real_pselect(nfds, r, w, x, ts, mask) : k;
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask) {
    RESOLVE(ppoll);
    if (!ACTIVE() || !SINCE(7) || n > IO_POLL_MAX) return real_ppoll(fds, n, ts, mask);
    int ms = ts_ms(ts);
    return GATED(OP_SCHED_IO, ms != 0, io_poll_masked(fds, n, ms, ts, mask));
}

/* Since protocol 6 every epoll wait is taped as one of a set holding a connection is
 * (netio.c, OP_NET_EPOLL): which fds it found ready, in order, and replay waits for those
 * in the live set and hands them back as recorded. A loop on an epoll set (node's libuv:
 * its stdin pipe, the eventfd its thread pool signals) otherwise takes what is ready
 * live at replay, and groups its callbacks otherwise. */
static inline int epoll_taped_whole(int ep) {
    return ACTIVE() && (SINCE(6) || (UNLIKELY(g_nregs) && nreg_has(ep)));
}

static int epoll_wait_taped(int ep, struct epoll_event *ev, int max, int timeout) {
    RESOLVE(epoll_wait);
    if (epoll_taped_whole(ep)) return net_epoll(ep, ev, max, timeout, NULL);
    if (!ACTIVE() || timeout <= 0) return real_epoll_wait(ep, ev, max, timeout);
    tls_t *t = me();
    epollargs_t args = {timeout, max};
    switch (wait_step(t, OP_EPOLL, &args, sizeof args)) {
    case STEP_TIMED_OUT: return 0;
    case STEP_READY: {
        int peer = peer_wait_in(), r = real_epoll_wait(ep, ev, max, patient(timeout)), e = errno;
        peer_wait_out(peer);
        errno = e;
        return r;
    }
    case STEP_LIVE: return real_epoll_wait(ep, ev, max, timeout);
    case STEP_RECORD: break;
    }
    int r = real_epoll_wait(ep, ev, max, timeout);
    int e = errno;
    wait_rec(t, OP_EPOLL, &args, sizeof args, r == 0);
    errno = e;
    return r;
}
EXPORT int epoll_wait(int ep, struct epoll_event *ev, int max, int timeout) {
    return GATED(OP_SCHED_IO, timeout != 0 || T.gate_next, epoll_wait_taped(ep, ev, max, timeout));
}

static int epoll_pwait_taped(int ep, struct epoll_event *ev, int max, int timeout, const sigset_t *ss) {
    RESOLVE(epoll_pwait);
    if (epoll_taped_whole(ep)) return net_epoll(ep, ev, max, timeout, ss);
    if (!ACTIVE() || timeout <= 0) return real_epoll_pwait(ep, ev, max, timeout, ss);
    tls_t *t = me();
    epollargs_t args = {timeout, max};
    switch (wait_step(t, OP_EPOLL, &args, sizeof args)) {
    case STEP_TIMED_OUT: return 0;
    case STEP_READY: {
        int peer = peer_wait_in(), r = real_epoll_pwait(ep, ev, max, patient(timeout), ss);
        int e = errno;
        peer_wait_out(peer);
        errno = e;
        return r;
    }
    case STEP_LIVE: return real_epoll_pwait(ep, ev, max, timeout, ss);
    case STEP_RECORD: break;
    }
    int r = real_epoll_pwait(ep, ev, max, timeout, ss);
    int e = errno;
    wait_rec(t, OP_EPOLL, &args, sizeof args, r == 0);
    errno = e;
    return r;
}
EXPORT int epoll_pwait(int ep, struct epoll_event *ev, int max, int timeout, const sigset_t *ss) {
    return GATED(OP_SCHED_IO, timeout != 0 || T.gate_next, epoll_pwait_taped(ep, ev, max, timeout, ss));
}

static const struct timespec *translate_deadline(int clk, const struct timespec *abs,
                                                 struct timespec *out) {
    if (g_mode == MODE_RECORD && g_clock_shift && abs && !T.guard && !gil_free() &&
        !T.live_deadline && clk >= 0)
        return clock_unshift(clk, abs, out); /* gone live: clocks the program reads are shifted */
    if (g_mode != MODE_REPLAY || !abs || T.guard || gil_free() || T.live_deadline) return abs;
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
