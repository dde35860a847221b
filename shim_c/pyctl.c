/* Exports besides the wrapped symbols: the controls the Python hooks reach through ctypes
 * (stenograph.interpose.pytape), and the reentry counter. */

/* Pause the tape for this thread (nestable): the Python hooks call these around work that
 * replay will not repeat -- their own I/O, and in record mode the real network or tool
 * call -- so none of it lands on the tape. Children spawned while paused run off the
 * tape and take no spawn number. */
EXPORT void steno_pause(void) { T.guard++; }
EXPORT void steno_resume(void) { if (T.guard > 0) T.guard--; }

/* How many wrapped calls of this process ran live and untaped because a signal handler
 * made them while its thread was inside the shim (see reentered). */
EXPORT unsigned long steno_reentries(void) { return __atomic_load_n(&g_reentries, __ATOMIC_RELAXED); }

/* The STENO_* settings the shim hid from the environment; STENO_PROC follows forks. */
EXPORT const char *steno_getenv(const char *name) {
    if (!name || !g_mode) return NULL;
    if (!strcmp(name, "STENO_MODE")) return g_mode == MODE_RECORD ? "record" : "replay";
    if (!strcmp(name, "STENO_PROC")) return g_proc;
    if (!strcmp(name, "STENO_TAPE")) return g_mode == MODE_REPLAY ? g_tape : NULL;
    if (!strcmp(name, "STENO_SOCK")) return g_mode == MODE_RECORD ? g_sockpath : NULL;
    if (!strcmp(name, "STENO_LENIENT")) return g_lenient ? "1" : NULL;
    size_t n = s_len(name);
    for (size_t at = 0; at < g_extra_len; at += s_len(g_extra + at) + 1) {
        const char *e = g_extra + at;
        if (!strncmp(e, name, n) && e[n] == '=') return e + n + 1;
    }
    return NULL;
}
