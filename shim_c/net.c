/* Channel net: the conversations a process has with peers outside the recorded tree.
 *
 * A connect() to an address no process of the tree has bound (a payment service on
 * loopback, a database, a DNS server, a daemon's unix socket) makes the socket a taped
 * connection. On the tape: the connect's outcome, every receive (its bytes, in the sizes
 * they came), every send (its size and a digest of its bytes), the connection's readiness
 * in poll, select and epoll, and the socket calls the peer answers (getsockopt,
 * getpeername, shutdown...). At replay the connection is never opened: the socket stays
 * a fresh unconnected one, and the shim answers every call on it from the tape; a send
 * whose bytes differ from the recorded ones is a divergence naming the connection. A
 * connection to a process of the tree (an agent and the server it started) stays live
 * at both ends, both of them replayed.
 *
 * Connections are numbered per process in connect order; every record names its
 * connection, so a record served to another connection is caught. The Python hooks'
 * own calls (HTTP they record semantically) run paused and are not taped twice. */

#define NET_FDS 1024
#define HOLD_MAX 8192 /* the largest request head held back for its body (neteffect.c) */
#define NET_SEND_HELD 1u /* OP_NET_SEND flags: a head held back, not sent until its body */
#define NET_SEND_REFUSED 2u /* OP_NET_SEND flags: a resume refused it unsent (net_live) */
#define NET_HEAD 64 /* bytes of each send kept for the report of a different one */

/* Where an HTTP/1 conversation stands (record and replay alike: a resume goes live
 * between two requests, never inside one). */
enum { PH_IDLE, PH_ASKED, PH_ANSWERED, PH_ANSWERING };

/* How far an answer is read (neteffect.c answer_feed): its head's lines, then its body. */
enum { AN_STATUS, AN_HEADERS, AN_BODY, AN_CHUNK_SIZE, AN_CHUNK_DATA, AN_CHUNK_END,
       AN_TRAILER, AN_TO_CLOSE };

typedef struct {
    uint8_t st;        /* AN_* */
    uint8_t chunked;   /* Transfer-Encoding: chunked */
    uint8_t no_body;   /* a HEAD request's answer */
    uint16_t linelen;  /* bytes of the line being read (kept: the first sizeof line) */
    int code;          /* the status code of the answer being read */
    int64_t length;    /* Content-Length, -1 none */
    uint64_t left;     /* body (or chunk) bytes still to come */
    char line[96];
    char status[64];   /* the final answer's status line, for its ToolResult */
} answer_t;

typedef struct {
    uint32_t conn;
    uint32_t sends; /* sends so far (for the report) */
    uint32_t reqs;  /* HTTP requests begun on it */
    int phase;      /* PH_*: an HTTP request asked, its answer being read, answered whole */
    int served;     /* replay: its connect was served, the socket was never connected */
    int fresh;      /* resume: connected live for its first request (net_live) */
    int refused;    /* resume: its sends are refused (mid-conversation at the cut) */
    int standin;    /* resume: a stand-in answers it (an effect settled with its answer) */
    char call[64];  /* the effect whose answer is awaited ("": none) */
    char ccall[64]; /* the connection itself an effect, open ("": not one) */
    int stream;     /* SOCK_STREAM: its bytes are a conversation */
    char name[72];  /* "tcp 127.0.0.1:8080" */
    struct sockaddr_storage sa; /* the peer, to connect again (resume, net_live) */
    socklen_t salen;
    answer_t ans;   /* the answer being read */
    unsigned char *held; /* record: an effect's head, held until its body's first send */
    uint32_t heldn;
} netconn_t;

static uint64_t g_nfd[NET_FDS / 64];
static netconn_t g_nconn[NET_FDS];
static uint32_t g_nconns; /* connections this process has taped */

static inline int nfd_is(int fd) {
    return (unsigned)fd < NET_FDS &&
           (__atomic_load_n(&g_nfd[fd >> 6], __ATOMIC_RELAXED) >> (fd & 63) & 1);
}
static void nfd_clear(int fd);

/* The record's form of an address (the arguments of OP_NET_CONNECT): u16 family |
 * u16 port | u32 n | n bytes (the IPv4 or IPv6 address, or the unix name). */
typedef struct {
    uint16_t family, port;
    uint32_t n;
    unsigned char b[sizeof((struct sockaddr_un *)0)->sun_path];
} netaddr_t;

static int net_tree(const struct sockaddr *sa, socklen_t len, int type); /* seccomp.c */

static int sock_type(int fd) {
    int type = 0;
    socklen_t tl = sizeof type;
    RS6(SYS_getsockopt, fd, SOL_SOCKET, SO_TYPE, &type, &tl, 0);
    return type;
}

/* The argument bytes for a connect to `sa` that may be taped; 0 for one that is not a
 * conversation with another host or daemon (netlink, an unnamed socket, the recorder's
 * own sockets). */
static uint32_t net_addr(const struct sockaddr *sa, socklen_t len, netaddr_t *a) {
    if (!sa || len < sizeof(sa_family_t)) return 0;
    memset(a, 0, 8);
    a->family = sa->sa_family;
    if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        a->port = ntohs(in->sin_port);
        a->n = 4;
        memcpy(a->b, &in->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)sa;
        a->port = ntohs(in->sin6_port);
        a->n = 16;
        memcpy(a->b, &in->sin6_addr, 16);
    } else if (sa->sa_family == AF_UNIX && len > offsetof(struct sockaddr_un, sun_path)) {
        const char *p = ((const struct sockaddr_un *)sa)->sun_path;
        size_t k = len - offsetof(struct sockaddr_un, sun_path);
        if (k > sizeof a->b) k = sizeof a->b;
        if (p[0]) k = strnlen(p, k); /* a path: up to its NUL; abstract: every byte */
        size_t d = s_len(g_sockpath);
        while (d && g_sockpath[d - 1] != '/') d--;
        if (!k || (d && k >= d && !memcmp(p, g_sockpath, d))) return 0; /* the recorder's */
        a->n = (uint32_t)k;
        memcpy(a->b, p, k);
    } else {
        return 0;
    }
    return 8 + a->n;
}

static void net_name(char *out, size_t cap, const netaddr_t *a, int type) {
    char *p = out, *end = out + cap - 1;
    p = s_put(p, end, a->family == AF_UNIX ? "unix " : type == SOCK_DGRAM ? "udp " : "tcp ");
    if (a->family == AF_UNIX) {
        for (uint32_t i = 0; i < a->n && p < end; i++)
            *p++ = a->b[i] ? (char)a->b[i] : '@';
    } else {
        char s[64];
        if (inet_ntop(a->family, a->b, s, sizeof s)) p = s_put(p, end, s);
        p = s_put(p, end, a->family == AF_INET6 ? " port " : ":");
        p = u_put(p, end, a->port);
    }
    *p = 0;
}

static void nfd_mark(int fd, const netaddr_t *a, const struct sockaddr *sa, socklen_t len) {
    if ((unsigned)fd >= NET_FDS || nfd_is(fd)) return;
    netconn_t *c = &g_nconn[fd];
    c->conn = __atomic_fetch_add(&g_nconns, 1, __ATOMIC_RELAXED);
    c->sends = c->reqs = 0;
    c->phase = PH_IDLE;
    c->served = c->fresh = c->refused = c->standin = 0;
    c->call[0] = c->ccall[0] = 0;
    c->held = NULL;
    c->heldn = 0;
    c->stream = sock_type(fd) == SOCK_STREAM;
    c->salen = len < sizeof c->sa ? len : sizeof c->sa;
    memcpy(&c->sa, sa, c->salen);
    net_name(c->name, sizeof c->name, a, sock_type(fd));
    __atomic_fetch_or(&g_nfd[fd >> 6], 1ULL << (fd & 63), __ATOMIC_RELAXED);
}

static void net_report(tls_t *t, int fd, const char *recorded, const char *asked) {
    char line[1024];
    char *p = line, *end = line + sizeof line - 2;
    p = s_put(p, end, "divergence\tproc="); p = s_put(p, end, g_proc);
    p = s_put(p, end, "\tthread="); p = u_put(p, end, t->tindex);
    p = s_put(p, end, "\tchannel=net\tpos="); p = u_put(p, end, t->st[CH_NET].pos - 1);
    p = s_put(p, end, "\trecorded=");
    if ((unsigned)fd < NET_FDS) {
        p = s_put(p, end, g_nconn[fd].name);
        p = s_put(p, end, " (connection #"); p = u_put(p, end, g_nconn[fd].conn);
        p = s_put(p, end, "): ");
    }
    p = s_put(p, end, recorded);
    p = s_put(p, end, "\tasked="); p = s_put(p, end, asked);
    *p++ = '\n';
    if (g_reports++ < 500) append_report(line, (size_t)(p - line));
    if (!g_lenient) diverged();
}

/* ------------------------------------------------------------------ connect */

/* A connection to the tree's own address stays live at both ends, but whether it was
 * made is taped (OP_NET_LOCAL, since protocol 7): an agent that polls its server's port
 * until the server listens is refused as often at replay as it was at record, and a
 * connect the recording made waits at replay for the server to listen. A non-blocking
 * connect is resolved before it returns (loopback answers at once), so a refusal is
 * the connect's own result, as Linux may give it, never a later SO_ERROR. */
typedef struct {
    int32_t result;    /* what connect returned: 0, -EINPROGRESS (connected), -errno */
    uint32_t resolved; /* 0: an -EINPROGRESS that did not settle in LOCAL_WAIT_MS */
    uint32_t lport;    /* the port the kernel gave this end (a server logs its peer's) */
} netlocal_t;

#define LOCAL_WAIT_MS 5000

static int32_t local_settle(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    if (RS3(SYS_poll, &p, 1, LOCAL_WAIT_MS) != 1) return -EINPROGRESS;
    int err = 0;
    socklen_t el = sizeof err;
    RS6(SYS_getsockopt, fd, SOL_SOCKET, SO_ERROR, &err, &el, 0);
    return err ? -err : 0;
}

static uint32_t local_port(int fd) {
    struct sockaddr_storage me;
    socklen_t ml = sizeof me;
    if (is_err(RS3(SYS_getsockname, fd, &me, &ml))) return 0;
    if (me.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&me)->sin_port);
    if (me.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&me)->sin6_port);
    return 0;
}

static netlocal_t local_record(int fd, const struct sockaddr *sa, socklen_t len) {
    uint32_t bound = local_port(fd); /* the program bound it itself: nothing to repeat */
    netlocal_t l = {(int32_t)RS3(SYS_connect, fd, sa, len), 1, 0};
    if (l.result == -EINPROGRESS) {
        int32_t e = local_settle(fd);
        if (e == -EINPROGRESS) l.resolved = 0;
        else if (e) l.result = e;
    }
    if (!bound && (l.result == 0 || l.result == -EINPROGRESS)) l.lport = local_port(fd);
    return l;
}

/* Replay: this end takes the recorded port again (so the server logs the recorded peer),
 * if the kernel lets it; else a fresh socket in the fd's place takes what it is given. */
static void local_bind(int fd, const struct sockaddr *sa, uint32_t port) {
    struct sockaddr_storage me;
    memset(&me, 0, sizeof me);
    me.ss_family = sa->sa_family;
    socklen_t ml;
    if (sa->sa_family == AF_INET) {
        ((struct sockaddr_in *)&me)->sin_port = htons((uint16_t)port);
        ml = sizeof(struct sockaddr_in);
    } else if (sa->sa_family == AF_INET6) {
        ((struct sockaddr_in6 *)&me)->sin6_port = htons((uint16_t)port);
        ml = sizeof(struct sockaddr_in6);
    } else {
        return;
    }
    int on = 1, off = 0;
    RS6(SYS_setsockopt, fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on, 0);
    RS3(SYS_bind, fd, &me, ml);
    RS6(SYS_setsockopt, fd, SOL_SOCKET, SO_REUSEADDR, &off, sizeof off, 0);
}

static int local_fresh(int fd, int family) {
    long fl = RS2(SYS_fcntl, fd, F_GETFL), fdf = RS2(SYS_fcntl, fd, F_GETFD);
    long ns = RS3(SYS_socket, family, sock_type(fd), 0);
    if (is_err(ns)) return 0;
    RS3(SYS_dup3, ns, fd, (!is_err(fdf) && (fdf & FD_CLOEXEC)) ? O_CLOEXEC : 0);
    RS1(SYS_close, ns);
    if (!is_err(fl)) RS3(SYS_fcntl, fd, F_SETFL, fl);
    return 1;
}

/* Replay of a local connect the recording made: again until the server listens (it is
 * replayed too, and may not have got there yet). */
static int32_t local_replay(int fd, const struct sockaddr *sa, socklen_t len,
                            const netlocal_t *l) {
    if (l->result && l->result != -EINPROGRESS) return l->result; /* refused: not asked */
    if (!l->resolved) return (int32_t)RS3(SYS_connect, fd, sa, len);
    if (l->lport) local_bind(fd, sa, l->lport);
    long r = 0;
    for (int i = 0; i < LOCAL_WAIT_MS; i++) { /* 10 ms apart: 50 s at most */
        r = RS3(SYS_connect, fd, sa, len);
        if (r == -EINPROGRESS || r == -EALREADY) r = local_settle(fd);
        if (r == 0 || r == -EISCONN) return l->result;
        if ((r == -EADDRNOTAVAIL || r == -EADDRINUSE) && local_fresh(fd, sa->sa_family))
            continue;
        if (r != -ECONNREFUSED && r != -ECONNABORTED && r != -ENOENT && r != -EAGAIN) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        RS3(SYS_nanosleep, &ts, 0, 0);
    }
    return (int32_t)r;
}

static inline void pfd_set(int fd, int on); /* io.c */

/* A stream connected to the tree's own address: its receives are shaped (io.c). */
static void local_mark(int fd, int32_t result) {
    if ((result == 0 || result == -EINPROGRESS) && sock_type(fd) == SOCK_STREAM)
        pfd_set(fd, 1);
}

static int net_connect(int fd, const struct sockaddr *sa, socklen_t len) {
    netaddr_t a;
    uint32_t an = (unsigned)fd < NET_FDS ? net_addr(sa, len, &a) : 0;
    if (!an || !ACTIVE()) return (int)sys_ret(RS3(SYS_connect, fd, sa, len));
    tls_t *t = me();
    if (g_mode != MODE_RECORD && !nfd_is(fd) &&
        tape_peek(t, CH_NET, OP_NET_LOCAL, &a, an) == 1) {
        served_t s;
        netlocal_t l;
        if (tape_step(t, CH_NET, OP_NET_LOCAL, &a, an, &s) != STEP_SERVED ||
            s.n < an + sizeof l)
            return (int)sys_ret(RS3(SYS_connect, fd, sa, len));
        memcpy(&l, s.p + an, sizeof l);
        int32_t r = local_replay(fd, sa, len, &l);
        local_mark(fd, r);
        return (int)sys_ret(r);
    }
    if (g_mode != MODE_RECORD && !nfd_is(fd)) {
        /* taped if the recording taped it: a connect it did not tape went to the tree
         * (live; the seccomp filter refuses one that goes anywhere else) */
        int k = tape_peek(t, CH_NET, OP_NET_CONNECT, &a, an);
        if (k == 0 || (k < 0 && !g_resume))
            return (int)sys_ret(RS3(SYS_connect, fd, sa, len));
    }
    served_t s;
    int32_t res;
    switch (tape_step(t, CH_NET, OP_NET_CONNECT, &a, an, &s)) {
    case STEP_RECORD:
        if (!nfd_is(fd) && net_tree(sa, len, sock_type(fd))) { /* the tree's own: live */
            if (!SINCE(7)) return (int)sys_ret(RS3(SYS_connect, fd, sa, len));
            netlocal_t l = local_record(fd, sa, len);
            rec2(t, CH_NET, OP_NET_LOCAL, &a, an, &l, sizeof l);
            local_mark(fd, l.result);
            return (int)sys_ret(l.result);
        }
        res = (int32_t)RS3(SYS_connect, fd, sa, len);
        rec2(t, CH_NET, OP_NET_CONNECT, &a, an, &res, 4);
        /* intent before effect: the connection is durable on the tape before a byte goes
         * out on it, so a resume serves it and never opens it again */
        if (!nfd_is(fd) && (res == 0 || res == -EINPROGRESS || res == -EAGAIN))
            barrier(MSG_SYNC);
        break;
    case STEP_LIVE:
        return (int)sys_ret(RS3(SYS_connect, fd, sa, len));
    case STEP_SERVED:
    default:
        memcpy(&res, s.p + an, 4);
        break;
    }
    if (res == 0 || res == -EINPROGRESS || res == -EALREADY || res == -EISCONN ||
        res == -EAGAIN)
        nfd_mark(fd, &a, sa, len);
    if (g_mode != MODE_RECORD && (unsigned)fd < NET_FDS && nfd_is(fd)) g_nconn[fd].served = 1;
    if (res < 0) { errno = -res; return -1; }
    return 0;
}

EXPORT int connect(int fd, const struct sockaddr *sa, socklen_t len) {
    return net_connect(fd, sa, len);
}
