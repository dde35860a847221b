/* Sealed without namespaces: the recorded paths mapped onto private copies.
 *
 * Where no mount namespace can be made (a user on a kernel that allows no user
 * namespace), the replay's parent gives each sealed path a private directory -- a
 * workspace root its start snapshot, a name the recording made in /tmp an empty place,
 * /var/lib/libuuid its recorded state -- and lists the pairs in a file named by
 * STENO_PATHMAP ("src\tdst\n" lines; an empty dst keeps src as it is: a live directory
 * inside a mapped one; "src\tdst\tfresh": a temporary root, whose entries that exist live
 * stay live and whose new names go to dst, as an overlay's upper layer would take them). A seccomp filter traps every syscall that takes a path, wherever
 * it is made from (the program, libc's own fts in `rm -r`, the shim's raw calls), except
 * the dynamic loader's and the handler's own (the cookie in the unused sixth argument);
 * the SIGSYS handler maps each absolute path under a src into its dst and makes the call.
 * Relative paths need nothing: the program starts in the mapped working directory, and
 * an fd opened through a mapped path stays in the copy. getcwd and readlink answers are
 * mapped back, so the program sees the recorded paths.
 *
 * Two things keep the handler in reach of every trapped call:
 * - it is put in before any code of a new image runs: an IFUNC resolver of this library
 *   runs while the loader relocates it, before any library's constructor (libselinux's
 *   opens /proc in `ls`); it uses raw syscalls and this file's static data only;
 * - SIGSYS is never blocked: rt_sigprocmask is trapped and done on the ucontext's mask
 *   without SIGSYS, every rt_sigaction's mask loses SIGSYS, and a handler for SIGSYS
 *   itself is not taken (glibc's posix_spawn child and CPython's vfork child reset every
 *   handler and block every signal before their last opens and exec).
 * A program without the loader (static: Go, musl) or with another one cannot carry the
 * handler: its exec is refused (EACCES) and reported, as is an exec whose environment
 * dropped the shim's variables. An AF_UNIX socket's path is mapped for connect and bind
 * (not for a datagram's sendto/sendmsg). Not covered (docs/determinism.md): io_uring. */

#define PM_COOKIE NET_COOKIE
#define PM_PAIRS 1024
#define PM_TEXT (256 * 1024)
#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

typedef struct { uint32_t src, dst; uint16_t sl, dl; uint8_t fresh; } pm_pair_t;

/* strlen for code that runs before relocation ends: the empty asm keeps the compiler
 * from turning the loop into a call through the (not yet bound) PLT */
static size_t pm_len(const char *s) {
    size_t n = 0;
    while (s[n]) { n++; __asm__(""); }
    return n;
}

static char g_pmtext[PM_TEXT];
static pm_pair_t g_pm[PM_PAIRS];
static int g_npm;
static int g_pm_keep; /* pairs that keep a directory inside a copy live (empty dst) */
static char g_pmfile[512];

/* ------------------------------------------------------------------ the map */

/* Read the pairs file (raw calls with the cookie: a new image's filter is on already). */
static void pm_load(const char *file) {
    if (g_npm || !file || !*file) return;
    size_t fl = 0;
    while (file[fl] && fl + 1 < sizeof g_pmfile) { g_pmfile[fl] = file[fl]; fl++; }
    g_pmfile[fl] = 0;
    long fd = rsys(SYS_openat, AT_FDCWD, (long)g_pmfile, O_RDONLY | O_CLOEXEC, 0, 0, PM_COOKIE);
    if (is_err(fd)) return;
    long n = 0, r;
    while (n < PM_TEXT - 1 &&
           (r = rsys(SYS_read, fd, (long)(g_pmtext + n), PM_TEXT - 1 - n, 0, 0, PM_COOKIE)) > 0)
        n += r;
    rsys(SYS_close, fd, 0, 0, 0, 0, PM_COOKIE);
    g_pmtext[n] = 0;
    uint32_t at = 0;
    while (at < (uint32_t)n && g_npm < PM_PAIRS) {
        uint32_t s = at, t, e;
        while (at < (uint32_t)n && g_pmtext[at] != '\t' && g_pmtext[at] != '\n') at++;
        if (at >= (uint32_t)n || g_pmtext[at] != '\t') break;
        g_pmtext[at++] = 0;
        t = at;
        while (at < (uint32_t)n && g_pmtext[at] != '\n' && g_pmtext[at] != '\t') at++;
        e = at;
        uint8_t fresh = 0; /* "\tfresh": only names that do not exist live are mapped */
        if (at < (uint32_t)n && g_pmtext[at] == '\t') {
            fresh = g_pmtext[at + 1] == 'f';
            while (at < (uint32_t)n && g_pmtext[at] != '\n') at++;
        }
        g_pmtext[e] = 0;
        at++;
        if (g_pmtext[s] != '/' || t - 1 - s < 2) continue;
        g_pm[g_npm++] = (pm_pair_t){s, t, (uint16_t)(t - 1 - s), (uint16_t)(e - t), fresh};
        if (e == t) g_pm_keep++;
    }
}

/* The longest pair whose side (src or dst) the n bytes at `path` are at or under, or
 * NULL. */
static const pm_pair_t *pm_find_n(const char *path, size_t len, int dst) {
    const pm_pair_t *best = NULL;
    size_t bl = 0;
    for (int i = 0; i < g_npm; i++) {
        const pm_pair_t *p = &g_pm[i];
        size_t n = dst ? p->dl : p->sl;
        const char *k = g_pmtext + (dst ? p->dst : p->src);
        if (!n || n <= bl || n > len) continue;
        size_t j = 0;
        while (j < n && path[j] == k[j]) j++;
        if (j == n && (n == len || path[n] == '/')) { best = p; bl = n; }
    }
    return best;
}

static const pm_pair_t *pm_find(const char *path, int dst) {
    return pm_find_n(path, s_len(path), dst);
}

/* `path` as the kernel must see it: under its dst when under a src (else as it is). */
static const char *pm_in(const char *path, char *buf) {
    if (!path || path[0] != '/') return path;
    const pm_pair_t *p = pm_find(path, 0);
    if (!p || !p->dl) return path;
    size_t rest = s_len(path + p->sl);
    if (p->fresh) { /* a temporary root: its entry is live if it exists live */
        if (!rest) return path;
        size_t k = 1;
        while (path[p->sl + k] && path[p->sl + k] != '/') k++;
        if (p->sl + k >= PATH_MAX) return path;
        memcpy(buf, path, p->sl + k);
        buf[p->sl + k] = 0;
        struct stat st;
        if (rsys(SYS_newfstatat, AT_FDCWD, (long)buf, (long)&st, AT_SYMLINK_NOFOLLOW, 0,
                 PM_COOKIE) != -ENOENT)
            return path;
    }
    if (p->dl + rest + 1 > PATH_MAX) return path;
    memcpy(buf, g_pmtext + p->dst, p->dl);
    memcpy(buf + p->dl, path + p->sl, rest + 1);
    return buf;
}

/* A path the kernel answered with (n bytes at buf, room for cap), mapped back to the
 * recorded one in place (no second buffer: the handler may run on a small thread stack);
 * its new length. */
static long pm_out(char *buf, long n, long cap, int nul) {
    if (n <= 0 || buf[0] != '/') return n;
    const pm_pair_t *p = pm_find_n(buf, (size_t)n, 1);
    if (!p) return n;
    long out = (long)p->sl + n - (long)p->dl;
    if (out + (nul ? 1 : 0) > cap) return n;
    memmove(buf + p->sl, buf + p->dl, (size_t)(n - (long)p->dl));
    memcpy(buf, g_pmtext + p->src, p->sl);
    if (nul) buf[out] = 0;
    return out;
}

/* An AF_UNIX address naming a path under a mapped root, as the kernel must see it (in
 * buf; *len adjusted), else sa itself. */
static const struct sockaddr *pm_sun(const struct sockaddr *sa, socklen_t *len,
                                     struct sockaddr_un *buf) {
    if (!g_npm || !sa || *len <= offsetof(struct sockaddr_un, sun_path) ||
        sa->sa_family != AF_UNIX)
        return sa;
    const struct sockaddr_un *u = (const struct sockaddr_un *)sa;
    char path[sizeof u->sun_path + 1] = {0}, mapped[PATH_MAX];
    size_t n = *len - offsetof(struct sockaddr_un, sun_path);
    memcpy(path, u->sun_path, n < sizeof u->sun_path ? n : sizeof u->sun_path);
    if (path[0] != '/') return sa; /* relative (from a mapped cwd) or abstract */
    const char *m = pm_in(path, mapped);
    size_t ml = s_len(m);
    if (m == path || ml >= sizeof buf->sun_path) return sa;
    memset(buf, 0, sizeof *buf);
    buf->sun_family = AF_UNIX;
    memcpy(buf->sun_path, m, ml);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + ml + 1);
    return (const struct sockaddr *)buf;
}

/* `path` (relative) against `dirfd` as the kernel must see it: the walk a program makes
 * from a live directory down into a mapped one (`mkdir -p` chdirs down from /), or up out
 * of a copy with "..", lands where the recorded path would. Costs a getcwd or readlink. */
static const char *pm_rel(long dirfd, const char *path, char *buf) {
    if (!path || !path[0]) return path;
    int dotdot = 0;
    for (const char *c = path; *c; c++)
        if (c[0] == '.' && c[1] == '.' && (c == path || c[-1] == '/') && (!c[2] || c[2] == '/'))
            dotdot = 1;
    char d[PATH_MAX];
    long n;
    if ((int)dirfd == AT_FDCWD) {
        n = rsys(SYS_getcwd, (long)d, PATH_MAX, 0, 0, 0, PM_COOKIE) - 1;
    } else {
        char proc[40], *p = s_put(proc, proc + 30, "/proc/self/fd/");
        p = u_put(p, proc + 39, (unsigned)(int)dirfd);
        *p = 0;
        n = rsys(SYS_readlinkat, AT_FDCWD, (long)proc, (long)d, PATH_MAX - 1, 0, PM_COOKIE);
    }
    if (n <= 0 || n >= PATH_MAX - 1 || d[0] != '/') return path;
    d[n] = 0;
    int inside = pm_find(d, 1) != NULL;
    if (!dotdot && inside && !g_pm_keep) return path; /* stays in the copy */
    if (!dotdot && !inside) {
        int above = 0; /* some src lies under d */
        for (int i = 0; i < g_npm && !above; i++) {
            const char *k = g_pmtext + g_pm[i].src;
            size_t j = 0;
            while (j < (size_t)n && k[j] == d[j]) j++;
            above = j == (size_t)n && (k[n] == '/' || !k[n] || (n == 1 && d[0] == '/'));
        }
        if (!above) return path;
    }
    /* the recorded form of d, joined with path, "." and ".." folded in place */
    n = pm_out(d, n, PATH_MAX, 1);
    size_t pl = s_len(path);
    if ((size_t)n + 1 + pl + 1 > PATH_MAX) return path;
    memcpy(buf, d, (size_t)n);
    buf[n] = '/';
    memcpy(buf + n + 1, path, pl + 1);
    size_t w = 0;
    for (size_t r = 0; buf[r];) { /* w <= r throughout: one buffer serves */
        while (buf[r] == '/') r++;
        if (!buf[r]) break;
        size_t e = r;
        while (buf[e] && buf[e] != '/') e++;
        if (e - r == 1 && buf[r] == '.') {
        } else if (e - r == 2 && buf[r] == '.' && buf[r + 1] == '.') {
            while (w > 0 && buf[w - 1] != '/') w--;
            if (w > 0) w--;
        } else {
            buf[w++] = '/';
            memmove(buf + w, buf + r, e - r);
            w += e - r;
        }
        r = e;
    }
    if (!w) buf[w++] = '/';
    if (pl && path[pl - 1] == '/' && w > 1) buf[w++] = '/';
    buf[w] = 0;
    const char *m = pm_in(buf, d);  /* d is free again: the mapped form goes there */
    if (m == d) {                   /* into a copy */
        memcpy(buf, d, s_len(d) + 1);
        return buf;
    }
    if (inside) return buf;         /* out of a copy: the live place, absolute */
    return path;
}

/* ------------------------------------------------------------------ the calls */

/* Every x86-64 syscall that takes a path: which arguments are paths (bit i: argument
 * i; an *at call's dirfd is the argument before each), which hold a symlink's target (mapped
 * when absolute, not resolved), and which argument holds an answer to map back (-1: none). */
typedef struct { int nr; unsigned paths, at, target; int back; } pm_call_t;
static const pm_call_t PM_CALLS[] = {
    {SYS_open, 1, 0, 0, -1}, {SYS_creat, 1, 0, 0, -1}, {SYS_stat, 1, 0, 0, -1},
    {SYS_lstat, 1, 0, 0, -1}, {SYS_access, 1, 0, 0, -1}, {SYS_readlink, 1, 0, 0, 1},
    {SYS_mkdir, 1, 0, 0, -1}, {SYS_rmdir, 1, 0, 0, -1}, {SYS_unlink, 1, 0, 0, -1},
    {SYS_chdir, 1, 0, 0, -1}, {SYS_chmod, 1, 0, 0, -1}, {SYS_chown, 1, 0, 0, -1},
    {SYS_lchown, 1, 0, 0, -1}, {SYS_truncate, 1, 0, 0, -1}, {SYS_utime, 1, 0, 0, -1},
    {SYS_utimes, 1, 0, 0, -1}, {SYS_statfs, 1, 0, 0, -1}, {SYS_mknod, 1, 0, 0, -1},
    {SYS_execve, 1, 0, 0, -1}, {SYS_rename, 3, 0, 0, -1}, {SYS_link, 3, 0, 0, -1},
    {SYS_symlink, 3, 0, 1, -1}, {SYS_setxattr, 1, 0, 0, -1}, {SYS_lsetxattr, 1, 0, 0, -1},
    {SYS_getxattr, 1, 0, 0, -1}, {SYS_lgetxattr, 1, 0, 0, -1}, {SYS_listxattr, 1, 0, 0, -1},
    {SYS_llistxattr, 1, 0, 0, -1}, {SYS_removexattr, 1, 0, 0, -1},
    {SYS_lremovexattr, 1, 0, 0, -1}, {SYS_inotify_add_watch, 2, 0, 0, -1},
    {SYS_openat, 2, 1, 0, -1}, {SYS_newfstatat, 2, 1, 0, -1}, {SYS_statx, 2, 1, 0, -1},
    {SYS_faccessat, 2, 1, 0, -1}, {SYS_faccessat2, 2, 1, 0, -1}, {SYS_readlinkat, 2, 1, 0, 2},
    {SYS_mkdirat, 2, 1, 0, -1}, {SYS_unlinkat, 2, 1, 0, -1}, {SYS_fchmodat, 2, 1, 0, -1},
    {SYS_fchmodat2, 2, 1, 0, -1}, {SYS_fchownat, 2, 1, 0, -1}, {SYS_utimensat, 2, 1, 0, -1},
    {SYS_futimesat, 2, 1, 0, -1}, {SYS_mknodat, 2, 1, 0, -1}, {SYS_execveat, 2, 1, 0, -1},
    {SYS_renameat, 10, 1, 0, -1}, {SYS_renameat2, 10, 1, 0, -1}, {SYS_linkat, 10, 1, 0, -1},
    {SYS_symlinkat, 5, 1, 1, -1}, {SYS_openat2, 2, 1, 0, -1},
    {SYS_name_to_handle_at, 2, 1, 0, -1}, {SYS_getcwd, 0, 0, 0, 0},
};
#define NPM_CALLS (sizeof PM_CALLS / sizeof *PM_CALLS)

static const pm_call_t *pm_call(int nr) {
    for (size_t i = 0; i < NPM_CALLS; i++)
        if (PM_CALLS[i].nr == nr) return &PM_CALLS[i];
    return NULL;
}

static int pm_handles(int nr) {
    return g_npm && (pm_call(nr) || nr == SYS_rt_sigprocmask || nr == SYS_rt_sigaction ||
                     nr == SYS_connect || nr == SYS_bind);
}

/* Is this PT_NOTE segment of `fd` Go's build id note ("Go", type 4)? Every Go
 * program carries it, whatever its linking: its runtime makes its own system calls. */
static int pm_go_note(long fd, const ElfW(Phdr) *ph) {
    unsigned char b[256];
    size_t n = ph->p_filesz < sizeof b ? ph->p_filesz : sizeof b;
    if (rsys(SYS_pread64, fd, (long)b, (long)n, (long)ph->p_offset, 0, PM_COOKIE) != (long)n)
        return 0;
    for (size_t o = 0; o + 12 <= n;) {
        uint32_t namesz, descsz, type;
        memcpy(&namesz, b + o, 4);
        memcpy(&descsz, b + o + 4, 4);
        memcpy(&type, b + o + 8, 4);
        if ((namesz == 3 || namesz == 4) && type == 4 && o + 15 <= n &&
            !memcmp(b + o + 12, "Go", 3))
            return 1;
        o += 12 + ((namesz + 3) & ~3u) + ((descsz + 3) & ~3u);
    }
    return 0;
}

/* Why `path` cannot run under the mapping (NULL: it can): without PT_INTERP it is static;
 * another interpreter than the system's loader sits elsewhere than the one let through;
 * a Go program bypasses libc (and the filter would trap its calls, for which its runtime
 * has no handler). */
static const char *pm_unfit(const char *path) {
    long fd = rsys(SYS_openat, AT_FDCWD, (long)path, O_RDONLY | O_CLOEXEC, 0, 0, PM_COOKIE);
    if (is_err(fd)) return NULL; /* the exec itself will say */
    ElfW(Ehdr) eh;
    const char *why = NULL;
    if (rsys(SYS_pread64, fd, (long)&eh, sizeof eh, 0, 0, PM_COOKIE) == (long)sizeof eh &&
        !memcmp(eh.e_ident, ELFMAG, SELFMAG) && eh.e_phentsize == sizeof(ElfW(Phdr))) {
        why = "a static program (no dynamic loader to carry the path mapping)";
        int go = 0;
        for (int i = 0; i < eh.e_phnum && i < 64; i++) {
            ElfW(Phdr) ph;
            if (rsys(SYS_pread64, fd, (long)&ph, sizeof ph, (long)(eh.e_phoff + i * sizeof ph),
                     0, PM_COOKIE) != (long)sizeof ph)
                break;
            if (ph.p_type == PT_NOTE && !go) go = pm_go_note(fd, &ph);
            if (ph.p_type != PT_INTERP) continue;
            char interp[128] = {0};
            size_t n = ph.p_filesz < sizeof interp - 1 ? ph.p_filesz : sizeof interp - 1;
            rsys(SYS_pread64, fd, (long)interp, (long)n, (long)ph.p_offset, 0, PM_COOKIE);
            why = strstr(interp, "ld-linux-x86-64.so") ? NULL
                  : "a program with another dynamic loader than the system's";
        }
        if (go && !why) why = "a Go program (its runtime makes its own system calls)";
    }
    rsys(SYS_close, fd, 0, 0, 0, 0, PM_COOKIE);
    return why;
}

static int pm_env_ok(char *const *envp) {
    for (char *const *e = envp; e && *e; e++)
        if (starts(*e, "STENO_PATHMAP=")) return 1;
    return 0;
}

/* One line in the tape's divergence file: the mapping cannot follow this exec. */
static void pm_refuse(const char *path, const char *why) {
    char line[1200];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, "divergence\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread=0\tchannel=pathmap\tpos=0\trecorded=-\tasked=exec ");
    p = s_put(p, end, path); p = s_put(p, end, ": "); p = s_put(p, end, why);
    p = s_put(p, end, "; a replay sealed by path mapping cannot run it (run as root or "
                      "where user namespaces are allowed)");
    *p++ = '\n';
    tape_append("divergence", line, (size_t)(p - line));
}

#define PM_SYSBIT (1ULL << (SIGSYS - 1))

/* The kernel's struct sigaction (rt_sigaction's layout, not glibc's). */
typedef struct { void *handler; unsigned long flags; void *restorer; uint64_t mask; } k_sigaction_t;

/* rt_sigprocmask, done on the mask sigreturn restores: SIGSYS stays deliverable. */
static long pm_sigprocmask(long how, const uint64_t *set, uint64_t *old, ucontext_t *uc) {
    uint64_t cur, want = set ? *set : 0; /* read before *old is written: they may alias */
    memcpy(&cur, &uc->uc_sigmask, sizeof cur);
    if (set && how != SIG_BLOCK && how != SIG_UNBLOCK && how != SIG_SETMASK) return -EINVAL;
    if (old) *old = cur;
    if (!set) return 0;
    if (how == SIG_BLOCK) cur |= want;
    else if (how == SIG_UNBLOCK) cur &= ~want;
    else cur = want;
    cur &= ~PM_SYSBIT;
    memcpy(&uc->uc_sigmask, &cur, sizeof cur);
    return 0;
}

/* rt_sigaction: SIGSYS keeps the shim's handler (the program is told its own was taken);
 * any other handler runs with SIGSYS deliverable. */
static long pm_sigaction(long sig, const k_sigaction_t *act, k_sigaction_t *old, long size) {
    if (sig == SIGSYS) {
        if (old) memset(old, 0, sizeof *old);
        return 0;
    }
    k_sigaction_t mine;
    if (act) {
        mine = *act;
        mine.mask &= ~PM_SYSBIT;
        act = &mine;
    }
    return rsys(SYS_rt_sigaction, sig, (long)act, (long)old, size, 0, PM_COOKIE);
}

/* The handler's part: the trapped call `nr` with its paths mapped (or its mask kept). */
static long pm_trapped(int nr, ucontext_t *uc) {
    greg_t *g = uc->uc_mcontext.gregs;
    long a[6] = {g[REG_RDI], g[REG_RSI], g[REG_RDX], g[REG_R10], g[REG_R8], g[REG_R9]};
    if (nr == SYS_rt_sigprocmask)
        return pm_sigprocmask(a[0], (const uint64_t *)a[1], (uint64_t *)a[2], uc);
    if (nr == SYS_rt_sigaction)
        return pm_sigaction(a[0], (const k_sigaction_t *)a[1], (k_sigaction_t *)a[2], a[3]);
    if (nr == SYS_connect || nr == SYS_bind) { /* an AF_UNIX socket's path */
        struct sockaddr_un un;
        socklen_t len = (socklen_t)a[2];
        const struct sockaddr *sa = pm_sun((const struct sockaddr *)a[1], &len, &un);
        return rsys(nr, a[0], (long)sa, len, 0, 0, PM_COOKIE);
    }
    const pm_call_t *c = pm_call(nr);
    if (!c) return -ENOSYS;
    char b0[PATH_MAX], b1[PATH_MAX];
    char *bufs[2] = {b0, b1};
    int used = 0;
    for (int i = 0; i < 5 && used < 2; i++) {
        const char *p = (const char *)a[i];
        if (!(c->paths & (1u << i)) || !p) continue;
        if (p[0] == '/') a[i] = (long)pm_in(p, bufs[used++]);
        else if (!(c->target & (1u << i)))
            a[i] = (long)pm_rel(c->at && i ? a[i - 1] : AT_FDCWD, p, bufs[used++]);
    }
    if (nr == SYS_execve || nr == SYS_execveat) {
        const char *path = (const char *)a[nr == SYS_execve ? 0 : 1];
        char *const *envp = (char *const *)a[nr == SYS_execve ? 2 : 3];
        const char *why = !pm_env_ok(envp) ? "its environment dropped the shim's variables"
                                           : pm_unfit(path);
        if (why) {
            pm_refuse((const char *)(nr == SYS_execve ? g[REG_RDI] : g[REG_RSI]), why);
            return -EACCES;
        }
        /* the new image inherits the mask: not the handler's, which blocks SIGSYS */
        uint64_t sys = PM_SYSBIT;
        rsys(SYS_rt_sigprocmask, SIG_UNBLOCK, (long)&sys, 0, 8, 0, PM_COOKIE);
    }
    long r = rsys(nr, a[0], a[1], a[2], a[3], a[4], PM_COOKIE);
    if (c->back >= 0 && r > 0) {
        if (nr == SYS_getcwd) r = pm_out((char *)a[0], r - 1, a[1], 1) + 1;
        else r = pm_out((char *)a[c->back], r, a[c->back + 1], 0);
    }
    return r;
}

/* ------------------------------------------------------------------ the filter */

static uintptr_t g_ldso_lo, g_ldso_hi;

static int ldso_range_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size; (void)data;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "ld-linux")) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        g_ldso_lo = info->dlpi_addr + ph->p_vaddr;
        g_ldso_hi = g_ldso_lo + ph->p_memsz;
    }
    return 1;
}

/* Every call of PM_CALLS, rt_sigprocmask, rt_sigaction, connect and bind traps unless the loader made
 * it (ASLR off: it sits at one address in every process of the tree) or it carries the
 * cookie. Once per tree (STENO_FILT "p"). */
static int install_pathmap_filter(void) {
    dl_iterate_phdr(ldso_range_cb, NULL);
    if (!g_ldso_lo || (g_ldso_lo >> 32) != ((g_ldso_hi - 1) >> 32)) return -1;
    struct sock_filter f[32 + NPM_CALLS];
    size_t n = 0, nc = NPM_CALLS + 4;
#define ST(code, k) (f[n++] = (struct sock_filter)BPF_STMT((code), (k)))
#define JP(code, k, t, e) (f[n++] = (struct sock_filter)BPF_JUMP((code), (k), (t), (e)))
    ST(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    JP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    ST(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    ST(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    for (size_t i = 0; i < nc; i++) { /* a match jumps past the list and its ALLOW */
        static const int more[] = {SYS_rt_sigprocmask, SYS_rt_sigaction, SYS_connect,
                                   SYS_bind};
        int nr = i < NPM_CALLS ? PM_CALLS[i].nr : more[i - NPM_CALLS];
        JP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, (uint8_t)(nc - i), 0);
    }
    ST(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    ST(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer) + 4);
    JP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(g_ldso_lo >> 32), 0, 3);
    ST(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer));
    JP(BPF_JMP | BPF_JGE | BPF_K, (uint32_t)g_ldso_lo, 0, 1);
    JP(BPF_JMP | BPF_JGE | BPF_K, (uint32_t)g_ldso_hi, 0, 5);
    ST(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[5]));
    JP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)PM_COOKIE, 0, 2);
    ST(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[5]) + 4);
    JP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)((uint64_t)PM_COOKIE >> 32), 1, 0);
    ST(BPF_RET | BPF_K, SECCOMP_RET_TRAP);
    ST(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
#undef ST
#undef JP
    struct sock_fprog prog = {(unsigned short)n, f};
    long r = rsys(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, (long)&prog, 0, 0, PM_COOKIE);
    if (r == -EACCES) {
        rsys(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, PM_COOKIE);
        r = rsys(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, (long)&prog, 0, 0, PM_COOKIE);
    }
    return is_err(r) ? -1 : 0;
}

/* ------------------------------------------------------------------ before constructors */

static void sigsys_handler(int sig, siginfo_t *si, void *ctx);

__asm__(".text\n.align 16\nsteno_pm_restorer:\n\tmov $15, %eax\n\tsyscall\n");
void steno_pm_restorer(void) __asm__("steno_pm_restorer") __attribute__((visibility("hidden")));

/* The SIGSYS handler, put in with raw calls (libc may not be initialized yet). */
static void pm_put_handler(void) {
    k_sigaction_t sa = {(void *)sigsys_handler, SA_SIGINFO | SA_RESTART | 0x04000000,
                        (void *)steno_pm_restorer, 0};
    rsys(SYS_rt_sigaction, SIGSYS, (long)&sa, 0, 8, 0, PM_COOKIE);
}

/* While the loader relocates this library: if this image was started under a path
 * filter (a child of a mapped tree), load the map and put the handler in before any
 * constructor makes a path call. No libc, no PLT: nothing is bound yet. */
static void pm_early(void) {
    if (rsys(SYS_prctl, PR_GET_SECCOMP, 0, 0, 0, 0, PM_COOKIE) != 2) return;
    static char env[512 * 1024]; /* the whole initial environment (ours comes last) */
    long fd = rsys(SYS_openat, AT_FDCWD, (long)"/proc/self/environ", O_RDONLY | O_CLOEXEC, 0,
                   0, PM_COOKIE);
    if (is_err(fd)) return;
    long n = 0, r;
    while (n < (long)sizeof env - 1 &&
           (r = rsys(SYS_read, fd, (long)(env + n), (long)sizeof env - 1 - n, 0, 0, PM_COOKIE)) > 0)
        n += r;
    rsys(SYS_close, fd, 0, 0, 0, 0, PM_COOKIE);
    env[n] = 0;
    for (long at = 0; at < n; at += (long)pm_len(env + at) + 1) {
        const char *v = env + at, *k = "STENO_PATHMAP=";
        int i = 0;
        while (k[i] && v[i] == k[i]) { i++; __asm__(""); }
        if (!k[i]) {
            pm_load(env + at + 14);
            if (g_npm) pm_put_handler();
            return;
        }
    }
}

static void pm_noop(void) {}
static void (*pm_resolve(void))(void) {
    pm_early();
    return pm_noop;
}
void steno_pm_early(void) __attribute__((ifunc("pm_resolve"), visibility("hidden")));
/* taken by address, so the loader resolves it (and runs pm_early) while relocating */
__attribute__((used)) static void (*const g_pm_early_ref)(void) = steno_pm_early;
