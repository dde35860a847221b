/* Threads: indices in pthread_create call order (deterministic: creators hold the
 * scheduler's baton), their turns at start and end (sched.c), the flush at thread exit. */

struct tramp { void *(*fn)(void *); void *arg; uint32_t idx; int paused; };

static uint32_t g_offnext; /* threads started by paused code: off the tape, not numbered */

static void *trampoline(void *p) {
    struct tramp tr = *(struct tramp *)p;
    free(p);
    T.tindex = tr.idx;
    T.init = 1;
    T.sched_off = tr.paused;
    T.guard = tr.paused; /* replay never starts it: nothing it does may be on the tape */
    T.counted = !tr.paused; /* in g_live_threads from pthread_create on */
    pthread_setspecific(g_key, (void *)1);
    sched_thread_start();
    void *ret = tr.fn(tr.arg);
    sched_thread_end();
    if (!tr.paused) __atomic_sub_fetch(&g_live_threads, 1, __ATOMIC_SEQ_CST);
    T.counted = 0;
    return ret;
}

EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    RESOLVE(pthread_create);
    if (!g_mode) return real_pthread_create(th, attr, fn, arg);
    struct tramp *tr = malloc(sizeof *tr);
    if (!tr) return EAGAIN;
    tr->fn = fn;
    tr->arg = arg;
    tr->paused = T.guard > 0;
    if (tr->paused) {
        tr->idx = 0x40000000u | __atomic_fetch_add(&g_offnext, 1, __ATOMIC_RELAXED);
    } else {
        tr->idx = __atomic_fetch_add(&g_tnext, 1, __ATOMIC_RELAXED);
        sched_thread_created();
    }
    if (!tr->paused) __atomic_add_fetch(&g_live_threads, 1, __ATOMIC_SEQ_CST);
    int r = real_pthread_create(th, attr, trampoline, tr);
    if (r) {
        if (!tr->paused) __atomic_sub_fetch(&g_live_threads, 1, __ATOMIC_SEQ_CST);
        free(tr);
    }
    return r;
}

/* Destructor of g_key (set by every taped thread): a thread that exits gives its ring
 * back; the recorder drains what is left in it as this thread's. */
static void thread_key_done(void *unused) {
    (void)unused;
    for (int i = 0; i < 2; i++)
        if (T.spare[i]) { shim_unmap(T.spare[i], DBLOCK); T.spare[i] = NULL; }
    if (g_mode == MODE_RECORD) ring_release(&T);
}
