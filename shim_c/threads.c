/* Threads: indices in pthread_create call order, and the flush at thread exit. */

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

/* Destructor of g_key (set by every taped thread): a thread that exits ships its buffer
 * and frees its slot for the next thread. */
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
