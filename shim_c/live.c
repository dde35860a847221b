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
 * see) would keep the others parked: once no record has been served for LIVE_WAIT_MS the
 * process goes live anyway. (Counted from the first park, a loaded machine switched a
 * thread still replaying its prefix: its unreplayed records stayed in the log before its
 * live ones, and a replay of the resumed trajectory stopped there, "the turn never
 * came".) */


static int g_live_lock;
static int g_live_word;    /* bumped when the process goes live; parked threads sleep on it */
static int g_resume_parked; /* taped threads at the end of their tape */

static void go_live(void) {
    spin_lock(&g_live_lock);
    if (g_mode == MODE_REPLAY && g_resume) {
        clock_go_live();
        __atomic_store_n(&g_mode, MODE_RECORD, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&g_live_word, 1, __ATOMIC_SEQ_CST);
        RS3(SYS_futex, &g_live_word, FUTEX_WAKE_PRIVATE, INT_MAX);
        __atomic_add_fetch(&S.word, 1, __ATOMIC_SEQ_CST); /* threads waiting for a grant */
        RS3(SYS_futex, &S.word, FUTEX_WAKE_PRIVATE, INT_MAX);
    }
    spin_unlock(&g_live_lock);
}

static void resume_park(tls_t *t) {
    (void)t;
    int parked = __atomic_add_fetch(&g_resume_parked, 1, __ATOMIC_SEQ_CST);
    unsigned seen = __atomic_load_n(&g_served, __ATOMIC_RELAXED);
    for (int waited = 0; __atomic_load_n(&g_mode, __ATOMIC_SEQ_CST) == MODE_REPLAY;) {
        if (parked >= __atomic_load_n(&g_live_threads, __ATOMIC_SEQ_CST) ||
            waited >= LIVE_WAIT_MS) {
            go_live();
            break;
        }
        int w = __atomic_load_n(&g_live_word, __ATOMIC_SEQ_CST);
        struct timespec rel = {0, 10 * 1000 * 1000};
        if (__atomic_load_n(&g_mode, __ATOMIC_SEQ_CST) == MODE_REPLAY)
            RS4(SYS_futex, &g_live_word, FUTEX_WAIT_PRIVATE, w, &rel);
        unsigned now = __atomic_load_n(&g_served, __ATOMIC_RELAXED);
        waited = now != seen ? 0 : waited + 10; /* another thread is still replaying */
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
