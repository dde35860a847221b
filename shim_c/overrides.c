/* Wrappers that tape nothing themselves (rr's overrides.c): they stand in front of libc
 * only to keep the taped channels true.
 *
 *   open*, fopen*          mark the fds open on /dev/[u]random and the kernel's random
 *                          files (entropy.c reads them on the entropy channel)
 *   mkstemp*, mkdtemp,     make their names from getrandom() (taped), not from the
 *   mktemp                 getrandom inside libc that no wrapper sees
 *   kill, sched_*, ...     take a pid the program got from the tape: recorded -> live
 *   close_range, closefrom drop the fd marks, and leave the shim's own fds open
 */

/* A pipe opened again by path (`/proc/self/fd/N`, `/dev/fd/N`: the jobserver crate in
 * rustc and cargo reopens its inherited pipe to get a file description of its own) is
 * the same pipe: its reads are shaped as the pipe's are (io.c), since protocol 7. */
static int reopened_pipe(const char *path, int fd) {
    if (!path || (strncmp(path, "/proc/", 6) && strncmp(path, "/dev/fd/", 8))) return 0;
    struct stat st;
    return !is_err(RS2(SYS_fstat, fd, &st)) && S_ISFIFO(st.st_mode);
}

static int open_common(int dirfd, const char *path, int flags, mode_t mode) {
    long fd = RS4(SYS_openat, dirfd, path, flags, mode);
    if (is_err(fd)) { errno = (int)-fd; return -1; }
    if (g_mode && is_random_path(path)) rfd_set((int)fd, 1);
    else if (g_mode) rfd_set((int)fd, 0);
    if (g_mode) nfd_clear((int)fd);
    if (g_mode && SINCE(7)) pfd_set((int)fd, reopened_pipe(path, (int)fd));
    return (int)fd;
}

#define OPEN_MODE(flags) \
    mode_t mode = 0; \
    if ((flags) & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }

EXPORT int open(const char *path, int flags, ...) { OPEN_MODE(flags); return open_common(AT_FDCWD, path, flags, mode); }
EXPORT int open64(const char *path, int flags, ...) { OPEN_MODE(flags); return open_common(AT_FDCWD, path, flags, mode); }
EXPORT int openat(int d, const char *path, int flags, ...) { OPEN_MODE(flags); return open_common(d, path, flags, mode); }
EXPORT int openat64(int d, const char *path, int flags, ...) { OPEN_MODE(flags); return open_common(d, path, flags, mode); }
EXPORT int __open_2(const char *path, int flags) { return open_common(AT_FDCWD, path, flags, 0); }
EXPORT int __open64_2(const char *path, int flags) { return open_common(AT_FDCWD, path, flags, 0); }
EXPORT int __openat_2(int d, const char *path, int flags) { return open_common(d, path, flags, 0); }
EXPORT int __openat64_2(int d, const char *path, int flags) { return open_common(d, path, flags, 0); }

static ssize_t cookie_read(void *c, char *buf, size_t n) {
    return read((int)(intptr_t)c, buf, n);
}
static int cookie_close(void *c) { return close((int)(intptr_t)c); }

static FILE *fopen_random(const char *path, const char *mode) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    cookie_io_functions_t io = {cookie_read, NULL, NULL, cookie_close};
    FILE *f = fopencookie((void *)(intptr_t)fd, mode, io);
    if (!f) close(fd);
    return f;
}

EXPORT FILE *fopen(const char *path, const char *mode) {
    RESOLVE(fopen);
    if (g_mode && is_random_path(path) && mode && mode[0] == 'r' && !strchr(mode, '+'))
        return fopen_random(path, mode);
    return real_fopen(path, mode);
}
EXPORT FILE *fopen64(const char *path, const char *mode) {
    RESOLVE(fopen64);
    if (g_mode && is_random_path(path) && mode && mode[0] == 'r' && !strchr(mode, '+'))
        return fopen_random(path, mode);
    return real_fopen64(path, mode);
}

/* glibc's mkstemp family draws its names from a getrandom inside libc, which no wrapper
 * sees (and a syscall instruction in libc's text, which a filter cannot trap safely: it
 * outlives exec). So while taped these make the names themselves, from getrandom()
 * (taped): git's probe files, a C tool's scratch file get their recorded names. The
 * shape is glibc's: six trailing X's (before `suffix` bytes), 62 letters, EEXIST draws
 * again. */
enum { TMP_FILE, TMP_DIR, TMP_NAME };

static int tempname(char *tmpl, int suffix, int flags, int kind) {
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t len = tmpl ? strlen(tmpl) : 0;
    if (suffix < 0 || len < 6 + (size_t)suffix || strspn(tmpl + len - 6 - suffix, "X") < 6) {
        errno = EINVAL;
        return -1;
    }
    char *x = tmpl + len - 6 - suffix;
    for (int tries = 0; tries < 62 * 62 * 62; tries++) {
        unsigned char r[6];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return -1;
        for (int i = 0; i < 6; i++) x[i] = abc[r[i] % 62];
        if (kind == TMP_FILE) {
            int fd = open_common(AT_FDCWD, tmpl, (flags & ~O_ACCMODE) | O_RDWR | O_CREAT | O_EXCL,
                                 0600);
            if (fd >= 0 || errno != EEXIST) return fd;
            continue;
        }
        struct stat st;
        long e = kind == TMP_DIR ? RS3(SYS_mkdirat, AT_FDCWD, tmpl, 0700)
                                 : RS4(SYS_newfstatat, AT_FDCWD, tmpl, &st, AT_SYMLINK_NOFOLLOW);
        if (kind == TMP_NAME) e = e == -ENOENT ? 0 : is_err(e) ? e : -EEXIST;
        if (e != -EEXIST) {
            if (!is_err(e)) return 0;
            errno = (int)-e;
            return -1;
        }
    }
    errno = EEXIST;
    return -1;
}

EXPORT int mkostemps(char *t, int suffix, int flags) {
    RESOLVE(mkostemps);
    return ACTIVE() ? tempname(t, suffix, flags, TMP_FILE) : real_mkostemps(t, suffix, flags);
}
EXPORT int mkstemp(char *t) { return mkostemps(t, 0, 0); }
EXPORT int mkstemp64(char *t) { return mkostemps(t, 0, 0); }
EXPORT int mkostemp(char *t, int flags) { return mkostemps(t, 0, flags); }
EXPORT int mkostemp64(char *t, int flags) { return mkostemps(t, 0, flags); }
EXPORT int mkstemps(char *t, int suffix) { return mkostemps(t, suffix, 0); }
EXPORT int mkstemps64(char *t, int suffix) { return mkostemps(t, suffix, 0); }
EXPORT int mkostemps64(char *t, int suffix, int flags) { return mkostemps(t, suffix, flags); }

EXPORT char *mkdtemp(char *t) {
    RESOLVE(mkdtemp);
    if (!ACTIVE()) return real_mkdtemp(t);
    return tempname(t, 0, 0, TMP_DIR) == 0 ? t : NULL;
}

EXPORT char *mktemp(char *t) {
    RESOLVE(mktemp);
    if (!ACTIVE()) return real_mktemp(t);
    if (tempname(t, 0, 0, TMP_NAME) < 0 && (void *)t != g_null) t[0] = 0;
    return t;
}

/* Calls handed a pid back: at replay the recorded pid becomes the live one. */
EXPORT int kill(pid_t pid, int sig) {
    pid_t live = pid_live(pid);
    if (sig > 0 && (live == 0 || live < -1)) group_kill_note(live ? -live : RS1(SYS_getpgid, 0), sig);
    return (int)sys_ret(RS2(SYS_kill, live, sig));
}
EXPORT int killpg(pid_t pg, int sig) {
    if (pg < 0) { errno = EINVAL; return -1; }
    return kill(pg ? -pg : 0, sig);
}
EXPORT int tgkill(pid_t tgid, pid_t tid, int sig) {
    return (int)sys_ret(RS3(SYS_tgkill, pid_live(tgid), pid_live(tid), sig));
}
EXPORT int sigqueue(pid_t pid, int sig, const union sigval val) {
    RESOLVE(sigqueue);
    return real_sigqueue(pid_live(pid), sig, val);
}
EXPORT int pidfd_open(pid_t pid, unsigned int flags) {
    return (int)sys_ret(RS2(SYS_pidfd_open, pid_live(pid), flags));
}
EXPORT int setpgid(pid_t pid, pid_t pgid) {
    return (int)sys_ret(RS2(SYS_setpgid, pid_live(pid), pid_live(pgid)));
}
static id_t prio_who(int which, id_t who) {
    return which == PRIO_PROCESS || which == PRIO_PGRP ? (id_t)pid_live((pid_t)who) : who;
}
EXPORT int getpriority(__priority_which_t which, id_t who) {
    long r = RS2(SYS_getpriority, which, prio_who(which, who));
    if (is_err(r)) { errno = (int)-r; return -1; }
    return 20 - (int)r; /* the kernel answers 20 - nice, as glibc undoes */
}
EXPORT int setpriority(__priority_which_t which, id_t who, int prio) {
    return (int)sys_ret(RS3(SYS_setpriority, which, prio_who(which, who), prio));
}
EXPORT int prlimit(pid_t pid, __rlimit_resource_t res, const struct rlimit *nl, struct rlimit *ol) {
    return (int)sys_ret(RS4(SYS_prlimit64, pid_live(pid), res, nl, ol));
}
EXPORT int prlimit64(pid_t pid, __rlimit_resource_t res, const struct rlimit64 *nl, struct rlimit64 *ol) {
    return (int)sys_ret(RS4(SYS_prlimit64, pid_live(pid), res, nl, ol));
}
EXPORT int sched_setaffinity(pid_t pid, size_t size, const cpu_set_t *set) {
    return (int)sys_ret(RS3(SYS_sched_setaffinity, pid_live(pid), size, set));
}
EXPORT int sched_getaffinity(pid_t pid, size_t size, cpu_set_t *set) {
    long r = RS3(SYS_sched_getaffinity, pid_live(pid), size, set);
    if (is_err(r)) { errno = (int)-r; return -1; }
    if ((size_t)r < size) memset((char *)set + r, 0, size - (size_t)r); /* as glibc does */
    return 0;
}
EXPORT int sched_setscheduler(pid_t pid, int policy, const struct sched_param *sp) {
    return (int)sys_ret(RS3(SYS_sched_setscheduler, pid_live(pid), policy, sp));
}
EXPORT int sched_getscheduler(pid_t pid) {
    return (int)sys_ret(RS1(SYS_sched_getscheduler, pid_live(pid)));
}
EXPORT int sched_setparam(pid_t pid, const struct sched_param *sp) {
    return (int)sys_ret(RS2(SYS_sched_setparam, pid_live(pid), sp));
}
EXPORT int sched_getparam(pid_t pid, struct sched_param *sp) {
    return (int)sys_ret(RS2(SYS_sched_getparam, pid_live(pid), sp));
}
EXPORT int sched_rr_get_interval(pid_t pid, struct timespec *ts) {
    return (int)sys_ret(RS2(SYS_sched_rr_get_interval, pid_live(pid), ts));
}

/* close_range, closefrom: CPython's subprocess child closes every fd above 2 before it
 * execs. The fds closed lose their marks as close() drops them, and the shim's own
 * connection and arena fd stay open: the child keeps the connection it already has
 * (closed, it cost a reconnect and an arena announcement on every exec), and exec
 * closes both anyway (CLOEXEC). A program cannot tell: they are above any fd it made. */
static void fd_marks_drop(unsigned first, unsigned last) {
    for (unsigned fd = first; fd <= last && fd < 1024; fd++) {
        if (UNLIKELY(rfd_is((int)fd))) rfd_set((int)fd, 0);
        if (UNLIKELY(pfd_is((int)fd))) pfd_set((int)fd, 0);
        if (UNLIKELY(nfd_is((int)fd)) && (g_nconn[fd].ccall[0] || g_nconn[fd].call[0] ||
                                          g_nconn[fd].held))
            net_conn_closed((int)fd, "closed");
        nfd_clear((int)fd);
    }
}

EXPORT int close_range(unsigned first, unsigned last, int flags) {
    if (!g_mode || (flags & CLOSE_RANGE_CLOEXEC) || first > last)
        return (int)sys_ret(RS3(SYS_close_range, first, last, flags));
    fd_marks_drop(first, last);
    int own[2] = {g_sock, g_ring_fd};
    if (own[0] > own[1]) { int x = own[0]; own[0] = own[1]; own[1] = x; }
    unsigned from = first;
    long r = 0;
    for (int i = 0; i < 2; i++) {
        if (own[i] < 0 || (unsigned)own[i] < from || (unsigned)own[i] > last) continue;
        if ((unsigned)own[i] > from) r = RS3(SYS_close_range, from, (unsigned)own[i] - 1, flags);
        if (is_err(r)) return (int)sys_ret(r);
        from = (unsigned)own[i] + 1;
    }
    if (from <= last) r = RS3(SYS_close_range, from, last, flags);
    return (int)sys_ret(r);
}

EXPORT void closefrom(int lowfd) {
    if (lowfd < 0) lowfd = 0;
    if (close_range((unsigned)lowfd, ~0U, 0) == 0 || errno != ENOSYS) return;
    for (int fd = lowfd; fd < 1024; fd++) /* (no close_range: a kernel before 5.9) */
        if (fd != g_sock && fd != g_ring_fd) close(fd);
}
