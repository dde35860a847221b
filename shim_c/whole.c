/* Children the shim cannot see into, recorded whole (io ops 4-6).
 *
 * A static program, or one with another dynamic loader (Go's own binaries, musl tools),
 * never loads this library: nothing it reads from the world is taped, so at replay it
 * would run live and print something else. So an exec of one is not made as it is.
 * Recording: the process that was about to exec it stays, runs it as a child of its own
 * with its stdout and stderr through pipes, passes every byte on as it comes and tapes
 * it (which fd, the bytes), then tapes the child's wait status and ends the same way.
 * Replay: the program is not run at all; the same process writes the recorded bytes to
 * the same fds, in the same order and pieces, and ends with the recorded status. What it
 * reads from stdin, and files it changes, are not on the tape (docs/determinism.md). */

static void before_exec(int drained); /* proc.c: the rings drained before the image changes */

/* The file exec would run: `file` as given, or found on PATH (execvp's search). */
static const char *whole_path(const char *file, int search, char *buf, size_t cap) {
    if (!search || strchr(file, '/')) return file;
    const char *path = getenv("PATH");
    if (!path) path = "/bin:/usr/bin";
    for (const char *p = path; *p;) {
        const char *e = p;
        while (*e && *e != ':') e++;
        size_t n = (size_t)(e - p);
        if (n + 1 + s_len(file) + 1 <= cap) {
            memcpy(buf, p, n);
            buf[n] = '/';
            memcpy(buf + n + 1, file, s_len(file) + 1);
            if (!is_err(RS2(SYS_access, buf, X_OK))) return buf;
        }
        p = *e ? e + 1 : e;
    }
    return file;
}

/* The arguments of OP_WHOLE_EXEC: argv, each string with its NUL (replay checks them). */
static uint32_t whole_args(char *const argv[], char *out, uint32_t cap) {
    uint32_t n = 0;
    for (int i = 0; argv && argv[i]; i++) {
        size_t k = s_len(argv[i]) + 1;
        if (n + k > cap) break;
        memcpy(out + n, argv[i], k);
        n += (uint32_t)k;
    }
    return n;
}

static void whole_end(int status) {
    if (WIFSIGNALED(status)) {
        struct { void *h; unsigned long flags; void *restorer; uint64_t mask; } dfl = {0};
        RS4(SYS_rt_sigaction, WTERMSIG(status), &dfl, NULL, 8);
        uint64_t none = 0;
        RS4(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
        RS2(SYS_kill, RS0(SYS_getpid), WTERMSIG(status));
    }
    die(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

/* 0, or -errno: a reader gone (EPIPE: `... | head -1`). SIGPIPE is ignored while this
 * process stands in for the program: it dies of it as the tape says, not as timing does. */
static long write_all(int fd, const unsigned char *b, size_t n) {
    while (n) {
        long k = RS3(SYS_write, fd, b, n);
        if (k == -EINTR) continue;
        if (is_err(k)) return k;
        if (k == 0) return -EIO;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static void whole_ignore_sigpipe(void) {
    struct { void *h; unsigned long flags; void *restorer; uint64_t mask; } ign = {SIG_IGN, 0, 0, 0};
    RS4(SYS_rt_sigaction, SIGPIPE, &ign, NULL, 8);
}

static void whole_record(tls_t *t, const char *path, char *const argv[], char *const envp[],
                         int drained) {
    int out[2], err[2];
    if (is_err(RS2(SYS_pipe2, out, O_CLOEXEC)) || is_err(RS2(SYS_pipe2, err, O_CLOEXEC)))
        return; /* exec it as it is */
    before_exec(drained);
    long pid = RS6(SYS_clone, SIGCHLD, 0, 0, 0, 0, 0);
    if (pid == 0) {
        /* its own addresses again: the inherited filter traps calls made from where this
         * process's program sits, and a position-independent Go program would sit there */
        long pers = RS1(SYS_personality, 0xffffffffUL);
        if (!is_err(pers)) RS1(SYS_personality, (unsigned long)pers & ~0x0040000UL);
        RS2(SYS_dup2, out[1], 1);
        RS2(SYS_dup2, err[1], 2);
        RS3(SYS_execve, path, argv, envp);
        RS1(SYS_exit_group, 127);
    }
    RS1(SYS_close, out[1]);
    RS1(SYS_close, err[1]);
    if (pid < 0) die(127);
    whole_ignore_sigpipe();
    int piped = 0; /* our reader went away: the program's next write would have killed it */
    struct pollfd pf[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    int open = 2;
    static unsigned char buf[4 + 65536];
    while (open) {
        long r = RS3(SYS_poll, pf, 2, -1);
        if (r == -EINTR) continue;
        if (is_err(r)) break;
        for (int i = 0; i < 2; i++) {
            if (pf[i].fd < 0 || !pf[i].revents) continue;
            long k = RS3(SYS_read, pf[i].fd, buf + 4, 65536);
            if (k == -EINTR || k == -EAGAIN) continue;
            if (k <= 0) {
                RS1(SYS_close, pf[i].fd);
                pf[i].fd = -1;
                open--;
                continue;
            }
            uint32_t fd = (uint32_t)(i + 1);
            memcpy(buf, &fd, 4);
            rec(t, CH_IO, OP_WHOLE_OUT, buf, 4 + (uint32_t)k);
            if (write_all((int)fd, buf + 4, (size_t)k) == -EPIPE) piped = 1;
        }
        if (piped) break;
    }
    int status = 0;
    if (piped) { /* as the program itself would have ended: killed by SIGPIPE */
        RS2(SYS_kill, pid, SIGPIPE);
        RS1(SYS_close, out[0]);
        RS1(SYS_close, err[0]);
    }
    while (RS4(SYS_wait4, pid, &status, 0, 0) == -EINTR) {}
    if (piped) status = SIGPIPE; /* (a wait status: killed by it) */
    int32_t st = status;
    rec(t, CH_IO, OP_WHOLE_EXIT, &st, 4);
    if (WIFEXITED(status)) g_exit_status = WEXITSTATUS(status);
    final_flush();
    whole_end(status);
}

static void whole_serve(tls_t *t) {
    whole_ignore_sigpipe();
    for (;;) {
        served_t s;
        if (tape_peek(t, CH_IO, OP_WHOLE_OUT, NULL, 0) == 1 &&
            tape_step(t, CH_IO, OP_WHOLE_OUT, NULL, 0, &s) == STEP_SERVED) {
            uint32_t fd;
            memcpy(&fd, s.p, 4);
            write_all((int)fd, s.p + 4, s.n - 4);
            continue;
        }
        if (tape_step(t, CH_IO, OP_WHOLE_EXIT, NULL, 0, &s) != STEP_SERVED) die(1);
        int32_t st;
        memcpy(&st, s.p, 4);
        whole_end(st);
    }
}

/* An exec of `path` (found by pm_unfit to be a program the shim cannot follow into):
 * recorded or served whole, never returns then.
 * Returns if the exec is to be made as it is (the shim will be in the new image, or the
 * run is not taped here: paused, a build replay that runs live). */
static void whole_exec(const char *path, char *const argv[], char *const envp[], int drained) {
    if (!g_mode || T.guard || reentered()) return;
    tls_t *t = me();
    char args[4096];
    uint32_t an = whole_args(argv, args, sizeof args);
    served_t s;
    switch (tape_step(t, CH_IO, OP_WHOLE_EXEC, args, an, &s)) {
    case STEP_RECORD:
        rec(t, CH_IO, OP_WHOLE_EXEC, args, an);
        whole_record(t, path, argv, envp, drained);
        return;
    case STEP_SERVED:
        whole_serve(t);
        return;
    case STEP_LIVE:
    default:
        return;
    }
}

/* Replay: is the next record of this process's io stream a whole child's exec of argv
 * (a command a resume did not run, its output given by a person: whole_given)? */
static int whole_taped(char *const argv[]) {
    if (T.guard || reentered()) return 0;
    char args[4096];
    uint32_t an = whole_args(argv, args, sizeof args);
    return tape_peek(me(), CH_IO, OP_WHOLE_EXEC, args, an) == 1;
}

/* Record (a resume gone live): a command a person settled as done, with its output, is
 * not run; this process gives the output file's bytes as its stdout and ends with
 * `status`, taped as a whole child's, so a replay of the run serves the same. */
static void whole_given(char *const argv[], int32_t status, const char *file) {
    tls_t *t = me();
    char args[4096];
    uint32_t an = whole_args(argv, args, sizeof args);
    rec(t, CH_IO, OP_WHOLE_EXEC, args, an);
    whole_ignore_sigpipe();
    long fd = RS4(SYS_openat, AT_FDCWD, file, O_RDONLY | O_CLOEXEC, 0);
    static unsigned char buf[4 + 65536];
    for (long k = 1; !is_err(fd) && k > 0;) {
        k = RS3(SYS_read, fd, buf + 4, 65536);
        if (k == -EINTR) { k = 1; continue; }
        if (k <= 0) break;
        uint32_t one = 1;
        memcpy(buf, &one, 4);
        rec(t, CH_IO, OP_WHOLE_OUT, buf, 4 + (uint32_t)k);
        if (write_all(1, buf + 4, (size_t)k) == -EPIPE) break;
    }
    if (!is_err(fd)) RS1(SYS_close, fd);
    int32_t st = (status & 0xff) << 8; /* a wait status: exited with it */
    rec(t, CH_IO, OP_WHOLE_EXIT, &st, 4);
    g_exit_status = status & 0xff;
    final_flush();
    whole_end(st);
}
