/* Channel signal: asynchronous signal handlers run where the recording ran them.
 *
 * When an asynchronous signal's handler runs is timing: bash reaps its children from
 * its SIGCHLD handler (waitchld -> waitpid(-1, WNOHANG)), so the handler's taped waits
 * land between the command substitution's pipe reads wherever the child happened to
 * exit; a Python SIGALRM handler prints wherever the timer fired. In the spirit of rr,
 * the shim puts its own handler in front of the program's (signal, sigaction,
 * bsd_signal, sysv_signal) for every asynchronous signal:
 *
 *  - record: the front handler runs the program's handler at once, as the kernel
 *    delivered it, and tapes where: the thread's count of records so far on its other
 *    streams (`pos`), how many signal-mask calls it made since its last record (`k`:
 *    bash blocks SIGCHLD around its blocking waits and the pending signal is delivered
 *    as sigprocmask unblocks it), the signal, and its siginfo.
 *  - replay: the live signal is swallowed (the front handler is installed with
 *    SA_RESTART, so it interrupts nothing the program sees); the program's handler runs
 *    when the thread reaches the recorded point: at the entry of the call whose record
 *    is next (before it is served: the handler's own taped calls were recorded before
 *    it), or as a mask call unblocks the signal, with the recorded siginfo, the handler's
 *    mask applied. A signal the thread sends itself (raise, tgkill) is run as it
 *    arrives when the tape has it at this point. The interrupted call's result
 *    (EINTR or the restarted outcome) is on the tape with the call.
 *
 * Coalesced signals (two children, one SIGCHLD) are replayed as recorded: one run.
 * A handler that ran while its thread was paused or inside the shim made its calls live
 * and untaped: replay runs it with the tape paused too. A handler runs on the thread it
 * interrupted; a thread that did not hold the scheduler's baton runs it off the
 * schedule in both modes. A recorded run the replay passes without running (the
 * thread reached the next record without the point being reachable: the signal was
 * blocked) is a divergence; sigsuspend/pause at replay return once the recorded
 * handler ran, and must find one there. sigwait*, signalfd: their results are not
 * taped; replay reports them (`unsupported`). Synchronous signals (SIGSEGV, SIGBUS,
 * SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS, SIGPIPE) pass through untouched. */

typedef struct {
    void *fn;
    int flags;
    int on;   /* the front handler is installed: fn is the program's disposition */
    int ever; /* the program had a handler for it: replay keeps the front one in place */
    sigset_t mask;
} sigent_t;

static sigent_t g_sig[65];

typedef struct {
    uint32_t pos, k;
    int32_t sig;
    uint32_t flags; /* 1: ran while its thread was paused or inside the shim (untaped) */
    unsigned char info[128];
} sigrec_t;
_Static_assert(sizeof(sigrec_t) == 144, "OP_SIG_RUN payload: u32 pos | u32 k | i32 sig | u32 flags | siginfo (128)");
_Static_assert(sizeof(siginfo_t) == 128, "siginfo_t is 128 bytes");

#define SIGF_UNTAPED 1
#define SIGF_OUTSIDE_MASK 2 /* ran outside a mask call: not a signal its unblock delivered */

static int sig_virtual(int sig) {
    switch (sig) {
    case SIGILL: case SIGTRAP: case SIGABRT: case SIGBUS: case SIGFPE: case SIGSEGV:
    case SIGPIPE: case SIGSYS: case SIGKILL: case SIGSTOP:
        return 0;
    }
    return sig >= 1 && sig <= 64 && !(sig >= 32 && sig < SIGRTMIN);
}

static void sig_front(int sig, siginfo_t *si, void *uc);

/* The thread's position: records so far on its other streams. */
static uint32_t sig_served(tls_t *t) {
    uint32_t n = 0;
    for (int c = 1; c < NCH; c++)
        if (c != CH_SIGNAL && t->st[c].mapped) n += t->st[c].pos;
    return n;
}

/* Record counts what it writes; replay what it serves; a resumed process that went live
 * counts both, as the replay of its whole tape will (live.c). */
static uint32_t sig_count(tls_t *t) {
    if (g_mode != MODE_RECORD) return sig_served(t);
    if (UNLIKELY(g_resume) && !t->nrec_based) {
        t->nrec += sig_served(t);
        t->nrec_based = 1;
    }
    return t->nrec;
}

static void raw_mask(int how, const sigset_t *set, sigset_t *old) {
    RS4(SYS_rt_sigprocmask, how, set, old, 8);
}

/* Run the program's handler (either mode): the scheduler's baton is not taken by it. */
static void sig_call(int sig, siginfo_t *si, void *uc, int untaped) {
    sigent_t *h = &g_sig[sig];
    void *fn = h->fn;
    int flags = h->flags;
    if (flags & SA_RESETHAND) { h->fn = (void *)SIG_DFL; h->on = 0; }
    if (fn == (void *)SIG_IGN || fn == (void *)SIG_DFL || !fn) return;
    int off = S.on && !T.holding && !T.sched_off;
    if (off) T.sched_off = 1;
    if (untaped) T.guard++;
    if (flags & SA_SIGINFO) ((void (*)(int, siginfo_t *, void *))fn)(sig, si, uc);
    else ((void (*)(int))fn)(sig);
    if (untaped) T.guard--;
    if (off) T.sched_off = 0;
}

/* Record: runs of a handler that interrupted the shim wait here until its next record. */
static void sig_flush_pending(tls_t *t) {
    int n = t->sigpend_n;
    t->sigpend_n = 0;
    for (int i = 0; i < n && i < 4; i++)
        rec(t, CH_SIGNAL, OP_SIG_RUN, &t->sigpend[i], sizeof(sigrec_t));
}

static void sig_record(tls_t *t, int sig, siginfo_t *si) {
    sigrec_t r;
    memset(&r, 0, sizeof r);
    r.pos = t->nrec;
    r.k = t->sigk;
    r.sig = sig;
    r.flags = ((t->guard || t->inshim) ? SIGF_UNTAPED : 0) |
              (t->in_mask ? 0 : SIGF_OUTSIDE_MASK);
    if (si) memcpy(r.info, si, sizeof r.info);
    if (t->inshim) { /* its buffer's lock may be held by the code it interrupted */
        if (t->sigpend_n < 4) memcpy(&t->sigpend[t->sigpend_n], &r, sizeof r);
        t->sigpend_n++;
        return;
    }
    rec(t, CH_SIGNAL, OP_SIG_RUN, &r, sizeof r);
}

static int g_sigtape; /* replay: the program installed a handler the shim is in front of */

static void sig_report(tls_t *t, const char *kind, const char *what, int sig) {
    char line[512];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, kind);
    p = s_put(p, end, "\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tchannel=signal\tpos="); p = u_put(p, end, t->st[CH_SIGNAL].pos);
    p = s_put(p, end, "\trecorded="); p = s_put(p, end, what);
    p = s_put(p, end, "\tasked=signal "); p = i_put(p, end, sig);
    *p++ = '\n';
    if (g_reports++ < 500) append_report(line, (size_t)(p - line));
}

/* Replay: run the handlers (at most `max`) the tape has at this thread's current point,
 * judged against `mask` (NULL: the thread's mask now); how many ran. `unblocked`: the
 * point right after a mask call, where only a run its unblock delivered belongs (one
 * recorded at the same position but outside the call -- the signal came during the
 * next blocking call -- waits for that call's entry). */
static int sig_replay_point_at(tls_t *t, const sigset_t *mask, int max, int unblocked) {
    if (t->inshim || t->in_sigpoint) return 0;
    stream_t *s = &t->st[CH_SIGNAL];
    int ran = 0;
    t->in_sigpoint = 1;
    while (ran < max) {
        if (!s->mapped) { inshim_enter(); map_stream(t, CH_SIGNAL); inshim_leave(); }
        if (s->off + 8 + sizeof(sigrec_t) > s->size) break;
        sigrec_t r;
        memcpy(&r, s->base + s->off + 8, sizeof r);
        uint32_t now = sig_count(t);
        if (r.pos > now || (r.pos == now && r.k > t->sigk)) break;
        if (r.pos < now) {
            sig_report(t, "divergence", "a signal handler ran before this call (the signal "
                       "was blocked here, or the run never reached the point)", r.sig);
            if (!g_lenient) diverged();
            s->off += 8 + sizeof r; /* lenient: drop it */
            s->pos++;
            continue;
        }
        if ((unsigned)r.sig > 64) break;
        if (unblocked && (r.flags & SIGF_OUTSIDE_MASK) && r.pos == now && r.k == t->sigk)
            break;
        sigset_t cur; /* the program's mask (in a live handler: the interrupted code's) */
        if (mask) cur = *mask;
        else raw_mask(SIG_BLOCK, NULL, &cur);
        if (sigismember(&cur, r.sig)) break; /* delivered when the program unblocks it */
        served_t s;
        if (tape_step(t, CH_SIGNAL, OP_SIG_RUN, NULL, 0, &s) != STEP_SERVED) break;
        sigset_t blk = g_sig[r.sig].mask, old;
        if (!(g_sig[r.sig].flags & SA_NODEFER)) sigaddset(&blk, r.sig);
        raw_mask(SIG_BLOCK, &blk, &old);
        ucontext_t uc;
        getcontext(&uc);
        siginfo_t si;
        memcpy(&si, r.info, sizeof si);
        int e = errno;
        t->in_sigpoint = 0;
        sig_call(r.sig, &si, &uc, r.flags & SIGF_UNTAPED);
        t->in_sigpoint = 1;
        errno = e;
        raw_mask(SIG_SETMASK, &old, NULL);
        ran++;
    }
    t->in_sigpoint = 0;
    return ran;
}

static int sig_replay_point(tls_t *t, const sigset_t *mask, int max) {
    return sig_replay_point_at(t, mask, max, 0);
}

/* Replay: the signal whose run is due at this thread's point now, or 0. */
static int sig_due(tls_t *t) {
    if (t->inshim || t->in_sigpoint) return 0;
    stream_t *s = &t->st[CH_SIGNAL];
    if (!s->mapped) { inshim_enter(); map_stream(t, CH_SIGNAL); inshim_leave(); }
    if (s->off + 8 + sizeof(sigrec_t) > s->size) return 0;
    sigrec_t r;
    memcpy(&r, s->base + s->off + 8, sizeof r);
    return r.pos == sig_count(t) && r.k <= t->sigk ? r.sig : 0;
}

/* core.c's serve() calls this before serving a record of another channel. */
static void sig_at_serve(tls_t *t) {
    if (t->guard) return;
    sig_replay_point(t, NULL, INT_MAX);
}

/* Replay: is `pid` a process of this replay? Its environment block still holds the
 * STENO_TAPE the shim hid from its program. */
static int sent_by_tree(pid_t pid) {
    static char buf[1 << 17];
    char path[32], want[1100];
    char *p = s_put(path, path + sizeof path - 1, "/proc/");
    p = u_put(p, path + sizeof path - 1, (uint64_t)pid);
    p = s_put(p, path + sizeof path - 1, "/environ");
    *p = 0;
    char *w = s_put(want, want + sizeof want - 1, "STENO_TAPE=");
    w = s_put(w, want + sizeof want - 1, g_tape);
    *w = 0;
    long fd = OWN4(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (is_err(fd)) return 0;
    long n = 0, r;
    while (n < (long)sizeof buf - 1 && (r = RS3(SYS_read, fd, buf + n, sizeof buf - 1 - n)) > 0)
        n += r;
    RS1(SYS_close, fd);
    size_t wl = (size_t)(w - want);
    for (long i = 0; i + (long)wl < n; i++)
        if ((i == 0 || buf[i - 1] == 0) && !memcmp(buf + i, want, wl) && buf[i + wl] == 0) return 1;
    return 0;
}

/* Does `sig`'s default action end the process? */
static int sig_kills(int sig) {
    switch (sig) {
    case SIGCHLD: case SIGCONT: case SIGURG: case SIGWINCH:
    case SIGSTOP: case SIGTSTP: case SIGTTIN: case SIGTTOU:
        return 0;
    default:
        return 1;
    }
}

/* Did the signal interrupt a blocking system call (the kernel rewound it to restart, or
 * it ends with EINTR)? A victim whose tape is spent and which waits there -- a pool
 * worker in an untaped sem_wait on the task queue's shared lock, which is where
 * pool.terminate()'s SIGTERM found it when recorded -- would never reach the tape end
 * its deferred death waits for: it dies of it now. */
static int blocked_in_call(void *ctx) {
#if defined(__x86_64__)
    if (!ctx) return 0;
    const greg_t *r = ((ucontext_t *)ctx)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)r[REG_RIP];
    return (ip[0] == 0x0f && ip[1] == 0x05) ||
           (ip[-2] == 0x0f && ip[-1] == 0x05 && r[REG_RAX] == -EINTR);
#else
    (void)ctx;
    return 0;
#endif
}

static void sig_front(int sig, siginfo_t *si, void *uc) {
    int e = errno;
    if ((unsigned)sig > 64) return;
    if (g_mode == MODE_RECORD) {
        tls_t *t = me();
        sig_record(t, sig, si);
        /* paused, its calls are untaped anyway; inside the shim, they are reentries
         * (live, untaped, counted): replay runs it with the tape paused */
        sig_call(sig, si, uc, 0);
    } else if (g_mode == MODE_REPLAY) {
        /* swallowed: the tape says where the handler runs. But when the thread is at
         * the point the tape has this very signal run (a signal it sent itself, or one
         * that arrives while the thread spins in code that makes no taped call), the
         * handler runs now: with no taped call ahead it could wait for ever. */
        tls_t *t = me();
        if (g_sig[sig].fn == (void *)SIG_DFL && si && si->si_code <= 0 &&
            si->si_pid != (pid_t)RS0(SYS_getpid)) {
            if (sent_by_tree(si->si_pid)) {
                /* the replayed sender: a recording that ends killed dies at its tape's end;
                 * one that exited outlived the signal when recorded */
                if (!recorded_exit()) {
                    g_deferred_kill = sig;
                    if (tape_spent(t) && blocked_in_call(uc)) die_as_recorded(sig);
                }
                errno = e;
                return;
            }
            /* sent from outside the replay (a user's kill): its default action, live */
            struct sigaction d;
            memset(&d, 0, sizeof d);
            d.sa_handler = SIG_DFL;
            real_sigaction(sig, &d, NULL);
            g_sig[sig].on = 0;
            sigset_t one;
            sigemptyset(&one);
            sigaddset(&one, sig);
            RS3(SYS_tgkill, RS0(SYS_getpid), RS0(SYS_gettid), sig);
            raw_mask(SIG_UNBLOCK, &one, NULL);
            errno = e;
            return;
        }
        if (g_mode == MODE_REPLAY && g_sig[sig].fn == (void *)SIG_DFL && si &&
            si->si_pid == (pid_t)RS0(SYS_getpid) && sig_kills(sig) && !recorded_exit())
            die_as_recorded(sig); /* raised itself with the default action (uvicorn re-raises
                                   * the SIGTERM it shut down for): the recorded death */
        if (!t->guard && sig_due(t) == sig)
            sig_replay_point(t, uc ? &((ucontext_t *)uc)->uc_sigmask : NULL, 1);
    } else {
        sig_call(sig, si, uc, 0);
    }
    errno = e;
}

/* ------------------------------------------------------------------ dispositions */

static void fill_old(int sig, struct sigaction *old) {
    sigent_t *h = &g_sig[sig];
    memset(old, 0, sizeof *old);
    old->sa_sigaction = (void (*)(int, siginfo_t *, void *))h->fn;
    old->sa_flags = h->flags;
    old->sa_mask = h->mask;
}

/* SIGSYS while the shim's seccomp traps are on (seccomp.c): the kernel must go on
 * delivering them to the shim, so a program's handler (npm's signal-exit listens to every
 * signal) is kept here instead; sigsys_handler hands it each SIGSYS that is not a trap. */
static int g_sigsys_mine;
static struct sigaction g_sigsys_prog; /* zero: SIG_DFL */

EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    RESOLVE(sigaction);
    if (sig == SIGSYS && __atomic_load_n(&g_sigsys_mine, __ATOMIC_ACQUIRE)) {
        if (old) *old = g_sigsys_prog;
        if (act) g_sigsys_prog = *act;
        return 0;
    }
    if (!sig_virtual(sig) || (!g_mode && !g_sig[sig].on))
        return real_sigaction(sig, act, old);
    struct sigaction a, prev;
    if (act) a = *act;
    if (g_sig[sig].on) fill_old(sig, &prev);
    else if (real_sigaction(sig, NULL, &prev)) return -1;
    if (act) {
        sigset_t blk, saved;
        sigemptyset(&blk);
        sigaddset(&blk, sig);
        raw_mask(SIG_BLOCK, &blk, &saved); /* the front handler never sees a half-written entry */
        int r;
        if (a.sa_handler == SIG_IGN || (a.sa_handler == SIG_DFL &&
                                         !(g_mode == MODE_REPLAY && g_sig[sig].ever))) {
            g_sig[sig].on = 0;
            r = real_sigaction(sig, &a, NULL);
        } else if (a.sa_handler == SIG_DFL) {
            /* replay, after a handler: a live signal the recording's handler took (a
             * timer that fires late, a child that exits late) must not take the default
             * action now; the front one stays and swallows it (sig_front) */
            g_sig[sig].fn = (void *)SIG_DFL;
            g_sig[sig].flags = a.sa_flags;
            g_sig[sig].mask = a.sa_mask;
            r = 0;
        } else {
            struct sigaction f = a;
            g_sig[sig].fn = (void *)a.sa_sigaction;
            g_sig[sig].flags = a.sa_flags;
            g_sig[sig].mask = a.sa_mask;
            g_sig[sig].on = 1;
            g_sig[sig].ever = 1;
            f.sa_sigaction = sig_front;
            f.sa_flags = a.sa_flags | SA_SIGINFO;
            if (g_mode == MODE_REPLAY) {
                f.sa_flags = (f.sa_flags | SA_RESTART) & ~SA_RESETHAND;
                g_sigtape = 1;
            }
            r = real_sigaction(sig, &f, NULL);
        }
        int e = errno;
        raw_mask(SIG_SETMASK, &saved, NULL);
        errno = e;
        if (r) return r;
    }
    if (old) *old = prev;
    return 0;
}

static sighandler_t signal_with(int sig, sighandler_t h, int flags, int self_mask) {
    struct sigaction a, o;
    memset(&a, 0, sizeof a);
    a.sa_handler = h;
    a.sa_flags = flags;
    sigemptyset(&a.sa_mask);
    if (self_mask && sig > 0 && sig < 65) sigaddset(&a.sa_mask, sig);
    if (sigaction(sig, &a, &o) < 0) return SIG_ERR;
    return o.sa_handler;
}

EXPORT sighandler_t signal(int sig, sighandler_t h) { return signal_with(sig, h, SA_RESTART, 1); }
EXPORT sighandler_t bsd_signal(int sig, sighandler_t h) { return signal_with(sig, h, SA_RESTART, 1); }
EXPORT sighandler_t sysv_signal(int sig, sighandler_t h) {
    return signal_with(sig, h, SA_RESETHAND | SA_NODEFER, 0);
}

/* ------------------------------------------------------------------ masks and waits */

static inline int sig_taped_thread(void) { return g_mode && !T.guard && !T.inshim; }

typedef int (*mask_fn)(int, const sigset_t *, sigset_t *);

/* Both mask calls: a run recorded before the call (under the old mask) happens first at
 * replay; one the change delivered happens after it. Record notes which runs a call's
 * unblock delivered (`in_mask`, see SIGF_OUTSIDE_MASK). */
static int mask_call(mask_fn real, int how, const sigset_t *set, sigset_t *old) {
    if (!set || !sig_taped_thread()) return real(how, set, old);
    tls_t *t = me();
    if (g_mode == MODE_REPLAY && g_sigtape) sig_replay_point(t, NULL, INT_MAX);
    t->sigk++;
    t->in_mask++;
    int r = real(how, set, old);
    t->in_mask--;
    if (g_mode == MODE_REPLAY && g_sigtape) sig_replay_point_at(t, NULL, INT_MAX, 1);
    return r;
}

EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old) {
    RESOLVE(sigprocmask);
    return mask_call(real_sigprocmask, how, set, old);
}

EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old) {
    RESOLVE(pthread_sigmask);
    return mask_call(real_pthread_sigmask, how, set, old);
}

/* Replay of a wait for a handler: run the one the tape has here, under `mask`. */
static int sig_replay_suspend(const sigset_t *mask) {
    tls_t *t = me();
    t->sigk++;
    sigset_t old;
    if (mask) raw_mask(SIG_SETMASK, mask, &old);
    int ran = sig_replay_point(t, NULL, INT_MAX);
    if (mask) raw_mask(SIG_SETMASK, &old, NULL);
    if (!ran) {
        sig_report(t, "divergence", "no signal handler ran here when recorded", 0);
        if (!g_lenient) diverged();
    }
    errno = EINTR;
    return -1;
}

EXPORT int sigsuspend(const sigset_t *mask) {
    RESOLVE(sigsuspend);
    if (!sig_taped_thread()) return real_sigsuspend(mask);
    if (g_mode == MODE_REPLAY) return sig_replay_suspend(mask);
    me()->sigk++;
    return real_sigsuspend(mask);
}

EXPORT int pause(void) {
    if (!sig_taped_thread()) return (int)sys_ret(RS0(SYS_pause));
    if (g_mode == MODE_REPLAY) return sig_replay_suspend(NULL);
    me()->sigk++;
    return (int)sys_ret(RS0(SYS_pause));
}

/* Signals taken synchronously: not taped; replay says so. */
static void sig_unsupported(const char *what) {
    if (g_mode != MODE_REPLAY || T.guard) return;
    static int said;
    if (said++) return;
    sig_report(me(), "unsupported", what, 0);
}

EXPORT int signalfd(int fd, const sigset_t *mask, int flags) {
    RESOLVE(signalfd);
    sig_unsupported("signalfd (signals read from a file descriptor are not taped)");
    return real_signalfd(fd, mask, flags);
}
EXPORT int sigwaitinfo(const sigset_t *set, siginfo_t *info) {
    RESOLVE(sigwaitinfo);
    sig_unsupported("sigwaitinfo (signals taken synchronously are not taped)");
    return real_sigwaitinfo(set, info);
}
EXPORT int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *ts) {
    RESOLVE(sigtimedwait);
    sig_unsupported("sigtimedwait (signals taken synchronously are not taped)");
    return real_sigtimedwait(set, info, ts);
}
EXPORT int sigwait(const sigset_t *set, int *sig) {
    RESOLVE(sigwait);
    sig_unsupported("sigwait (signals taken synchronously are not taped)");
    return real_sigwait(set, sig);
}

/* Replay: a process whose recording ended killed by a signal (no exit record) dies of it
 * at the end of its tape (core.c, await_kill). A killer replayed faster than it ran (a
 * `timeout` whose handler runs at its recorded point at once, while the command it
 * kills still has its part to replay) must not kill it sooner: the terminating signals
 * the program leaves at their default get the front handler, which keeps such a signal
 * for the tape's end (g_fatal, core.c). (A process whose recording exited outlives them.) */
/* Across an exec, until the new image's shim has its front handlers, those signals are
 * blocked (a mask survives exec; TAPE/<proc>/premask keeps which the program had
 * blocked itself): a kill landing in that window would take the default action. */
static sigset_t g_exec_old;
static int g_exec_blocked;

static void sig_exec_block(void) {
    if (g_mode != MODE_REPLAY || g_resume || g_build) return;
    sigset_t f;
    sigemptyset(&f);
    for (size_t i = 0; i < NFATAL; i++) sigaddset(&f, g_fatal[i]);
    raw_mask(SIG_BLOCK, &f, &g_exec_old);
    g_exec_blocked = 1;
    char path[TAPE_PATH], bits[NFATAL];
    tape_path(path, 1, "premask");
    for (size_t i = 0; i < NFATAL; i++) bits[i] = sigismember(&g_exec_old, g_fatal[i]) ? '1' : '0';
    tape_file_put(path, bits, NFATAL);
}

/* The exec failed (a PATH search goes on): the mask as it was. */
static void sig_exec_failed(void) {
    if (!g_exec_blocked) return;
    g_exec_blocked = 0;
    raw_mask(SIG_SETMASK, &g_exec_old, NULL);
}

/* The new image, its front handlers in place: unblock what the program had not blocked. */
static void sig_exec_arrived(void) {
    char path[TAPE_PATH], bits[NFATAL];
    tape_path(path, 1, "premask");
    long n = tape_file_get(path, bits, NFATAL);
    if (n < 0) return;
    OWN1(SYS_unlink, path);
    if (n != (long)NFATAL) return;
    sigset_t u;
    sigemptyset(&u);
    for (size_t i = 0; i < NFATAL; i++)
        if (bits[i] == '0') sigaddset(&u, g_fatal[i]);
    raw_mask(SIG_UNBLOCK, &u, NULL);
}

static void sig_defer_deaths(void) {
    RESOLVE(sigaction);
    for (size_t i = 0; i < NFATAL; i++) {
        int sig = g_fatal[i];
        struct sigaction cur, f;
        if (g_sig[sig].on || real_sigaction(sig, NULL, &cur) || cur.sa_handler != SIG_DFL)
            continue;
        memset(&f, 0, sizeof f);
        f.sa_sigaction = sig_front;
        f.sa_flags = SA_SIGINFO | SA_RESTART;
        g_sig[sig].fn = (void *)SIG_DFL;
        g_sig[sig].flags = 0;
        sigemptyset(&g_sig[sig].mask);
        g_sig[sig].on = g_sig[sig].ever = 1;
        real_sigaction(sig, &f, NULL);
    }
}

/* A forked child starts its streams afresh: so does its count. */
static void sig_atfork_child(void) {
    T.nrec = 0;
    T.sigk = 0;
    T.sigpend_n = 0;
    T.in_sigpoint = 0;
}
__attribute__((constructor)) static void sig_init(void) {
    pthread_atfork(NULL, NULL, sig_atfork_child);
}
