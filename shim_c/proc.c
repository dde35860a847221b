/* Processes: fork/vfork, exec*, posix_spawn*, system, popen, _exit. Children get
 * their process path and the shim's variables back in their environment. */

static void child_path(char *out, size_t cap, uint32_t idx) {
    char *p = s_put(out, out + cap - 1, g_proc);
    p = s_put(p, out + cap - 1, ".");
    p = u_put(p, out + cap - 1, idx);
    *p = 0;
}

/* After fork: a new process path, thread 0, empty buffers, own connection, fresh streams. */
static void after_fork_child(uint32_t idx) {
    char np[256];
    pid_t parent = g_vpid;
    g_vpid = 0;
    g_vppid = g_virt && g_mode == MODE_RECORD ? parent : 0; /* resumed, gone live */
    g_pm_lock = 0; /* the pid map stays: siblings' pids keep their live values */
    T.guard++;
    child_path(np, sizeof np, idx);
    memcpy(g_proc, np, s_len(np) + 1);
    g_proclen = (uint16_t)s_len(g_proc);
    g_tnext = 1;
    g_cnext = 0;
    g_barrier_lock = 0;
    g_dirs_lock = 0;
    if (g_sock >= 0) RS1(SYS_close, g_sock);
    g_sock = -1;
    T.tindex = 0;
    T.init = 1;
    ring_after_fork_child();
    g_live_threads = 1;
    g_parked = 0;
    g_dying = 0;
    for (int c = 0; c < NCH; c++) T.st[c].mapped = 0;
    sched_after_fork_child();
    T.guard--;
    procinfo();
}

static long child_pid(tls_t *t, int op, long live, int *rcp);

EXPORT pid_t fork(void) {
    RESOLVE(fork);
    if (!g_mode) return real_fork();
    /* paused by a Python hook, or forking from a handler that interrupted the shim: the
     * child runs off the tape, unnumbered */
    if (T.guard || reentered()) {
        pid_t pid = real_fork();
        if (pid == 0) {
            g_mode = MODE_OFF;
            if (g_sock >= 0) RS1(SYS_close, g_sock);
            g_sock = -1;
            ring_after_fork_child();
        }
        return pid;
    }
    tls_t *t = me();
    uint32_t idx = __atomic_add_fetch(&g_cnext, 1, __ATOMIC_RELAXED);
    /* pthread_atfork handlers run untaped: the child's would write to the parent's rings
     * (shared memory) before after_fork_child gives it its own */
    t->guard++;
    pid_t pid = real_fork();
    t->guard--;
    if (pid == 0) { after_fork_child(idx); return 0; }
    return (pid_t)child_pid(t, OP_FORK, pid < 0 ? -errno : pid, 0);
}

/* The pid of a child just started, as the parent sees it: record tapes the live one
 * (OP_FORK: i32 result; OP_SPAWN: i32 rc | i32 pid), replay serves the recorded one and
 * learns recorded -> live. fork: returns the pid (or -1, errno); spawn: the pid, the
 * rc in *rcp. */
static long child_pid(tls_t *t, int op, long live, int *rcp) {
    int32_t v[2] = {rcp ? *rcp : 0, (int32_t)live};
    int32_t *res = op == OP_FORK ? &v[1] : v;
    uint32_t len = op == OP_FORK ? 4 : 8;
    served_t s;
    switch (tape_step(t, CH_IDENTITY, op, NULL, 0, &s)) {
    case STEP_SERVED:
        if (s.n >= len) {
            int32_t r[2] = {0, 0};
            memcpy(op == OP_FORK ? &r[1] : r, s.p, len);
            if (r[1] > 0 && live > 0) pid_learn(r[1], (pid_t)live);
            if (rcp) *rcp = r[0];
            if (op == OP_FORK && r[1] < 0) { errno = -r[1]; return -1; }
            return r[1];
        }
        break;
    case STEP_LIVE:
        break;
    case STEP_RECORD:
        rec(t, CH_IDENTITY, op, res, len);
        break;
    }
    if (op == OP_FORK && live < 0) { errno = (int)-live; return -1; }
    return live;
}

/* vfork shares the parent's memory, which would let the child overwrite the shim's
 * state; a real fork is what a vfork+exec means anyway. */
EXPORT pid_t vfork(void) { return fork(); }

/* Build a child environment: the given one without STENO_*, plus the shim's variables. */
static char **build_env(char *const *envp, const char *proc, uint32_t tbase, uint32_t cnext,
                        size_t *maplen) {
    size_t count = 0, strbytes = 0;
    const char *preload = NULL;
    for (char *const *e = envp; e && *e; e++) {
        count++;
        if (starts(*e, "LD_PRELOAD=")) preload = *e + 11;
    }
    strbytes = 3 * 1024 + s_len(g_shim) * 2 + s_len(g_tape) + s_len(g_sockpath) +
               (preload ? s_len(preload) : 0);
    size_t nextra = 0;
    for (size_t at = 0; at < g_extra_len; at += s_len(g_extra + at) + 1) nextra++;
    count += nextra;
    size_t len = (count + 13) * sizeof(char *) + strbytes;
    char **out = shim_map(len, -1);
    if (!out) return NULL;
    *maplen = len;
    char *sp = (char *)(out + count + 13), *end = (char *)out + len - 1;
    size_t k = 0;
    for (char *const *e = envp; e && *e; e++)
        if (!starts(*e, "STENO_") && !starts(*e, "LD_PRELOAD=")) out[k++] = *e;
#define ADD(...) do { char *s0 = sp; const char *parts[] = {__VA_ARGS__, NULL}; \
        for (int i = 0; parts[i]; i++) sp = s_put(sp, end, parts[i]); \
        *sp++ = 0; out[k++] = s0; } while (0)
    int has = 0;
    if (preload) {
        const char *h = strstr(preload, g_shim);
        has = h != NULL;
    }
    if (has) ADD("LD_PRELOAD=", preload);
    else if (preload && *preload) ADD("LD_PRELOAD=", g_shim, ":", preload);
    else ADD("LD_PRELOAD=", g_shim);
    ADD("STENO_MODE=", g_mode == MODE_RECORD ? "record" : "replay");
    if (g_mode == MODE_RECORD || g_resume) ADD("STENO_SOCK=", g_sockpath);
    if (g_mode == MODE_REPLAY) ADD("STENO_TAPE=", g_tape);
    ADD("STENO_PROC=", proc);
    char nb[48];
    char *p = u_put(nb, nb + 47, tbase);
    *p++ = ',';
    p = u_put(p, nb + 47, cnext);
    *p = 0;
    ADD("STENO_NEXT=", nb);
    ADD("STENO_SHIM=", g_shim);
    if (g_lenient) ADD("STENO_LENIENT=1");
    if (g_nonet) ADD("STENO_NONET=1");
    if (g_filt[0]) ADD("STENO_FILT=", g_filt);
    if (!g_drift) ADD("STENO_DRIFT=0");
    char pfds[512];
    if (pfd_env(pfds, sizeof pfds)) ADD("STENO_PFD=", pfds);
    for (size_t at = 0; at < g_extra_len && k < count + 12; at += s_len(g_extra + at) + 1)
        out[k++] = g_extra + at;
#undef ADD
    out[k] = NULL;
    return out;
}

static void before_exec(int drained) {
    build_flush();
    deferred_save();
    if (g_mode != MODE_RECORD || reentered() || drained) return; /* (our own lock) */
    T.guard++;
    barrier(MSG_BARRIER); /* the recorder drains every ring of this process first */
    T.guard--;
}

/* Record (and a resume's prefix, whose execs a person may have settled): tell the
 * recorder what is about to run (MSG_EXEC), which drains this process as the exec
 * barrier does and decides (ANS_*): run it, refused by the policy, not to be run (a
 * command a person settled as done), or not run with its output given (`reply`: i32
 * status | the file of its stdout). ANS_GO without a recorder to ask. */
static int exec_ask(char *const argv[], int whole, char *reply, size_t cap) {
    reply[0] = ANS_GO;
    if (!g_sockpath[0] || T.guard || reentered() || !(g_mode == MODE_RECORD || g_resume))
        return ANS_GO;
    char body[4096], *end = body + sizeof body - 1;
    char *p = s_put(body, end, g_mode == MODE_RECORD ? "L" : "R"); /* live, or replayed */
    if (whole) p = s_put(p, end, "W"); /* a program the shim cannot see into */
    p = s_put(p, end, g_proc);
    p = s_put(p, end, "/exec/");
    p = u_put(p, end, g_tnext);
    *p++ = 0;
    long c = RS2(SYS_getcwd, p, (size_t)(end - p));
    p = c > 0 ? p + c : (*p = 0, p + 1); /* getcwd's length counts its NUL */
    for (int i = 0; argv && argv[i] && p < end; i++) {
        p = s_put(p, end, argv[i]);
        if (p < end) *p++ = 0;
    }
    T.guard++;
    int n = barrier_ask(MSG_EXEC, body, (size_t)(p - body), reply, cap - 1);
    T.guard--;
    reply[n] = 0;
    return reply[0] == ANS_ANSWERED && n < 6 ? ANS_SKIP : reply[0];
}

typedef int (*exec_fn)(const char *, char *const[], char *const[]);

/* Programs that run with one more flag under record and replay alike (argv[1]): what it
 * turns off is nondeterminism the shim cannot see, and the program's output does not
 * depend on it. V8's background threads (concurrent compilation, parallel GC) finish at
 * moments no blocking call marks, and the main thread then takes other paths. */
static const struct { const char *prog, *flag; } NORMALIZE[] = {
    {"node", "--single-threaded"},
    {"nodejs", "--single-threaded"},
};
#define NORMALIZE_MAX_ARGS 1024

/* argv with its program's normalizing flag inserted (into `out`), or argv itself. */
static char *const *normalized_argv(const char *path, char *const argv[], char **out) {
    const char *base = path;
    for (const char *c = path; *c; c++)
        if (*c == '/') base = c + 1;
    const char *flag = NULL;
    for (size_t i = 0; i < sizeof NORMALIZE / sizeof NORMALIZE[0]; i++)
        if (strcmp(base, NORMALIZE[i].prog) == 0) flag = NORMALIZE[i].flag;
    if (!flag || !SINCE(6) || !argv || !argv[0] || (argv[1] && strcmp(argv[1], flag) == 0))
        return argv;
    int n = 0;
    while (argv[n]) n++;
    if (n + 2 > NORMALIZE_MAX_ARGS) return argv;
    out[0] = argv[0];
    out[1] = (char *)flag;
    for (int i = 1; i <= n; i++) out[i + 1] = argv[i];
    return out;
}

/* exec with the shim's variables in the new image's environment, buffers shipped first. */
static int exec_taped(exec_fn real, const char *file, char *const argv[], char *const envp[]) {
    /* A path search by execve (CPython's subprocess tries each PATH entry) fails without
     * asking anyone where nothing executable is: one question per command, not per try. */
    int viable = real != real_execve || RS2(SYS_access, file, X_OK) == 0;
    char wb[PATH_MAX];
    const char *path = viable && g_mode ? whole_path(file, real == real_execvpe, wb, sizeof wb)
                                        : file;
    int whole = viable && g_mode && pm_unfit(path); /* (one look at the file per exec) */
    char reply[PATH_MAX + 8];
    int asked = viable ? exec_ask(argv, whole, reply, sizeof reply) : ANS_GO;
    if (asked == ANS_REFUSED) { errno = EACCES; return -1; } /* the policy refused it */
    if (asked == ANS_SKIP) { g_exit_status = 0; final_flush(); die(0); } /* done, a person said */
    if (asked == ANS_ANSWERED) { /* done, with its output: taped as a whole child's */
        int32_t status;
        memcpy(&status, reply + 1, 4);
        whole_given(argv, status, reply + 5);
    }
    /* a command a resume answered for a person: its output served as a whole child's */
    if (!whole && viable && g_mode == MODE_REPLAY && whole_taped(argv)) whole = 1;
    if (whole) whole_exec(path, argv, envp, asked == ANS_GO && g_mode == MODE_RECORD);
    size_t ml = 0;
    char **env = build_env(envp, g_proc, g_tnext, g_cnext, &ml);
    char *norm[NORMALIZE_MAX_ARGS];
    char *const *args = viable ? normalized_argv(path, argv, norm) : argv;
    before_exec(!viable || (g_mode == MODE_RECORD && g_sockpath[0] && !T.guard));
    sig_exec_block();
    int r = real(file, args, env ? env : envp);
    int e = errno;
    sig_exec_failed();
    if (env) shim_unmap(env, ml);
    errno = e;
    return r;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    RESOLVE(execve);
    if (!g_mode) return real_execve(path, argv, envp);
    return exec_taped(real_execve, path, argv, envp);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    RESOLVE(execvpe);
    if (!g_mode) return real_execvpe(file, argv, envp);
    return exec_taped(real_execvpe, file, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }
EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

#define COLLECT_ARGS(first, envout) \
    char *argv[4096]; size_t argc = 0; va_list ap; va_start(ap, first); \
    argv[argc++] = (char *)(first); \
    while (argc < 4095 && (argv[argc] = va_arg(ap, char *)) != NULL) argc++; \
    argv[argc] = NULL; envout; va_end(ap)

EXPORT int execl(const char *path, const char *arg, ...) {
    COLLECT_ARGS(arg, (void)0);
    return execve(path, argv, environ);
}
EXPORT int execlp(const char *file, const char *arg, ...) {
    COLLECT_ARGS(arg, (void)0);
    return execvpe(file, argv, environ);
}
EXPORT int execle(const char *path, const char *arg, ...) {
    char **envp;
    COLLECT_ARGS(arg, envp = va_arg(ap, char **));
    return execve(path, argv, envp);
}

static int spawn_common(int p, pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *at, char *const argv[], char *const envp[]) {
    uint32_t idx = __atomic_add_fetch(&g_cnext, 1, __ATOMIC_RELAXED);
    char cp[256];
    child_path(cp, sizeof cp, idx);
    size_t ml = 0;
    char **env = build_env(envp, cp, 0, 0, &ml);
    pid_t live = 0;
    int r = p ? real_posix_spawnp(&live, path, fa, at, argv, env ? env : envp)
              : real_posix_spawn(&live, path, fa, at, argv, env ? env : envp);
    if (env) shim_unmap(env, ml);
    if (reentered()) { if (pid && !r) *pid = live; return r; }
    pid_t v = (pid_t)child_pid(me(), OP_SPAWN, r ? 0 : live, &r);
    if (pid && !r) *pid = v;
    return r;
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *at, char *const argv[], char *const envp[]) {
    RESOLVE(posix_spawn);
    if (!g_mode || T.guard) return real_posix_spawn(pid, path, fa, at, argv, envp);
    return spawn_common(0, pid, path, fa, at, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *at, char *const argv[], char *const envp[]) {
    RESOLVE(posix_spawnp);
    if (!g_mode || T.guard) return real_posix_spawnp(pid, path, fa, at, argv, envp);
    return spawn_common(1, pid, path, fa, at, argv, envp);
}

/* system() and popen() spawn through glibc-internal posix_spawn, which this library
 * cannot see: give the child its path through a temporarily swapped environ. */
EXPORT int system(const char *cmd) {
    RESOLVE(system);
    if (!g_mode || !cmd || T.guard) return real_system(cmd);
    uint32_t idx = __atomic_add_fetch(&g_cnext, 1, __ATOMIC_RELAXED);
    char cp[256];
    child_path(cp, sizeof cp, idx);
    size_t ml = 0;
    char **env = build_env(environ, cp, 0, 0, &ml);
    char **saved = environ;
    if (env) environ = env;
    int r = real_system(cmd);
    environ = saved;
    if (env) shim_unmap(env, ml);
    return r;
}

EXPORT FILE *popen(const char *cmd, const char *type) {
    RESOLVE(popen);
    if (!g_mode || T.guard) return real_popen(cmd, type);
    uint32_t idx = __atomic_add_fetch(&g_cnext, 1, __ATOMIC_RELAXED);
    char cp[256];
    child_path(cp, sizeof cp, idx);
    size_t ml = 0;
    char **env = build_env(environ, cp, 0, 0, &ml);
    char **saved = environ;
    if (env) environ = env;
    FILE *f = real_popen(cmd, type);
    environ = saved;
    if (env) shim_unmap(env, ml);
    return f;
}

EXPORT void _exit(int status) {
    RESOLVE(_exit);
    g_exit_status = status & 0xff;
    build_flush();
    final_flush();
    real__exit(status);
    __builtin_unreachable();
}
EXPORT void _Exit(int status) { _exit(status); }
