/* Resume: the recorded prefix of a crashed run, then live (stenograph resume).
 *
 * `stenograph resume` replays a trajectory whose recording was cut short, with
 * STENO_RESUME=1 and the recorder's socket. Everything on the tape is served and checked
 * as in any replay. Where a thread's stream runs out (and the process's recording has no
 * exit: it was killed), the thread has reached the crash: it parks. When every taped
 * thread of the process has parked -- or a Python hook finds its own tape exhausted and
 * calls steno_go_live -- the process goes live: clocks are shifted so they do not run
 * backwards (clock.c), the mode becomes record, parked threads and threads waiting for a
 * recorded grant wake, and each finishes the call it was in as record does (tape_step
 * answers STEP_RECORD to every wrapper), taping it. From there the process is recorded
 * like any other, its streams continuing at the positions the prefix reached, so a later
 * resume (or replay) serves the prefix and this continuation as one tape.
 *
 * A thread that never reaches the end of its tape (blocked in a call the shim does not
 * see) would keep the others parked: once no record has been served for LIVE_WAIT_MS, and
 * no other thread is running or waiting for a CPU, the process goes live anyway. (Counted from the first park, a loaded machine switched a
 * thread still replaying its prefix: its unreplayed records stayed in the log before its
 * live ones, and a replay of the resumed trajectory stopped there, "the turn never
 * came".) */


static int g_live_lock;
static int g_live_word;    /* bumped when the process goes live; parked threads sleep on it */
static int g_resume_parked; /* taped threads at the end of their tape */

static void go_live(void) {
    spin_lock(&g_live_lock);
    if (g_mode == MODE_REPLAY && g_resume) {
        sched_before_live();
        clock_go_live();
        __atomic_store_n(&g_mode, MODE_RECORD, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&g_live_word, 1, __ATOMIC_SEQ_CST);
        RS3(SYS_futex, &g_live_word, FUTEX_WAKE_PRIVATE, INT_MAX);
        __atomic_add_fetch(&S.word, 1, __ATOMIC_SEQ_CST); /* threads waiting for a grant */
        RS3(SYS_futex, &S.word, FUTEX_WAKE_PRIVATE, INT_MAX);
    }
    spin_unlock(&g_live_lock);
}

/* Is another thread of this process on a CPU or waiting for one ('R'), or in an
 * uninterruptible wait ('D': a page of a mapped tape read under heavy I/O)? Such a thread
 * is still on its way through its prefix however long the machine keeps it from running;
 * only a thread asleep in the kernel ('S') can be blocked in a call the shim does not
 * see. 0 when /proc cannot be read (the quiet time alone decides, as before). */
static int others_runnable(void) {
    long dir = OWN4(SYS_openat, AT_FDCWD, "/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (is_err(dir)) return 0;
    long me = RS0(SYS_gettid);
    char buf[2048], path[64], st[512];
    long n;
    int found = 0;
    while (!found && (n = RS3(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n && !found;) {
            struct { uint64_t ino; int64_t off; unsigned short reclen; unsigned char type;
                     char name[]; } *d = (void *)(buf + off);
            off += d->reclen;
            long tid = 0;
            const char *c = d->name;
            for (; *c >= '0' && *c <= '9'; c++) tid = tid * 10 + (*c - '0');
            if (*c || !tid || tid == me) continue;
            char *p = s_put(path, path + sizeof path - 1, "/proc/self/task/");
            p = s_put(p, path + sizeof path - 1, d->name);
            p = s_put(p, path + sizeof path - 1, "/stat");
            *p = 0;
            long fd = OWN4(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
            if (is_err(fd)) continue;
            long got = RS3(SYS_read, fd, st, sizeof st - 1);
            RS1(SYS_close, fd);
            if (got <= 0) continue;
            char *close = NULL; /* the state follows the last ')': a name may hold one */
            for (long i = 0; i < got; i++) if (st[i] == ')') close = st + i;
            if (close && close + 2 < st + got && (close[2] == 'R' || close[2] == 'D')) found = 1;
        }
    }
    RS1(SYS_close, dir);
    return found;
}

/* Park at the end of this thread's prefix until the process goes live: when every taped
 * thread has parked, or once no record was served for LIVE_WAIT_MS while no other thread
 * was running or waiting for a CPU (LIVE_WAIT_PEER_MS while one waits in a replayed call
 * for what the recording saw happen). A thread the machine kept off the CPU in the middle
 * of its prefix, or one reading what a slower replayed process has yet to write, is not
 * blocked in a call the shim does not see: going live then switched it mid-prefix. But
 * the writer may also be a thread of this process cut a little earlier (the cut drains
 * rings one after another), which goes on only live: hence a longer wait, not none.
 * LIVE_WAIT_CAP_MS bounds the whole wait. */
static void resume_park(tls_t *t) {
    sched_step_drop(t);
    peer_wait_drop();
    int parked = __atomic_add_fetch(&g_resume_parked, 1, __ATOMIC_SEQ_CST);
    unsigned seen = __atomic_load_n(&g_served, __ATOMIC_RELAXED);
    int64_t start = mono_ns(), quiet = start;
    while (__atomic_load_n(&g_mode, __ATOMIC_SEQ_CST) == MODE_REPLAY) {
        int64_t now_ns = mono_ns();
        if (parked >= __atomic_load_n(&g_live_threads, __ATOMIC_SEQ_CST) ||
            now_ns - start >= LIVE_WAIT_CAP_MS * 1000000LL) {
            go_live();
            break;
        }
        int64_t limit = __atomic_load_n(&g_peer_waits, __ATOMIC_SEQ_CST) ? LIVE_WAIT_PEER_MS
                                                                       : LIVE_WAIT_MS;
        if (now_ns - quiet >= limit * 1000000LL) {
            if (!others_runnable()) {
                go_live();
                break;
            }
            quiet = now_ns - (limit - 100) * 1000000LL; /* look again in 100 ms */
        }
        int w = __atomic_load_n(&g_live_word, __ATOMIC_SEQ_CST);
        struct timespec rel = {0, 10 * 1000 * 1000};
        if (__atomic_load_n(&g_mode, __ATOMIC_SEQ_CST) == MODE_REPLAY)
            RS4(SYS_futex, &g_live_word, FUTEX_WAIT_PRIVATE, w, &rel);
        unsigned now = __atomic_load_n(&g_served, __ATOMIC_RELAXED);
        if (now != seen) quiet = mono_ns(); /* another thread is still replaying */
        seen = now;
        parked = __atomic_load_n(&g_resume_parked, __ATOMIC_SEQ_CST);
    }
    __atomic_sub_fetch(&g_resume_parked, 1, __ATOMIC_SEQ_CST);
}

/* A Python hook's tape ran out in a resumed replay (pytape): the process goes live now. */
EXPORT void steno_go_live(void) { go_live(); }

/* 1 once a resumed process has gone live (its hooks then record), else 0. */
EXPORT int steno_is_live(void) { return g_resume && g_mode == MODE_RECORD; }

/* A fork's (or resume's) Python tape ran out at a model call: before the process goes
 * live, the other taped threads replay to the ends of their prefixes, so every stream
 * continues live from its end (a thread switched mid-prefix would leave records its
 * recording never made, and the fork would not replay). This thread lets the baton go
 * and parks like a thread at its end of tape; the process goes live when all have
 * (LIVE_WAIT_MS at most). */
EXPORT void steno_park_live(void) {
    if (g_mode != MODE_REPLAY || !g_resume) return;
    tls_t *t = me();
    if (t->holding) sched_release(t);
    resume_park(t);
    go_live();
}
