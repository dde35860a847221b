/* The seccomp filter, installed once per process tree at start-up.
 *
 * Replay isolation: refuse connect/sendto/sendmsg/sendmmsg to non-loopback AF_INET/AF_INET6
 * addresses with EACCES (see net_trapped), so a replay can never reach a live model or
 * tool (once per tree: filters are inherited across fork and exec).
 *
 * Raw getrandom: a `syscall` instruction for getrandom in the program's own code (inline
 * asm; libc's syscall() is wrapped in syscall.c) bypasses every libc wrapper. In both modes the
 * shim traps it with SECCOMP_RET_TRAP when the instruction pointer lies in the main
 * executable's text, and serves it from the SIGSYS handler through the entropy stream
 * (op 4), when that executable is position-independent (a fixed-address one shares
 * 0x400000 with static Go binaries, which would inherit the trap with no handler). Only
 * the main executable is trapped: glibc itself calls getrandom raw (malloc's
 * tcache key) before this library's constructor has installed the handler, and a filter
 * outlives exec, when libraries move but the executable's text (ASLR off) stays put.
 * The shim's own raw syscalls are never in that range. Hand-written BPF, no libseccomp. */

static uintptr_t g_exe_lo, g_exe_hi;
static int g_exe_pie;

static int exe_range_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size; (void)data;
    g_exe_pie = info->dlpi_addr != 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (!g_exe_lo || lo < g_exe_lo) g_exe_lo = lo;
        if (hi > g_exe_hi) g_exe_hi = hi;
    }
    return 1; /* the first object is the main program */
}

/* Replay isolation: what reaches the network is refused, not the socket. A connect,
 * sendto, sendmsg or sendmmsg to an AF_INET/AF_INET6 address outside loopback (127/8,
 * ::1, ::ffff:127/104) fails with EACCES; anything else (AF_UNIX, netlink, loopback, a
 * connected socket) is made by the handler itself, marked with a cookie in the unused
 * sixth argument so the filter lets it through. Sockets, binds and local probes (libuuid's
 * SIOCGIFCONF on an AF_INET datagram socket) behave as when recorded. */

static int net_remote(const struct sockaddr *sa, socklen_t len) {
    if (!sa || len < sizeof(sa_family_t)) return 0;
    if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const unsigned char *a = (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr;
        return a[0] != 127;
    }
    if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const unsigned char *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        static const unsigned char lo6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        static const unsigned char v4m[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!memcmp(a, lo6, 16)) return 0;
        if (!memcmp(a, v4m, 12)) return a[12] != 127;
        return 1;
    }
    return 0;
}

/* A replay opens no connection outside the recorded tree, loopback included: a peer
 * there (a payment service, a database, a DNS stub resolver) would get what the
 * recording already sent it. A peer inside the tree (an agent and the server it started)
 * is live at both ends: each bind of a replayed process is noted in TAPE/net/<key> (the
 * socket type and port, or a hash of the AF_UNIX name), and a connect or send to a
 * loopback or AF_UNIX address is let through only to a noted one. Refused: outside
 * loopback with EACCES (as ever), loopback and AF_UNIX with ECONNREFUSED (what nothing
 * listening gives); each refusal is listed in TAPE/refused for the report. */
static char *hex_put(char *p, char *end, uint64_t v) {
    char tmp[16]; int n = 0;
    do { tmp[n++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    while (n && p < end) *p++ = tmp[--n];
    return p;
}

/* <base>/net/<key> of the address `sa` (<base>/net itself if !sa). The base is TAPE at
 * replay; while recording, the recorder's socket directory (net_base). */
static void net_key_in(char *out, char *end, const char *base, size_t blen,
                       const struct sockaddr *sa, socklen_t len, int type) {
    char *p = out;
    for (size_t i = 0; i < blen && p < end; i++) *p++ = base[i];
    p = s_put(p, end, "/net");
    *p = 0;
    if (!sa) return;
    if (sa->sa_family == AF_UNIX) {
        uint64_t h = 1469598103934665603ULL; /* FNV-1a of the name, abstract ones too */
        const unsigned char *b = (const unsigned char *)((const struct sockaddr_un *)sa)->sun_path;
        size_t n = len > offsetof(struct sockaddr_un, sun_path)
                       ? len - offsetof(struct sockaddr_un, sun_path) : 0;
        if (n > sizeof((struct sockaddr_un *)0)->sun_path)
            n = sizeof((struct sockaddr_un *)0)->sun_path; /* the kernel's EINVAL to come */
        if (n && b[0]) n = strnlen((const char *)b, n); /* a path: up to its NUL */
        if (n && b[0] && b[0] != '/') { /* relative: from the working directory, as the
                                          * program sees it (mapped back under path-map) */
            char cwd[PATH_MAX];
            long c = rsys(SYS_getcwd, (long)cwd, sizeof cwd, 0, 0, 0, NET_COOKIE) - 1;
            if (c > 0 && g_npm) c = pm_out(cwd, c, sizeof cwd, 1);
            for (long i = 0; i < c; i++) { h ^= (unsigned char)cwd[i]; h *= 1099511628211ULL; }
            h ^= '/';
            h *= 1099511628211ULL;
        }
        char abs[PATH_MAX];
        if (n && b[0] == '/' && g_npm && n < sizeof abs) { /* the program's form of it */
            memcpy(abs, b, n);
            abs[n] = 0;
            n = (size_t)pm_out(abs, (long)n, sizeof abs, 1);
            b = (const unsigned char *)abs;
        }
        for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ULL; }
        p = s_put(p, end, "/u-");
        p = hex_put(p, end, h);
    } else {
        unsigned port = ntohs(sa->sa_family == AF_INET
                                  ? ((const struct sockaddr_in *)sa)->sin_port
                                  : ((const struct sockaddr_in6 *)sa)->sin6_port);
        p = s_put(p, end, type == SOCK_DGRAM ? "/d-" : "/s-");
        p = u_put(p, end, port);
    }
    *p = 0;
}

static void net_key(char *out, char *end, const struct sockaddr *sa, socklen_t len, int type) {
    net_key_in(out, end, g_tape, s_len(g_tape), sa, len, type);
}

/* Recording: the binds of the tree are noted beside the recorder's socket. */
static size_t net_base(void) {
    size_t d = s_len(g_sockpath);
    while (d && g_sockpath[d - 1] != '/') d--;
    return d > 1 ? d - 1 : 0;
}

static int net_type(long fd) {
    int type = 0;
    socklen_t tl = sizeof type;
    rsys(SYS_getsockopt, fd, SOL_SOCKET, SO_TYPE, (long)&type, (long)&tl, NET_COOKIE);
    return type;
}

static int net_is_local(const struct sockaddr *sa) {
    return sa->sa_family == AF_UNIX || sa->sa_family == AF_INET || sa->sa_family == AF_INET6;
}

static void net_register_in(long fd, const char *base, size_t blen) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (is_err(rsys(SYS_getsockname, fd, (long)&ss, (long)&len, 0, 0, NET_COOKIE))) return;
    const struct sockaddr *sa = (const struct sockaddr *)&ss;
    if (!net_is_local(sa)) return;
    char path[1300];
    net_key_in(path, path + sizeof path - 1, base, blen, NULL, 0, 0);
    rsys(SYS_mkdirat, AT_FDCWD, (long)path, 0755, 0, 0, NET_COOKIE);
    net_key_in(path, path + sizeof path - 1, base, blen, sa, len, net_type(fd));
    long f = rsys(SYS_openat, AT_FDCWD, (long)path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644, 0,
                  NET_COOKIE);
    if (!is_err(f)) rsys(SYS_close, f, 0, 0, 0, 0, NET_COOKIE);
}

static void net_register(long fd) { net_register_in(fd, g_tape, s_len(g_tape)); }

/* Recording (netio.c's bind): the address is the tree's own from now on. */
static void net_note_bind(int fd) {
    size_t b = net_base();
    if (b) net_register_in(fd, g_sockpath, b);
}

/* Did a process of the tree bind `sa`? Asked by the connect of a recording (net.c): a
 * connection to it stays live at both ends, untaped. A resume that went live asks the
 * replayed prefix's binds too. */
static int net_tree(const struct sockaddr *sa, socklen_t len, int type) {
    if (!net_is_local(sa)) return 0;
    if (sa->sa_family != AF_UNIX && net_remote(sa, len)) return 0;
    char path[1300];
    struct stat st;
    size_t b = net_base();
    if (b) {
        net_key_in(path, path + sizeof path - 1, g_sockpath, b, sa, len, type);
        if (!is_err(OWN4(SYS_newfstatat, AT_FDCWD, path, &st, 0))) return 1;
    }
    if (g_tape[0]) {
        net_key(path, path + sizeof path - 1, sa, len, type);
        if (!is_err(OWN4(SYS_newfstatat, AT_FDCWD, path, &st, 0))) return 1;
    }
    return 0;
}

static int g_refusals;

static void net_refused(const struct sockaddr *sa, socklen_t len, int type, const char *how) {
    if (g_refusals++ >= 100) return;
    char line[512], *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, how);
    p = s_put(p, end, type == SOCK_DGRAM ? " udp " : sa->sa_family == AF_UNIX ? " unix " : " tcp ");
    if (sa->sa_family == AF_UNIX) {
        const char *n = ((const struct sockaddr_un *)sa)->sun_path;
        size_t k = len > offsetof(struct sockaddr_un, sun_path)
                       ? len - offsetof(struct sockaddr_un, sun_path) : 0;
        if (k && !n[0]) { p = s_put(p, end, "@"); n++; k--; }
        for (size_t i = 0; i < k && n[i] && p < end; i++) *p++ = n[i];
    } else {
        char a[64];
        const void *addr = sa->sa_family == AF_INET
                               ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
                               : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (inet_ntop(sa->sa_family, addr, a, sizeof a)) p = s_put(p, end, a);
        unsigned port = ntohs(sa->sa_family == AF_INET
                                  ? ((const struct sockaddr_in *)sa)->sin_port
                                  : ((const struct sockaddr_in6 *)sa)->sin6_port);
        p = s_put(p, end, sa->sa_family == AF_INET6 ? " port " : ":");
        p = u_put(p, end, port);
    }
    p = s_put(p, end, " (proc ");
    p = s_put(p, end, g_proc);
    p = s_put(p, end, ")");
    *p++ = '\n';
    tape_append("refused", line, (size_t)(p - line));
}

/* 0 if the replay may reach `sa` from socket `fd`, else the errno it is refused with. */
static int net_refuse(long fd, const struct sockaddr *sa, socklen_t len, const char *how) {
    if (!sa || len < sizeof(sa_family_t) || !net_is_local(sa)) return 0;
    if (sa->sa_family == AF_UNIX) {
        if (len <= offsetof(struct sockaddr_un, sun_path)) return 0; /* unnamed */
        const char *n = ((const struct sockaddr_un *)sa)->sun_path;
        if (g_sockpath[0] && !strncmp(n, g_sockpath, sizeof g_sockpath)) return 0; /* ours */
        char name[sizeof((struct sockaddr_un *)0)->sun_path + 1] = {0};
        size_t k = len - offsetof(struct sockaddr_un, sun_path);
        memcpy(name, n, k < sizeof name - 1 ? k : sizeof name - 1);
        struct stat st;
        if (name[0] && rsys(SYS_newfstatat, AT_FDCWD, (long)name, (long)&st, 0, 0,
                            NET_COOKIE) == -ENOENT)
            return 0; /* nothing there to reach (nscd, a journal that is not running) */
    }
    int type = sa->sa_family == AF_UNIX ? 0 : net_type(fd);
    if (sa->sa_family != AF_UNIX && net_remote(sa, len)) {
        net_refused(sa, len, type, how);
        return EACCES;
    }
    char path[1300];
    net_key(path, path + sizeof path - 1, sa, len, type);
    struct stat st;
    if (!is_err(rsys(SYS_newfstatat, AT_FDCWD, (long)path, (long)&st, 0, 0, NET_COOKIE)))
        return 0; /* the tree's own */
    net_refused(sa, len, type, how);
    return ECONNREFUSED;
}

static long net_trapped(int nr, greg_t *g) {
    long a0 = g[REG_RDI], a1 = g[REG_RSI], a2 = g[REG_RDX], a3 = g[REG_R10],
         a4 = g[REG_R8], a5 = g[REG_R9];
    int e;
    struct sockaddr_un un; /* the kernel's view of an AF_UNIX path under path mapping */
    socklen_t ulen = (socklen_t)a2;
    if (g_mode != MODE_REPLAY || !(g_nonet || g_resume)) { /* gone live, or a replay
                                                              * with --allow-network */
        if (nr == SYS_connect || nr == SYS_bind)
            a1 = (long)pm_sun((const struct sockaddr *)a1, &ulen, &un), a2 = ulen;
        return rsys(nr, a0, a1, a2, a3, a4, NET_COOKIE);
    }
    if (nr == SYS_bind) {
        const struct sockaddr *sa = pm_sun((const struct sockaddr *)a1, &ulen, &un);
        long r = rsys(SYS_bind, a0, (long)sa, ulen, 0, 0, NET_COOKIE);
        if (r == 0) net_register(a0);
        return r;
    }
    if (nr == SYS_connect) {
        if ((e = net_refuse(a0, (const struct sockaddr *)a1, (socklen_t)a2, "connect")))
            return -e;
        const struct sockaddr *sa = pm_sun((const struct sockaddr *)a1, &ulen, &un);
        return rsys(SYS_connect, a0, (long)sa, ulen, 0, 0, NET_COOKIE);
    }
    if (nr == SYS_sendto) {
        if ((e = net_refuse(a0, (const struct sockaddr *)a4, (socklen_t)a5, "send")))
            return -e;
        struct iovec iov = {(void *)a1, (size_t)a2};
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_name = (void *)a4;
        mh.msg_namelen = (socklen_t)a5;
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        return rsys(SYS_sendmsg, a0, (long)&mh, a3, 0, 0, NET_COOKIE);
    }
    if (nr == SYS_sendmsg) {
        const struct msghdr *mh = (const struct msghdr *)a1;
        if (mh && (e = net_refuse(a0, mh->msg_name, mh->msg_namelen, "send"))) return -e;
        return rsys(SYS_sendmsg, a0, a1, a2, 0, 0, NET_COOKIE);
    }
    const struct mmsghdr *v = (const struct mmsghdr *)a1; /* sendmmsg */
    for (unsigned i = 0; v && i < (unsigned)a2; i++)
        if ((e = net_refuse(a0, v[i].msg_hdr.msg_name, v[i].msg_hdr.msg_namelen, "send")))
            return -e;
    return rsys(SYS_sendmmsg, a0, a1, a2, a3, 0, NET_COOKIE);
}

#ifndef SYS_SECCOMP
#define SYS_SECCOMP 1 /* siginfo si_code of a seccomp trap */
#endif

/* A SIGSYS that is not one of the traps (kill, raise, a program's own filter): the
 * program's handler, as the kernel would have run it; its default action is death. */
static void sigsys_chain(int sig, siginfo_t *si, void *ctx) {
    struct sigaction p = g_sigsys_prog;
    if (p.sa_handler == SIG_IGN) return;
    if (p.sa_handler == SIG_DFL) {
        struct { void *h; unsigned long flags; void *restorer; uint64_t mask; } dfl = {0};
        RS4(SYS_rt_sigaction, SIGSYS, &dfl, NULL, 8);
        RS3(SYS_tgkill, RS0(SYS_getpid), RS0(SYS_gettid), SIGSYS);
        return;
    }
    if (p.sa_flags & SA_SIGINFO) p.sa_sigaction(sig, si, ctx);
    else p.sa_handler(sig);
}

static void sigsys_handler(int sig, siginfo_t *si, void *ctx) {
    if (si->si_code != SYS_SECCOMP) {
        sigsys_chain(sig, si, ctx);
        return;
    }
    ucontext_t *uc = ctx;
    greg_t *g = uc->uc_mcontext.gregs;
    int saved = errno;
    long ret = -ENOSYS;
    if (si->si_syscall == SYS_connect || si->si_syscall == SYS_sendto ||
        si->si_syscall == SYS_sendmsg || si->si_syscall == SYS_sendmmsg ||
        si->si_syscall == SYS_bind) {
        ret = net_trapped(si->si_syscall, g);
    } else if (pm_handles(si->si_syscall)) {
        ret = pm_trapped(si->si_syscall, uc);
    } else if (si->si_syscall == SYS_getrandom) {
        void *buf = (void *)g[REG_RDI];
        size_t n = (size_t)g[REG_RSI];
        unsigned flags = (unsigned)g[REG_RDX];
        if (g_mode && !T.guard && !reentered()) {
            ssize_t r = entropy(0, OP_GETRANDOM_RAW, buf, n, flags, -1);
            ret = r < 0 ? -errno : r;
        } else {
            ret = RS3(SYS_getrandom, buf, n, flags);
        }
    }
    g[REG_RAX] = ret;
    errno = saved;
}


/* A resume's or fork's prefix: the same refusal, for calls made from shared libraries'
 * text only (mapped from 0x7f0000000000 up; a program's own text lies below: a PIE's at
 * 0x555555554000 with ASLR off, a static Go binary's at 0x400000). The prefix's
 * processes go live later, and a static program started then has no handler: its calls
 * must pass, not trap. Once a process is live its handler lets everything through
 * (net_trapped). */
#define LIBS_FROM_HI32 0x7f00u
static int install_prefix_net_filter(void) {
    struct sock_filter f[] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        /* 2 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        /* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_connect, 10, 0),
        /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_bind, 9, 0),
        /* 6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sendmsg, 8, 0),
        /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sendmmsg, 7, 0),
        /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sendto, 1, 0),
        /* 9 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 10: sendto with no address (a connected socket) passes */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4])),
        /* 11 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 3),
        /* 12 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4]) + 4),
        /* 13 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1),
        /* 14 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 15: made from a shared library's text? */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer) + 4),
        /* 16 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, LIBS_FROM_HI32, 0, 5),
        /* 17: the handler's own (the cookie) pass */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[5])),
        /* 18 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NET_COOKIE_LO, 0, 2),
        /* 19 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[5]) + 4),
        /* 20 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NET_COOKIE_HI, 1, 0),
        /* 21 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        /* 22 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
    long r = RS3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
    if (r == -EACCES) {
        RS4(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0);
        r = RS3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
    }
    return is_err(r) ? -1 : 0;
}

static void install_filters(void) {
    /* a resume's or fork's prefix is refused the network too (STENO_RESUME implies it:
     * no variable more, the environment's size is fixed) */
    int want_net = g_mode == MODE_REPLAY && (g_nonet || g_resume) && !strchr(g_filt, 'n');
    int prefix_net = want_net && g_resume;
    if (prefix_net) want_net = 0;
    char tag[48] = {0}, *tp = tag, *tend = tag + sizeof tag - 1;
    int want_trap = 0;
    dl_iterate_phdr(exe_range_cb, NULL);
    uint32_t hi32 = (uint32_t)(g_exe_lo >> 32);
    /* a position-dependent executable's text sits at 0x400000, where every static Go
     * binary's does too: one exec'd later would inherit the trap without a handler for
     * it (SIGSYS kills it), so only a PIE's text is trapped */
    if (g_exe_pie && g_exe_lo && g_exe_hi > g_exe_lo &&
        (uint32_t)((g_exe_hi - 1) >> 32) == hi32) {
        tp = s_put(tp, tend, "t"); tp = hex_put(tp, tend, g_exe_lo);
        tp = s_put(tp, tend, "-"); tp = hex_put(tp, tend, g_exe_hi);
        *tp = 0;
        want_trap = !strstr(g_filt, tag);
    }
    /* an inherited filter may trap this image's executable too: the handler goes in
     * whenever any trap rule is on the tree, before the filter */
    if (want_trap || want_net || prefix_net || strchr(g_filt, 't') || strchr(g_filt, 'n') ||
        g_npm) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = sigsys_handler;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (!__atomic_load_n(&g_sigsys_mine, __ATOMIC_ACQUIRE)) {
            RESOLVE(sigaction);
            real_sigaction(SIGSYS, &sa, NULL);
            __atomic_store_n(&g_sigsys_mine, 1, __ATOMIC_RELEASE);
        }
    }
    if (prefix_net && install_prefix_net_filter() == 0) {
        size_t at = s_len(g_filt);
        if (at + 1 < sizeof g_filt) { g_filt[at] = 'n'; g_filt[at + 1] = 0; }
    }
    if (g_npm && !strchr(g_filt, 'p') && install_pathmap_filter() == 0) {
        size_t at = s_len(g_filt);
        if (at + 1 < sizeof g_filt) { g_filt[at] = 'p'; g_filt[at + 1] = 0; }
    }
    if (!want_net && !want_trap) {
        size_t at = s_len(g_filt);
        if (!strchr(g_filt, 'n') && !strchr(g_filt, '-') && at + 1 < sizeof g_filt) {
            g_filt[at] = '-'; /* see below: as long as a replay's "n" */
            g_filt[at + 1] = 0;
        }
        return;
    }
    uint32_t lo = (uint32_t)g_exe_lo, hi = (uint32_t)g_exe_hi;
    if ((uint32_t)((g_exe_hi) >> 32) != hi32) hi = 0xffffffffu;
#define AL(n) (offsetof(struct seccomp_data, args[n]))
#define ALLOWED (SECCOMP_RET_ALLOW)
    uint32_t no = 0xffffffffu;
    struct sock_filter f[] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        /* 2 */ BPF_STMT(BPF_RET | BPF_K, ALLOWED),
        /* 3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        /* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, want_trap ? SYS_getrandom : no, 6, 0),
        /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, want_net ? SYS_connect : no, 12, 0),
        /* 6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, want_net ? SYS_bind : no, 11, 0),
        /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, want_net ? SYS_sendmsg : no, 10, 0),
        /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, want_net ? SYS_sendmmsg : no, 9, 0),
        /* 9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, want_net ? SYS_sendto : no, 12, 0),
        /* 10 */ BPF_STMT(BPF_RET | BPF_K, ALLOWED),
        /* 11: getrandom: trap if lo <= ip < hi (same upper half) */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer) + 4),
        /* 12 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, hi32, 0, 4),
        /* 13 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer)),
        /* 14 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, lo, 0, 2),
        /* 15 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, hi, 1, 0),
        /* 16 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        /* 17 */ BPF_STMT(BPF_RET | BPF_K, ALLOWED),
        /* 18: connect, bind, sendmsg, sendmmsg: the shim's own (cookie in the unused 6th
         * argument, made by net_trapped after it checked the address) pass, others trap */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, AL(5)),
        /* 19 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NET_COOKIE_LO, 0, 6),
        /* 20 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, AL(5) + 4),
        /* 21 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NET_COOKIE_HI, 5, 4),
        /* 22: sendto: with no address (a connected socket) it passes, else traps */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, AL(4)),
        /* 23 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2),
        /* 24 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, AL(4) + 4),
        /* 25 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0),
        /* 26 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        /* 27 */ BPF_STMT(BPF_RET | BPF_K, ALLOWED),
    };
#undef AL
#undef ALLOWED
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
    /* SPEC_ALLOW: by default the kernel turns on speculative-store-bypass mitigation for
     * a task under seccomp, which made every recorded clock read twice as slow; this
     * filter is a tape, not a security boundary. */
#ifndef SECCOMP_FILTER_FLAG_SPEC_ALLOW
#define SECCOMP_FILTER_FLAG_SPEC_ALLOW (1UL << 2)
#endif
    unsigned long fl = SECCOMP_FILTER_FLAG_SPEC_ALLOW;
    long r = RS3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, fl, &prog);
    if (r == -EINVAL) r = RS3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, fl = 0, &prog);
    if (r == -EACCES) { /* no CAP_SYS_ADMIN: a filter needs no_new_privs */
        RS4(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0);
        r = RS3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, fl, &prog);
    }
    if (is_err(r)) return;
    size_t at = s_len(g_filt);
    char *p = g_filt + at, *end = g_filt + sizeof g_filt - 1;
    /* one character either way: a child's environment (STENO_FILT) is as long in both
     * modes, so its initial stack is at the same address (launch.STENO_ENV_BYTES) */
    if (!strchr(g_filt, 'n') && !strchr(g_filt, '-')) p = s_put(p, end, want_net ? "n" : "-");
    if (want_trap) p = s_put(p, end, tag);
    *p = 0;
}
