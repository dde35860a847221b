/* Record mode: the shared rings. Every process has one arena of per-thread rings in a
 * memfd it shares with the recorder (layout: steno_shim.h). A thread appends a record
 * to its own ring and publishes it by storing the ring's head; the recorder drains
 * behind it (stenograph.recorder.rings) when nudged, on a barrier, every few
 * milliseconds, and once more when the process's connection closes -- which it does
 * when the process dies, however it dies. So a record is kept the moment it is
 * written: a SIGKILL loses nothing already taped, and the clock path makes no copy
 * through a socket and takes no lock.
 *
 * One writer per ring (its thread), one reader (the recorder): head and tail are each
 * stored by one side only, and x86-64 keeps stores in order, so a head the recorder
 * reads covers only complete records. A slot passes to another thread only empty. */

static arena_t *g_ring;      /* this process's arena, made at its first record */
static int g_ring_fd = -1;   /* its memfd until the recorder has it */
static int g_ring_lock;      /* making the arena, handing out slots */
static unsigned long g_lost; /* records that found no ring, or no recorder to make room */

#define RING_MASK ((uint64_t)RING_CAP - 1)
#define RING_BIG (RING_CAP / 2) /* records above this travel alone (MSG_BIG) */
/* The recorder is nudged each time a ring's head passes a multiple of this: it drains in
 * steps small enough to stay ahead of a thread that does nothing but read the clock
 * (one nudge per ~4,000 clock records; a full ring makes the thread wait). */
#define RING_NUDGE ((uint64_t)RING_CAP / 8)
#define NUDGE_BLOCK(x) ((x) / RING_NUDGE)

/* On every new connection: tell the recorder which arena this process writes. */
static void ring_announce(void) {
    if (!g_ring) return;
    unsigned char body[12];
    memcpy(body, &g_ring->id, 8);
    memcpy(body + 8, &g_ring->pid, 4);
    if (ship_fd(MSG_RING, me()->tindex, body, sizeof body, g_ring_fd) && g_ring_fd >= 0) {
        RS1(SYS_close, g_ring_fd); /* the recorder holds it now */
        g_ring_fd = -1;
    }
}

static arena_t *arena_make(void) {
    long fd = RS2(SYS_memfd_create, "steno-tape", MFD_CLOEXEC);
    if (is_err(fd)) return NULL;
    if (is_err(RS2(SYS_ftruncate, fd, sizeof(arena_t)))) { RS1(SYS_close, fd); return NULL; }
    size_t len = sizeof(arena_t);
    arena_t *a = NULL;
    for (int tries = 0; tries < 64 && !a; tries++) {
        uintptr_t at = __atomic_fetch_add(&g_arena, len + 65536, __ATOMIC_RELAXED);
        long p = RS6(SYS_mmap, at, len, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_NORESERVE | MAP_FIXED_NOREPLACE, fd, 0);
        if (p == -EEXIST) continue;
        if (is_err(p)) break;
        a = (arena_t *)p;
    }
    if (!a) { RS1(SYS_close, fd); return NULL; }
    memcpy(a->magic, RING_MAGIC, 4);
    a->version = RING_VERSION;
    a->pid = (int32_t)RS0(SYS_getpid);
    RS3(SYS_getrandom, &a->id, sizeof a->id, 0);
    long hi = RS3(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 900); /* out of the program's way */
    if (!is_err(hi)) { RS1(SYS_close, fd); fd = hi; }
    g_ring_fd = (int)fd;
    return a;
}

/* A free slot for a thread: an empty one, else a new one, else a non-empty free one once
 * the recorder has drained it (its records are the previous owner's). */
static ring_t *ring_claim(uint32_t tindex) {
    spin_lock(&g_ring_lock);
    if (!g_ring) {
        g_ring = arena_make();
        if (g_ring) {
            if (sock_ok()) ring_announce();
            else sock_connect();
        }
    }
    arena_t *a = g_ring;
    ring_t *pick = NULL, *dirty = NULL;
    if (a) {
        uint32_t n = a->nslots;
        for (uint32_t i = 0; i < n && !pick; i++) {
            ring_t *r = &a->slot[i];
            if (r->used) continue;
            if (r->head == __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE)) pick = r;
            else if (!dirty) dirty = r;
        }
        if (!pick && n < RING_SLOTS) {
            pick = &a->slot[n];
            __atomic_store_n(&a->nslots, n + 1, __ATOMIC_RELEASE);
        }
        if (!pick) pick = dirty;
        if (pick) pick->used = 1;
    }
    spin_unlock(&g_ring_lock);
    if (!pick) return NULL;
    if (pick->head != __atomic_load_n(&pick->tail, __ATOMIC_ACQUIRE)) barrier(MSG_BARRIER);
    __atomic_store_n(&pick->tindex, tindex, __ATOMIC_RELEASE);
    return pick;
}

/* Thread exit: the slot goes back; what is in it is drained as the previous owner's. */
static void ring_release(tls_t *t) {
    if (t->tb) __atomic_store_n(&t->tb->used, 0, __ATOMIC_RELEASE);
    t->tb = NULL;
}

/* After fork, in the child: the arena mapped here is the parent's (shared memory): drop
 * it before anything is written; the child makes its own at its first record. */
static void ring_after_fork_child(void) {
    if (g_ring) shim_unmap(g_ring, sizeof(arena_t));
    if (g_ring_fd >= 0) RS1(SYS_close, g_ring_fd);
    g_ring = NULL;
    g_ring_fd = -1;
    g_ring_lock = 0;
    T.tb = NULL;
}

static inline void ring_copy(ring_t *r, uint64_t at, const void *p, uint32_t n) {
    uint64_t off = at & RING_MASK;
    uint64_t first = RING_CAP - off < n ? RING_CAP - off : n;
    memcpy(r->data + off, p, first);
    if (first < n) memcpy(r->data, (const unsigned char *)p + first, n - first);
}

/* Room for `need` more bytes: ask the recorder to drain when the ring is full. */
static int ring_room(ring_t *r, uint64_t need) {
    if (r->head + need - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) <= RING_CAP) return 1;
    barrier(MSG_BARRIER);
    return r->head + need - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) <= RING_CAP;
}

/* Published: the recorder may now take it; past a nudge mark, nudge it (no answer). */
static inline void ring_publish(ring_t *r, uint64_t head) {
    uint64_t before = r->head;
    __atomic_store_n(&r->head, head, __ATOMIC_RELEASE);
    if (UNLIKELY(NUDGE_BLOCK(before) != NUDGE_BLOCK(head))) ship(MSG_NUDGE, T.tindex, NULL, 0);
}

/* Append one record to this thread's ring: u8 channel | u8 op | u16 site | u32 len. */
static void rec2(tls_t *t, int ch, int op, const void *p1, uint32_t n1, const void *p2,
                 uint32_t n2) {
    uint16_t site = t->site; /* before a pending handler's records can take it */
    t->site = 0;
    if (ch != CH_SIGNAL) {
        t->nrec++;
        t->sigk = 0;
        if (UNLIKELY(t->sigpend_n)) sig_flush_pending(t);
    }
    inshim_enter();
    ring_t *r = t->tb;
    if (UNLIKELY(!r)) r = t->tb = ring_claim(t->tindex);
    uint32_t n = n1 + n2;
    unsigned char h[8] = {(unsigned char)ch, (unsigned char)op};
    memcpy(h + 2, &site, 2);
    memcpy(h + 4, &n, 4);
    if (UNLIKELY(!r)) {
        __atomic_fetch_add(&g_lost, 1, __ATOMIC_RELAXED);
    } else if (UNLIKELY(8 + (uint64_t)n > RING_BIG)) { /* a big listing: alone, in order */
        unsigned char *big = shim_map(8 + (size_t)n, -1);
        if (big) {
            memcpy(big, h, 8);
            memcpy(big + 8, p1, n1);
            if (n2) memcpy(big + 8 + n1, p2, n2);
            barrier_with(MSG_BIG, big, 8 + (size_t)n);
            shim_unmap(big, 8 + (size_t)n);
        }
    } else if (LIKELY(ring_room(r, 8 + (uint64_t)n))) {
        uint64_t at = r->head;
        ring_copy(r, at, h, 8);
        ring_copy(r, at + 8, p1, n1);
        if (n2) ring_copy(r, at + 8 + n1, p2, n2);
        ring_publish(r, at + 8 + n);
    } else {
        __atomic_fetch_add(&g_lost, 1, __ATOMIC_RELAXED);
    }
    inshim_leave();
}

static inline void rec(tls_t *t, int ch, int op, const void *p, uint32_t n) {
    rec2(t, ch, op, p, n, NULL, 0);
}
