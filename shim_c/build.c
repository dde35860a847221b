/* Build replay (STENO_BUILD=1, `stenograph replay --build`): the recording of one build
 * served to another.
 *
 * Every channel the shim tapes is incidental to what an agent does: a new build reads
 * clocks, entropy, listings and identity a different number of times, from other call
 * sites, and its threads interleave otherwise. So in build mode a record is served while
 * it fits the call (same channel, op and arguments; call sites are not compared) and the
 * call runs live when it does not, leaving the stream where it is so later calls can line
 * up again; the threads run unscheduled. Nothing here is a divergence: each miss is
 * counted per channel (the first one per channel is described) and reported as drift.
 * What is strict -- requests, tool calls, effects, the exit status -- is judged by the
 * Python hooks and by `stenograph replay`. Live clocks continue from the last value
 * served (clock.c: build_anchor), so wall clocks stay near the recorded times and
 * monotonic ones keep moving. */

static int g_build;
static uint32_t g_bdrift[NCH]; /* misses per channel in this process image */

static void append_report(const char *line, size_t n);
static char *s_put(char *p, char *end, const char *s);
static char *u_put(char *p, char *end, unsigned long long v);

/* Count a miss on `ch`; 1 if it is the channel's first (to be described). */
static int build_miss(int ch) {
    if ((unsigned)ch >= NCH) ch = 0;
    return __atomic_fetch_add(&g_bdrift[ch], 1, __ATOMIC_RELAXED) == 0;
}

/* A record the build did not ask for (a stat of a module the old build imported) would
 * stop its stream for good: so a miss looks up to BUILD_LOOKAHEAD records ahead for one
 * that fits, and skips to it, the skipped records counted as drift. */
#define BUILD_LOOKAHEAD 256

static const unsigned char *build_fit(stream_t *s, int ch, int op, const void *args,
                                      uint32_t argn, uint32_t *plen) {
    size_t off = s->off;
    for (int k = 0; k < BUILD_LOOKAHEAD && off + 8 <= s->size; k++) {
        const unsigned char *rh = s->base + off;
        uint32_t n;
        memcpy(&n, rh + 4, 4);
        if (off + 8 + n > s->size) break;
        if (rh[0] == ch && rh[1] == op && n >= argn && memcmp(rh + 8, args, argn) == 0) {
            if (k) __atomic_fetch_add(&g_bdrift[ch], (uint32_t)k, __ATOMIC_RELAXED);
            s->off = off + 8 + n;
            s->pos += (uint32_t)k + 1;
            *plen = n;
            return rh + 8;
        }
        off += 8 + n;
    }
    return NULL;
}

/* The counts, as `drift-count` lines (at exit, before exec: each image counts its own). */
static void build_flush(void) {
    if (!g_build || g_mode != MODE_REPLAY) return;
    for (int ch = 0; ch < NCH; ch++) {
        uint32_t n = __atomic_exchange_n(&g_bdrift[ch], 0, __ATOMIC_RELAXED);
        if (!n) continue;
        char line[400];
        char *p = line, *end = line + sizeof line - 2;
        p = s_put(p, end, "drift-count\tproc="); p = s_put(p, end, g_proc);
        p = s_put(p, end, "\tchannel="); p = s_put(p, end, CH_NAMES[ch]);
        p = s_put(p, end, "\tcount="); p = u_put(p, end, n);
        *p++ = '\n';
        append_report(line, (size_t)(p - line));
    }
}
