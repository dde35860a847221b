/* Start-up and shut-down: resolve libc, read and hide STENO_*, install the seccomp
 * filter, tape procinfo; at exit, ship everything and wait for the recorder. */

static void resolve_all(void) {
#define REAL(name, ret, params) RESOLVE(name);
#include "wrapped.def"
}

static void copy_env(char *dst, size_t cap, const char *v) {
    size_t n = s_len(v);
    if (n >= cap) n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

/* The status the process ends with (exit's, through on_exit; _exit's), for the
 * recorder: the result of a command that was an effect (MSG_EXIT "status N"). */
static int g_exit_status = -1;
static void note_exit_status(int status, void *arg) {
    (void)arg;
    g_exit_status = status;
}

/* The handler above is registered again as main starts: the constructor's registration
 * comes before libc's of the loader's finalizer, so it runs after this library's
 * destructor (final_flush), too late for a program that returns from main or calls exit. */
static int (*g_main)(int, char **, char **);
static int main_noting_exit(int argc, char **argv, char **envp) {
    if (g_mode != MODE_OFF) on_exit(note_exit_status, NULL);
    return g_main(argc, argv, envp);
}

EXPORT int __libc_start_main(int (*main)(int, char **, char **), int argc, char **argv,
                             void (*init)(void), void (*fini)(void), void (*rtld_fini)(void),
                             void *stack_end) {
    RESOLVE(__libc_start_main);
    g_main = main;
    return real___libc_start_main(main_noting_exit, argc, argv, init, fini, rtld_fini,
                                  stack_end);
}

static void tape_proto_load(void) {
    char path[TAPE_PATH], b[16];
    tape_path(path, 0, "protocol");
    long n = tape_file_get(path, b, sizeof b - 1);
    if (n <= 0) return; /* (a tape prepared by this stenograph: its own protocol) */
    int v = 0;
    for (long i = 0; i < n && b[i] >= '0' && b[i] <= '9'; i++) v = v * 10 + (b[i] - '0');
    if (v > 0) g_tape_proto = v;
}

__attribute__((constructor)) static void shim_init(void) {
    if (g_inited) return;
    resolve_all();
    const char *mode = NULL, *sock = NULL, *tape = NULL, *proc = NULL, *shim = NULL,
               *next = NULL, *lenient = NULL, *pfd = NULL;
    for (char **e = environ; e && *e; e++) {
        const char *v = *e;
        if (!starts(v, "STENO_")) continue;
        if (starts(v, "STENO_EDITED=1")) g_anysite = 1; /* another program: other call sites */
        if (starts(v, "STENO_BUILD=1")) g_build = g_anysite = 1; /* kept for children too */
        if (starts(v, "STENO_MODE=")) mode = v + 11;
        else if (starts(v, "STENO_SOCK=")) sock = v + 11;
        else if (starts(v, "STENO_TAPE=")) tape = v + 11;
        else if (starts(v, "STENO_PROC=")) proc = v + 11;
        else if (starts(v, "STENO_SHIM=")) shim = v + 11;
        else if (starts(v, "STENO_NEXT=")) next = v + 11;
        else if (starts(v, "STENO_LENIENT=")) lenient = v + 14;
        else if (starts(v, "STENO_NONET=")) g_nonet = v[12] == '1';
        else if (starts(v, "STENO_FILT=")) copy_env(g_filt, sizeof g_filt, v + 11);
        else if (starts(v, "STENO_DRIFT=")) g_drift = v[12] != '0';
        else if (starts(v, "STENO_PFD=")) pfd = v + 10;
        else {
            if (starts(v, "STENO_RESUME=1")) g_resume = 1; /* kept for children and Python */
            if (starts(v, "STENO_PATHMAP=")) pm_load(v + 14); /* kept for children */
            size_t n = s_len(v) + 1;
            if (g_extra_len + n < sizeof g_extra) {
                memcpy(g_extra + g_extra_len, v, n);
                g_extra_len += n;
            }
        }
    }
    int m = MODE_OFF;
    if (mode && mode[0] == 'r' && mode[2] == 'c') m = MODE_RECORD;
    else if (mode && mode[0] == 'r' && mode[2] == 'p') m = MODE_REPLAY;
    if (m == MODE_RECORD && !sock) m = MODE_OFF;
    if (m == MODE_REPLAY && !tape) m = MODE_OFF;
    if (m != MODE_OFF) {
        copy_env(g_sockpath, sizeof g_sockpath, sock ? sock : "");
        copy_env(g_tape, sizeof g_tape, tape ? tape : "");
        copy_env(g_proc, sizeof g_proc, proc ? proc : "0");
        copy_env(g_shim, sizeof g_shim, shim ? shim : "");
        g_proclen = (uint16_t)s_len(g_proc);
        g_lenient = lenient && lenient[0] == '1';
        uint32_t tbase = 0, cnext = 0;
        if (next) {
            const char *p = next;
            while (*p >= '0' && *p <= '9') tbase = tbase * 10 + (uint32_t)(*p++ - '0');
            if (*p == ',') p++;
            while (*p >= '0' && *p <= '9') cnext = cnext * 10 + (uint32_t)(*p++ - '0');
        }
        T.tindex = tbase;
        T.init = 1;
        g_tnext = tbase + 1;
        g_cnext = cnext;
        /* hide STENO_* from the program: record and replay must look alike */
        char **w = environ;
        for (char **e = environ; e && *e; e++)
            if (!starts(*e, "STENO_")) *w++ = *e;
        if (w) *w = NULL;
        pthread_key_create(&g_key, thread_key_done);
        pthread_setspecific(g_key, (void *)1);
        g_py_gil_check = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Check");
    }
    g_mode = m;
    g_virt = m == MODE_REPLAY;
    g_resume = g_resume && m == MODE_REPLAY;
    g_build = g_build && m == MODE_REPLAY; /* with g_resume: a fork of another build */
    if (g_build) g_lenient = g_clock_shift = 1;
    if (m == MODE_REPLAY) tape_proto_load();
    if (m != MODE_OFF && pfd && SINCE(5)) pfd_inherit(pfd);
    if (m != MODE_OFF) install_filters();
    if (m == MODE_REPLAY && !g_resume && !g_build) {
        sig_defer_deaths();
        deferred_load();
        sig_exec_arrived();
    }
    g_inited = 1;
    if (m != MODE_OFF) {
        on_exit(note_exit_status, NULL);
        procinfo();
    }
}

static void final_flush(void) {
    if (g_mode != MODE_RECORD || g_final || reentered()) return; /* see before_exec */
    T.guard++;
    net_conns_end();
    rec(me(), CH_IDENTITY, OP_EXIT, &g_final, 0); /* ended through exit (see await_kill) */
    char body[24];
    char *p = body;
    if (g_exit_status >= 0) {
        p = s_put(p, body + sizeof body - 1, "status ");
        p = u_put(p, body + sizeof body - 1, (unsigned)g_exit_status);
    }
    barrier_with(MSG_EXIT, body, (size_t)(p - body));
    g_final = 1;
    T.guard--;
}

__attribute__((destructor)) static void shim_fini(void) {
    build_flush();
    final_flush();
}
