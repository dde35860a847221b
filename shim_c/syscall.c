/* syscall(): the numbers the shim wraps go to their wrappers, the rest to the kernel. */

EXPORT long syscall(long n, ...) {
    va_list ap;
    va_start(ap, n);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    if (g_mode) {
        switch (n) {
        case SYS_getpid: return getpid();
        case SYS_getppid: return getppid();
        case SYS_gettid: return gettid();
        case SYS_kill: return kill((pid_t)a, (int)b);           /* pids: recorded -> live */
        case SYS_tgkill: return tgkill((pid_t)a, (pid_t)b, (int)c);
        case SYS_pidfd_open: return pidfd_open((pid_t)a, (unsigned)b); /* CPython's os.pidfd_open */
        case SYS_getrandom: return getrandom((void *)a, (size_t)b, (unsigned)c);
        case SYS_clock_gettime: return clock_gettime((clockid_t)a, (struct timespec *)b);
        case SYS_gettimeofday: return gettimeofday((struct timeval *)a, (void *)b);
        case SYS_time: return time((time_t *)a);
        case SYS_nanosleep: return nanosleep((const struct timespec *)a, (struct timespec *)b);
        case SYS_sched_yield: return sched_yield();
        case SYS_close: return close((int)a); /* libuv's: the fd marks go with it */
        case SYS_close_range: return close_range((unsigned)a, (unsigned)b, (int)c);
        case SYS_statx: /* libuv's fs.stat: the meta channel's */
            if (SINCE(5))
                return statx((int)a, (const char *)b, (int)c, (unsigned)d, (struct statx *)e);
            break;
        case SYS_futex: return sys_ret(sched_futex(a, b, c, d, e, f));
        }
    }
    long r = rsys(n, a, b, c, d, e, f);
    if (is_err(r)) { errno = (int)-r; return -1; }
    return r;
}
