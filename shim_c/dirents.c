/* Channel dirents: opendir/fdopendir take the whole listing at once, sorted by name;
 * readdir*, rewinddir, closedir and scandir* are served from it. */

typedef struct {
    DIR *d;
    unsigned char *block;
    size_t cap;
    struct dirent64 **ents;
    uint32_t count, next;
} dslot_t;

#define NDIRS 512
#define DENT_HEAD 11 /* a taped entry: u64 ino | u8 type | u16 namelen | name (unaligned) */

static unsigned char *block_get(void) {
    for (int i = 0; i < 2; i++)
        if (T.spare[i]) { unsigned char *b = T.spare[i]; T.spare[i] = NULL; return b; }
    return shim_map(DBLOCK, -1);
}

static void block_put(unsigned char *b) {
    for (int i = 0; i < 2; i++)
        if (!T.spare[i]) { T.spare[i] = b; return; }
    shim_unmap(b, DBLOCK);
}
static dslot_t g_dirs[NDIRS];
static int g_dirs_lock;

static dslot_t *dslot_find(DIR *d) {
    unsigned h = (unsigned)(((uintptr_t)d >> 4) % NDIRS);
    for (unsigned i = 0; i < NDIRS; i++) {
        dslot_t *s = &g_dirs[(h + i) % NDIRS];
        if (s->d == d) return s;
        if (!s->d && !s->block) return NULL;
    }
    return NULL;
}

static dslot_t *dslot_new(DIR *d) {
    unsigned h = (unsigned)(((uintptr_t)d >> 4) % NDIRS);
    spin_lock(&g_dirs_lock);
    for (unsigned i = 0; i < NDIRS; i++) {
        dslot_t *s = &g_dirs[(h + i) % NDIRS];
        if (!s->d) {
            s->d = d;
            spin_unlock(&g_dirs_lock);
            return s;
        }
    }
    spin_unlock(&g_dirs_lock);
    return NULL;
}

static uint64_t name_hash(const char *p) { /* FNV-1a, then a final mix */
    uint64_t h = 0xcbf29ce484222325ULL;
    while (*p) { h ^= (unsigned char)*p++; h *= 0x100000001b3ULL; }
    h ^= h >> 33; h *= 0xff51afd7ed558ccdULL; h ^= h >> 33;
    return h;
}

static int name_cmp(const char *a, const char *b) {
    while (*a && *a == *b) { a++; b++; }
    return (unsigned char)*a - (unsigned char)*b;
}

static void sort_ents(struct dirent64 **v, uint32_t n) { /* shell sort: no malloc, no recursion */
    static const uint32_t gaps[] = {1750, 701, 301, 132, 57, 23, 10, 4, 1};
    for (unsigned g = 0; g < sizeof gaps / sizeof *gaps; g++) {
        uint32_t gap = gaps[g];
        for (uint32_t i = gap; i < n; i++) {
            struct dirent64 *x = v[i];
            uint32_t j = i;
            while (j >= gap && name_cmp(v[j - gap]->d_name, x->d_name) > 0) { v[j] = v[j - gap]; j -= gap; }
            v[j] = x;
        }
    }
}

/* Add one entry to a listing block; entries grow up from the start, pointers down
 * from the end. */
static int block_add(dslot_t *s, size_t *used, uint64_t ino, unsigned char type,
                     const char *name, uint16_t nl) {
    size_t reclen = (offsetof(struct dirent64, d_name) + nl + 1 + 7) & ~(size_t)7;
    size_t ptrs = (size_t)(s->count + 1) * sizeof(void *);
    if (*used + reclen + ptrs > s->cap) return 0;
    struct dirent64 *e = (struct dirent64 *)(s->block + *used);
    e->d_ino = ino;
    e->d_off = (int64_t)(s->count + 1);
    e->d_reclen = (unsigned short)reclen;
    e->d_type = type;
    memcpy(e->d_name, name, nl);
    e->d_name[nl] = 0;
    s->ents = (struct dirent64 **)(s->block + s->cap) - (s->count + 1);
    /* pointers are kept in order of insertion: shift is avoided by writing at the end */
    s->ents[0] = e;
    s->count++;
    *used += reclen;
    return 1;
}

/* Read the live listing of d into s, sorted. ents[] ends up in reverse insertion
 * order; sorting fixes the order anyway. */
static int live_listing(dslot_t *s, DIR *d) {
    s->block = block_get();
    if (!s->block) return 0;
    s->cap = DBLOCK;
    s->count = 0;
    s->ents = (struct dirent64 **)(s->block + s->cap);
    size_t used = 0;
    struct dirent64 *e;
    while ((e = real_readdir64(d)) != NULL)
        if (!block_add(s, &used, e->d_ino, e->d_type, e->d_name, (uint16_t)s_len(e->d_name))) break;
    sort_ents(s->ents, s->count);
    return 1;
}

static void listing_record(tls_t *t, dslot_t *s, const char *path, int32_t err) {
    /* payload: u16 pathlen | path | i32 errno | u32 count | entries */
    size_t total = 2 + s_len(path) + 8;
    for (uint32_t i = 0; i < s->count; i++) total += DENT_HEAD + s_len(s->ents[i]->d_name);
    unsigned char *buf = total <= DBLOCK ? block_get() : shim_map(total, -1);
    if (!buf) return;
    unsigned char *w = buf;
    uint16_t pl = (uint16_t)s_len(path);
    memcpy(w, &pl, 2); memcpy(w + 2, path, pl); w += 2 + pl;
    memcpy(w, &err, 4); memcpy(w + 4, &s->count, 4); w += 8;
    for (uint32_t i = 0; i < s->count; i++) {
        struct dirent64 *e = s->ents[i];
        uint16_t nl = (uint16_t)s_len(e->d_name);
        uint64_t ino = e->d_ino;
        memcpy(w, &ino, 8); w[8] = e->d_type; memcpy(w + 9, &nl, 2); memcpy(w + DENT_HEAD, e->d_name, nl);
        w += DENT_HEAD + nl;
    }
    rec(t, CH_DIRENTS, OP_OPENDIR, buf, (uint32_t)total);
    if (total <= DBLOCK) block_put(buf);
    else shim_unmap(buf, total);
}

static void drift_report(tls_t *t, const char *path) {
    char line[1400];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, "drift\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tchannel=dirents\tpos="); p = u_put(p, end, t->st[CH_DIRENTS].pos - 1);
    p = s_put(p, end, "\trecorded=listing\tasked=opendir(path=");
    p = s_put(p, end, path);
    p = s_put(p, end, ") lists different entries now\n");
    append_report(line, (size_t)(p - line));
}

/* A set of names, by count and an order-independent digest (no copy, no sort): how a
 * recorded listing is compared with the live one. */
typedef struct { uint32_t count; uint64_t sum, xor; } names_t;

static void names_add(names_t *n, const char *name) {
    uint64_t h = name_hash(name);
    n->sum += h;
    n->xor ^= h * 0x9e3779b97f4a7c15ULL;
    n->count++;
}

static names_t live_names(DIR *live) {
    names_t n = {0};
    struct dirent64 *e;
    while ((e = real_readdir64(live)) != NULL) names_add(&n, e->d_name);
    return n;
}

static int names_eq(names_t a, names_t b) {
    return a.count == b.count && a.sum == b.sum && a.xor == b.xor;
}

/* Build replay: is the recorded listing (count entries at q) the live one? A directory
 * of the build's code lists what the build has (a new module must be found); one of the
 * recorded workspace lists as recorded anyway. The live stream is rewound after. */
static int listing_same(DIR *live, int32_t err, const unsigned char *q, uint32_t count) {
    if ((err != 0) != (live == NULL)) return 0;
    if (!live) return 1;
    names_t l = live_names(live);
    RESOLVE(rewinddir);
    real_rewinddir(live);
    names_t r = {0};
    char name[256];
    for (uint32_t i = 0; i < count; i++) {
        uint16_t nl;
        memcpy(&nl, q + 9, 2);
        uint16_t k = nl < 255 ? nl : 255;
        memcpy(name, q + DENT_HEAD, k);
        name[k] = 0;
        names_add(&r, name);
        q += DENT_HEAD + nl;
    }
    return names_eq(l, r);
}

/* Replay: the recorded listing `q` (after the path) served; a different live one reported
 * as drift. (DIR *)-1: a build replay whose live directory differs lists it live. */
static DIR *listing_served(tls_t *t, const char *path, DIR *live, const unsigned char *q) {
    int32_t err; uint32_t count;
    memcpy(&err, q, 4); memcpy(&count, q + 4, 4); q += 8;
    if (UNLIKELY(g_build) && !listing_same(live, err, q, count)) {
        build_miss(CH_DIRENTS);
        return (DIR *)-1; /* the caller lists it live */
    }
    if (err) {
        if (live) real_closedir(live);
        errno = err;
        return NULL;
    }
    DIR *d = live ? live : real_opendir("/");
    if (!d) { errno = EIO; return NULL; }
    dslot_t *s = dslot_new(d);
    if (!s) return d;
    s->block = block_get();
    if (!s->block) { s->d = NULL; return d; }
    s->cap = DBLOCK;
    s->count = 0;
    s->next = 0;
    size_t used = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint64_t ino; uint16_t nl;
        memcpy(&ino, q, 8); memcpy(&nl, q + 9, 2);
        block_add(s, &used, ino, q[8], (const char *)q + DENT_HEAD, nl);
        q += DENT_HEAD + nl;
    }
    /* ents[] was filled back to front: reverse into recorded order */
    for (uint32_t i = 0, j = s->count ? s->count - 1 : 0; i < j; i++, j--) {
        struct dirent64 *x = s->ents[i]; s->ents[i] = s->ents[j]; s->ents[j] = x;
    }
    /* compare with the live listing's names; STENO_DRIFT=0 skips reading it */
    int drift = live == NULL && !g_build;
    if (live && g_drift && !g_build) {
        names_t r = {0};
        for (uint32_t i = 0; i < s->count; i++) names_add(&r, s->ents[i]->d_name);
        drift = !names_eq(live_names(live), r);
    }
    if (drift) drift_report(t, path);
    return d;
}

static DIR *dir_common(const char *path, DIR *live, int live_err) {
    tls_t *t = me();
    t->guard++;
    DIR *out = live;
    unsigned char args[2 + 1024];
    uint16_t pl = (uint16_t)s_len(path);
    if (pl > 1024) pl = 1024;
    memcpy(args, &pl, 2); memcpy(args + 2, path, pl);
    served_t got;
    switch (tape_step(t, CH_DIRENTS, OP_OPENDIR, args, 2u + pl, &got)) {
    case STEP_SERVED:
        out = listing_served(t, path, live, got.p + 2 + pl);
        if (out != (DIR *)-1) break;
        out = live; /* fall through: listed live */
        __attribute__((fallthrough));
    case STEP_LIVE:
        if (!live) errno = live_err;
        else { dslot_t *s = dslot_new(live); if (s && !live_listing(s, live)) s->d = NULL; }
        break;
    case STEP_RECORD: {
        dslot_t tmp = {0};
        dslot_t *s = live ? dslot_new(live) : &tmp;
        if (s && live) {
            s->next = 0;
            if (!live_listing(s, live)) s->count = 0;
        }
        listing_record(t, s ? s : &tmp, path, live ? 0 : live_err);
        if (!live) errno = live_err;
        break;
    }
    }
    t->guard--;
    return out;
}

EXPORT DIR *opendir(const char *path) {
    RESOLVE(opendir); RESOLVE(readdir64); RESOLVE(closedir);
    if (!ACTIVE()) return real_opendir(path);
    DIR *d = real_opendir(path);
    int err = d ? 0 : errno;
    return dir_common(path, d, err);
}

EXPORT DIR *fdopendir(int fd) {
    RESOLVE(fdopendir); RESOLVE(readdir64); RESOLVE(closedir); RESOLVE(opendir);
    if (!ACTIVE()) return real_fdopendir(fd);
    char link[64], path[1024];
    char *p = s_put(link, link + 63, "/proc/self/fd/");
    p = u_put(p, link + 63, (unsigned)fd);
    *p = 0;
    long n = RS4(SYS_readlinkat, AT_FDCWD, link, path, sizeof path - 1);
    path[n > 0 ? n : 0] = 0;
    DIR *d = real_fdopendir(fd);
    int err = d ? 0 : errno;
    return dir_common(path, d, err);
}

EXPORT struct dirent64 *readdir64(DIR *d) {
    RESOLVE(readdir64);
    if (g_mode) {
        dslot_t *s = dslot_find(d);
        if (s && s->block) {
            if (s->next >= s->count) return NULL;
            return s->ents[s->next++];
        }
    }
    return real_readdir64(d);
}

EXPORT struct dirent *readdir(DIR *d) { return (struct dirent *)readdir64(d); }

EXPORT void rewinddir(DIR *d) {
    RESOLVE(rewinddir);
    if (g_mode) {
        dslot_t *s = dslot_find(d);
        if (s && s->block) { s->next = 0; return; }
    }
    real_rewinddir(d);
}

EXPORT int closedir(DIR *d) {
    RESOLVE(closedir);
    if (g_mode) {
        dslot_t *s = dslot_find(d);
        if (s) {
            if (s->block && s->block != (unsigned char *)1) block_put(s->block);
            s->block = (unsigned char *)1; /* tombstone keeps probe chains intact */
            s->d = NULL;
            s->count = s->next = 0;
        }
    }
    return real_closedir(d);
}

/* glibc's scandir() opens the directory through an internal alias of opendir that this
 * library cannot interpose, so it is rebuilt here on the wrapped opendir/readdir64:
 * the listing is taped (and sorted) like any other. Not a hot path: malloc is fine. */
typedef int (*scan_filter_t)(const struct dirent64 *);
typedef int (*scan_compar_t)(const struct dirent64 **, const struct dirent64 **);

static int scandir_common(const char *path, struct dirent64 ***out, scan_filter_t filter,
                          scan_compar_t compar) {
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent64 **v = NULL;
    size_t n = 0, cap = 0;
    struct dirent64 *e;
    int err = 0;
    while ((e = readdir64(d)) != NULL) {
        if (filter && !filter(e)) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            struct dirent64 **nv = realloc(v, nc * sizeof *nv);
            if (!nv) { err = ENOMEM; break; }
            v = nv;
            cap = nc;
        }
        size_t sz = offsetof(struct dirent64, d_name) + s_len(e->d_name) + 1;
        struct dirent64 *c = malloc(sz < sizeof *c ? sizeof *c : sz);
        if (!c) { err = ENOMEM; break; }
        memcpy(c, e, sz);
        v[n++] = c;
    }
    closedir(d);
    if (err) {
        while (n) free(v[--n]);
        free(v);
        errno = err;
        return -1;
    }
    if (compar && n > 1)
        qsort(v, n, sizeof *v, (int (*)(const void *, const void *))compar);
    *out = v;
    return (int)n;
}

EXPORT int scandir64(const char *path, struct dirent64 ***out, scan_filter_t filter,
                     scan_compar_t compar) {
    if (!g_mode) {
        RESOLVE(scandir64);
        return real_scandir64(path, out, filter, compar);
    }
    return scandir_common(path, out, filter, compar);
}

EXPORT int scandir(const char *path, struct dirent ***out, int (*filter)(const struct dirent *),
                   int (*compar)(const struct dirent **, const struct dirent **)) {
    /* on x86_64 struct dirent and struct dirent64 have the same layout */
    return scandir64(path, (struct dirent64 ***)out, (scan_filter_t)filter,
                     (scan_compar_t)compar);
}
