/* A taped connection's traffic (net.c holds the connections): sends, receives, the socket
 * calls the peer answers, readiness in epoll sets; and the socket wrappers that tape
 * nothing (socket, bind, accept). */

/* ------------------------------------------------------------------ send */

/* OP_NET_SEND payload (after the u32 connection): u32 asked | i32 result | u64 digest of
 * the bytes the peer took | u32 head | u32 flags | the first `head` bytes of them (all of
 * them, for a held head: NET_SEND_HELD, not sent until its body's first send) */
typedef struct { uint32_t asked; int32_t result; uint64_t digest; uint32_t head, flags; } netsend_t;
_Static_assert(sizeof(netsend_t) == 24, "OP_NET_SEND payload: u32 asked | i32 result | u64 digest | u32 head | u32 flags");

static uint64_t iov_digest(const struct iovec *iov, size_t cnt, size_t n, unsigned char *head,
                           uint32_t *headn) {
    uint64_t h = 1469598103934665603ULL;
    size_t done = 0;
    for (size_t i = 0; i < cnt && done < n; i++) {
        const unsigned char *b = iov[i].iov_base;
        size_t k = iov[i].iov_len < n - done ? iov[i].iov_len : n - done;
        for (size_t j = 0; j < k; j++) {
            if (head && done + j < NET_HEAD) head[done + j] = b[j];
            h ^= b[j];
            h *= 1099511628211ULL;
        }
        done += k;
    }
    if (headn) *headn = (uint32_t)(done < NET_HEAD ? done : NET_HEAD);
    return h;
}

static size_t iov_total(const struct iovec *iov, size_t cnt) {
    size_t n = 0;
    for (size_t i = 0; i < cnt; i++) n += iov[i].iov_len;
    return n;
}

/* "<n> bytes: <the first of them, printable>" */
static char *show_bytes(char *p, char *end, size_t n, const unsigned char *b, uint32_t k) {
    p = u_put(p, end, n);
    p = s_put(p, end, " bytes \"");
    for (uint32_t i = 0; i < k && p + 4 < end; i++) {
        unsigned char c = b[i];
        if (c >= 32 && c < 127 && c != '"' && c != '\\') *p++ = (char)c;
        else if (c == '\r') p = s_put(p, end, "\\r");
        else if (c == '\n') p = s_put(p, end, "\\n");
        else *p++ = '.';
    }
    p = s_put(p, end, k < n ? "...\"" : "\"");
    return p;
}

static ssize_t net_send(int fd, const struct msghdr *mh, int flags) {
    tls_t *t = me();
    uint32_t conn = g_nconn[fd].conn;
    size_t asked = iov_total(mh->msg_iov, mh->msg_iovlen);
    served_t s;
    netsend_t r;
    unsigned char head[NET_HEAD];
    switch (tape_step(t, CH_NET, OP_NET_SEND, &conn, 4, &s)) {
    case STEP_RECORD: {
        if (UNLIKELY(g_nconn[fd].served)) net_live(fd);
        if (UNLIKELY(g_nconn[fd].fresh || g_nconn[fd].refused) && !net_may_send(fd, mh, asked)) {
            g_nconn[fd].refused = 1; /* never connected live: nothing of it leaves */
            RS2(SYS_shutdown, fd, SHUT_RDWR);
            netsend_t no = {asked > 0xffffffffu ? 0xffffffffu : (uint32_t)asked, -EPIPE, 0, 0,
                            NET_SEND_REFUSED};
            rec2(t, CH_NET, OP_NET_SEND, &conn, 4, &no, sizeof no); /* a later replay: the same */
            g_nconn[fd].sends++;
            errno = EPIPE;
            return -1;
        }
        int ok = net_request(t, fd, mh, asked);
        long k = ok == 2 ? (long)asked : ok ? RS3(SYS_sendmsg, fd, mh, flags) : -ECONNRESET;
        if (!ok) RS2(SYS_shutdown, fd, SHUT_RDWR); /* the policy refused it: as if reset */
        r.asked = asked > 0xffffffffu ? 0xffffffffu : (uint32_t)asked;
        r.result = (int32_t)k;
        r.digest = iov_digest(mh->msg_iov, mh->msg_iovlen, k > 0 ? (size_t)k : 0, head, &r.head);
        r.flags = ok == 2 ? NET_SEND_HELD : 0;
        if (ok == 2) { /* held: the whole head is taped (a resume may hold it again) */
            unsigned char out[sizeof r + HOLD_MAX];
            r.head = g_nconn[fd].heldn;
            memcpy(out, &r, sizeof r);
            memcpy(out + sizeof r, g_nconn[fd].held, r.head);
            rec2(t, CH_NET, OP_NET_SEND, &conn, 4, out, (uint32_t)sizeof r + r.head);
        } else {
            unsigned char out[sizeof r + NET_HEAD];
            memcpy(out, &r, sizeof r);
            memcpy(out + sizeof r, head, r.head);
            rec2(t, CH_NET, OP_NET_SEND, &conn, 4, out, (uint32_t)sizeof r + r.head);
        }
        g_nconn[fd].sends++;
        return sys_ret(k);
    }
    case STEP_LIVE:
        return sys_ret(RS3(SYS_sendmsg, fd, mh, flags));
    case STEP_SERVED:
    default:
        break;
    }
    memcpy(&r, s.p + 4, sizeof r);
    if (r.result > 0) { /* where the conversation stands, as record followed it */
        char hb[2048], target[700];
        size_t k = iov_head(mh->msg_iov, mh->msg_iovlen, (size_t)r.result, hb, sizeof hb);
        net_track_send(&g_nconn[fd], hb, k, target, sizeof target);
        net_served_send(fd, r.flags, s.p + 4 + sizeof r, r.head);
    }
    g_nconn[fd].sends++;
    if (r.flags & NET_SEND_REFUSED) g_nconn[fd].refused = 1;
    if (r.result < 0) { errno = -r.result; return -1; }
    uint32_t hn = 0;
    uint64_t d = asked >= (size_t)r.result
                     ? iov_digest(mh->msg_iov, mh->msg_iovlen, (size_t)r.result, head, &hn) : 0;
    if (asked < (size_t)r.result || d != r.digest) {
        char rec_s[256], ask_s[256];
        char *p = s_put(rec_s, rec_s + sizeof rec_s - 1, "send #");
        p = u_put(p, rec_s + sizeof rec_s - 1, g_nconn[fd].sends);
        p = s_put(p, rec_s + sizeof rec_s - 1, " of ");
        p = show_bytes(p, rec_s + sizeof rec_s - 1, (size_t)r.result, s.p + 4 + sizeof r,
                       r.head < NET_HEAD ? r.head : NET_HEAD);
        *p = 0;
        iov_digest(mh->msg_iov, mh->msg_iovlen, asked, head, &hn);
        p = s_put(ask_s, ask_s + sizeof ask_s - 1, "a send of ");
        p = show_bytes(p, ask_s + sizeof ask_s - 1, asked, head, hn);
        *p = 0;
        net_report(t, fd, rec_s, ask_s);
    }
    return r.result;
}

static ssize_t net_send1(int fd, const void *buf, size_t n, int flags) {
    struct iovec iov = {(void *)buf, n};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    return net_send(fd, &mh, flags);
}

#define NET_ON(fd) (UNLIKELY(nfd_is(fd)) && ACTIVE())

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags) {
    if (NET_ON(fd)) return net_send1(fd, buf, n, flags);
    return sys_ret(RS6(SYS_sendto, fd, buf, n, flags, 0, 0));
}
EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *sa,
                      socklen_t sl) {
    if (NET_ON(fd)) return net_send1(fd, buf, n, flags); /* connected: the address is moot */
    return sys_ret(RS6(SYS_sendto, fd, buf, n, flags, sa, sl));
}
EXPORT ssize_t sendmsg(int fd, const struct msghdr *mh, int flags) {
    if (NET_ON(fd)) return net_send(fd, mh, flags);
    return sys_ret(RS3(SYS_sendmsg, fd, mh, flags));
}
EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags) {
    if (!NET_ON(fd)) return (int)sys_ret(RS4(SYS_sendmmsg, fd, v, n, flags));
    unsigned int i = 0; /* one record per message, as sent one by one */
    for (; i < n; i++) {
        ssize_t k = net_send(fd, &v[i].msg_hdr, flags);
        if (k < 0) return i ? (int)i : -1;
        v[i].msg_len = (unsigned)k;
    }
    return (int)i;
}
EXPORT ssize_t write(int fd, const void *buf, size_t n) {
    if (NET_ON(fd)) return net_send1(fd, buf, n, 0);
    RESOLVE(write);
    return real_write(fd, buf, n);
}
EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    if (NET_ON(fd) && cnt >= 0) {
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = (struct iovec *)iov;
        mh.msg_iovlen = (size_t)cnt;
        return net_send(fd, &mh, 0);
    }
    RESOLVE(writev);
    return real_writev(fd, iov, cnt);
}

/* ------------------------------------------------------------------ receive */

/* OP_NET_RECV payload (after the u32 connection): u32 asked | i32 result | i32 msg_flags |
 * u32 alen | the sender's address [alen] | the bytes received [min(result, asked)] */
typedef struct { uint32_t asked; int32_t result, mflags; uint32_t alen; } netrecv_t;
_Static_assert(sizeof(netrecv_t) == 16, "OP_NET_RECV payload: u32 asked | i32 result | i32 flags | u32 alen");

static void iov_fill(const struct iovec *iov, size_t cnt, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < cnt && n; i++) {
        size_t k = iov[i].iov_len < n ? iov[i].iov_len : n;
        memcpy(iov[i].iov_base, b, k);
        b += k;
        n -= k;
    }
}

static ssize_t net_recv(int fd, struct msghdr *mh, int flags) {
    tls_t *t = me();
    uint32_t conn = g_nconn[fd].conn;
    size_t asked = iov_total(mh->msg_iov, mh->msg_iovlen);
    served_t s;
    netrecv_t r;
    switch (tape_step(t, CH_NET, OP_NET_RECV, &conn, 4, &s)) {
    case STEP_RECORD: {
        if (UNLIKELY(g_nconn[fd].served)) net_live(fd);
        if (UNLIKELY(g_nconn[fd].held != NULL)) net_unhold(fd);
        long k = RS3(SYS_recvmsg, fd, mh, flags); /* (control messages are not taped) */
        r.asked = asked > 0xffffffffu ? 0xffffffffu : (uint32_t)asked;
        r.result = (int32_t)k;
        r.mflags = k >= 0 ? mh->msg_flags : 0;
        r.alen = k >= 0 && mh->msg_name ? mh->msg_namelen : 0;
        if (r.alen > mh->msg_namelen || r.alen > 128) r.alen = 0;
        size_t got = k > 0 ? ((size_t)k < asked ? (size_t)k : asked) : 0;
        /* the bytes follow the header in one record: gathered from the program's buffers */
        unsigned char stack[4096];
        size_t need = sizeof r + r.alen + got;
        unsigned char *out = need <= sizeof stack ? stack : shim_map(need, -1);
        if (out) {
            memcpy(out, &r, sizeof r);
            if (r.alen) memcpy(out + sizeof r, mh->msg_name, r.alen);
            unsigned char *q = out + sizeof r + r.alen;
            size_t left = got;
            for (size_t i = 0; i < mh->msg_iovlen && left; i++) {
                size_t c = mh->msg_iov[i].iov_len < left ? mh->msg_iov[i].iov_len : left;
                memcpy(q, mh->msg_iov[i].iov_base, c);
                q += c;
                left -= c;
            }
            rec2(t, CH_NET, OP_NET_RECV, &conn, 4, out, (uint32_t)need);
            if (out != stack) shim_unmap(out, need);
        }
        /* (after the record: an answer's result is a cut, and this receive is before it) */
        if (k >= 0 && !(flags & MSG_PEEK)) net_received(fd, mh->msg_iov, mh->msg_iovlen, (size_t)k);
        return sys_ret(k);
    }
    case STEP_LIVE:
        return sys_ret(RS3(SYS_recvmsg, fd, mh, flags));
    case STEP_SERVED:
    default:
        break;
    }
    memcpy(&r, s.p + 4, sizeof r);
    if (r.result < 0) { errno = -r.result; return -1; }
    size_t got = (size_t)r.result < r.asked ? (size_t)r.result : r.asked;
    if (asked < got) {
        char rec_s[96], ask_s[96];
        char *p = u_put(rec_s, rec_s + 60, got);
        p = s_put(p, rec_s + 90, " bytes received"); *p = 0;
        p = s_put(ask_s, ask_s + 60, "a receive of at most ");
        p = u_put(p, ask_s + 90, asked); *p = 0;
        net_report(t, fd, rec_s, ask_s);
        got = asked;
    }
    if (mh->msg_name) {
        uint32_t al = r.alen < mh->msg_namelen ? r.alen : mh->msg_namelen;
        memcpy(mh->msg_name, s.p + 4 + sizeof r, al);
        mh->msg_namelen = r.alen;
    }
    mh->msg_controllen = 0;
    mh->msg_flags = r.mflags;
    iov_fill(mh->msg_iov, mh->msg_iovlen, s.p + 4 + sizeof r + r.alen, got);
    if (!(flags & MSG_PEEK)) net_received(fd, mh->msg_iov, mh->msg_iovlen, got);
    return r.result;
}

static ssize_t net_recv1(int fd, void *buf, size_t n, int flags, struct sockaddr *sa,
                         socklen_t *sl) {
    struct iovec iov = {buf, n};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_name = sa;
    mh.msg_namelen = sa && sl ? *sl : 0;
    ssize_t k = net_recv(fd, &mh, flags);
    if (k >= 0 && sa && sl) *sl = mh.msg_namelen;
    return k;
}

/* Socket waits of program code (a server thread's accept, a recv on a socketpair between
 * threads, a taped connection's receive) hand the scheduler's baton on while they can
 * block (sched.c, may_block); the Python hooks' own socket calls run paused. */
static inline int pfd_is(int fd);                             /* io.c */
static inline void pfd_set(int fd, int on);                   /* io.c */
static ssize_t io_read(int fd, void *buf, size_t n, int flags); /* io.c */
static void io_wait(int fd, short events, short want);          /* io.c */

/* A receive of a connection between processes of the tree is shaped as a pipe's read is
 * (io.c): how many bytes it got depends on when the peer wrote. */
#define TREE_RECV(fd, flags, sa) \
    (UNLIKELY(pfd_is(fd)) && ACTIVE() && !(sa) && ((flags) & ~MSG_DONTWAIT) == 0)

EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *sa,
                        socklen_t *sl) {
    if (TREE_RECV(fd, flags, sa)) return GATED(OP_SCHED_IO, 1, io_read(fd, buf, n, flags));
    if (NET_ON(fd))
        return GATED(OP_SCHED_IO, may_block(fd, flags), net_recv1(fd, buf, n, flags, sa, sl));
    return GATED(OP_SCHED_IO, may_block(fd, flags),
                 sys_ret(RS6(SYS_recvfrom, fd, buf, n, flags, sa, sl)));
}
EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags) {
    return recvfrom(fd, buf, n, flags, NULL, NULL);
}
EXPORT ssize_t recvmsg(int fd, struct msghdr *mh, int flags) {
    if (NET_ON(fd)) return GATED(OP_SCHED_IO, may_block(fd, flags), net_recv(fd, mh, flags));
    return GATED(OP_SCHED_IO, may_block(fd, flags), sys_ret(RS3(SYS_recvmsg, fd, mh, flags)));
}
EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt) {
    if (NET_ON(fd) && cnt >= 0) {
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = (struct iovec *)iov;
        mh.msg_iovlen = (size_t)cnt;
        return GATED(OP_SCHED_IO, may_block(fd, 0), net_recv(fd, &mh, 0));
    }
    RESOLVE(readv);
    return real_readv(fd, iov, cnt);
}
/* An accepted connection's peer is a process of the tree (one outside it never connects
 * at replay): its receives are shaped (TREE_RECV). */
/* Whether an accept found a connection waiting is timing (asyncio accepts until EAGAIN
 * on each wake-up): taped as a pipe read's size is (OP_IO_ACCEPT, since protocol 7); a
 * replay gives the recorded EAGAIN without looking, or waits for the connection. */
static long accept_shaped(int fd, struct sockaddr *sa, socklen_t *sl, int flags) {
    if (!ACTIVE() || !SINCE(7)) return RS4(SYS_accept4, fd, sa, sl, flags);
    tls_t *t = me();
    served_t s;
    int32_t r;
    switch (tape_step(t, CH_IO, OP_IO_ACCEPT, NULL, 0, &s)) {
    case STEP_RECORD:
        r = (int32_t)RS4(SYS_accept4, fd, sa, sl, flags);
        int32_t got = r < 0 ? r : 0;
        rec(t, CH_IO, OP_IO_ACCEPT, &got, 4);
        return r;
    case STEP_LIVE:
        return RS4(SYS_accept4, fd, sa, sl, flags);
    case STEP_SERVED:
        break;
    }
    memcpy(&r, s.p, 4);
    if (s.n < 4 || r < 0) return s.n < 4 ? -EAGAIN : r;
    for (;;) {
        long k = RS4(SYS_accept4, fd, sa, sl, flags);
        if (k == -EAGAIN) { io_wait(fd, POLLIN, POLLIN); continue; }
        if (k != -EINTR) return k;
    }
}

EXPORT int accept4(int fd, struct sockaddr *sa, socklen_t *sl, int flags) {
    int r = (int)GATED(OP_SCHED_IO, may_block(fd, 0), sys_ret(accept_shaped(fd, sa, sl, flags)));
    if (r >= 0) {
        nfd_clear(r);
        pfd_set(r, g_mode && SINCE(7) && sock_type(r) == SOCK_STREAM);
    }
    return r;
}
EXPORT int accept(int fd, struct sockaddr *sa, socklen_t *sl) { return accept4(fd, sa, sl, 0); }

/* ------------------------------------------------------------------ socket calls */

/* OP_NET_CALL: arguments u32 connection | u32 kind | i32 level | i32 name; then i32 rc |
 * u32 n | the n bytes answered (an option's value, an address). Kinds: */
enum { NC_GETSOCKOPT = 1, NC_GETSOCKNAME = 2, NC_GETPEERNAME = 3, NC_SETSOCKOPT = 4,
       NC_SHUTDOWN = 5 };
typedef struct { uint32_t conn, kind; int32_t level, name; } netcall_t;
_Static_assert(sizeof(netcall_t) == 16, "OP_NET_CALL arguments: u32 conn | u32 kind | i32 level | i32 name");

static long net_call_live(int fd, const netcall_t *c, void *val, socklen_t *len, const void *in,
                          socklen_t inlen) {
    switch (c->kind) {
    case NC_GETSOCKOPT: return RS6(SYS_getsockopt, fd, c->level, c->name, val, len, 0);
    case NC_GETSOCKNAME: return RS3(SYS_getsockname, fd, val, len);
    case NC_GETPEERNAME: return RS3(SYS_getpeername, fd, val, len);
    case NC_SETSOCKOPT: return RS6(SYS_setsockopt, fd, c->level, c->name, in, inlen, 0);
    default: return RS2(SYS_shutdown, fd, c->level);
    }
}

static int net_call(int fd, uint32_t kind, int level, int name, void *val, socklen_t *len,
                    const void *in, socklen_t inlen) {
    netcall_t c = {(unsigned)fd < NET_FDS ? g_nconn[fd].conn : 0, kind, level, name};
    if (!NET_ON(fd)) return (int)sys_ret(net_call_live(fd, &c, val, len, in, inlen));
    tls_t *t = me();
    served_t s;
    switch (tape_step(t, CH_NET, OP_NET_CALL, &c, sizeof c, &s)) {
    case STEP_RECORD: {
        if (UNLIKELY(g_nconn[fd].served)) net_live(fd);
        long r = net_call_live(fd, &c, val, len, in, inlen);
        unsigned char out[8 + 256];
        int32_t rc = (int32_t)r;
        uint32_t n = !is_err(r) && len && val ? (uint32_t)*len : 0;
        uint32_t keep = n < 256 ? n : 256;
        memcpy(out, &rc, 4);
        memcpy(out + 4, &keep, 4);
        if (keep) memcpy(out + 8, val, keep);
        rec2(t, CH_NET, OP_NET_CALL, &c, sizeof c, out, 8 + keep);
        return (int)sys_ret(r);
    }
    case STEP_LIVE:
        return (int)sys_ret(net_call_live(fd, &c, val, len, in, inlen));
    case STEP_SERVED:
    default:
        break;
    }
    int32_t rc;
    uint32_t n;
    memcpy(&rc, s.p + sizeof c, 4);
    memcpy(&n, s.p + sizeof c + 4, 4);
    if (rc < 0) { errno = -rc; return -1; }
    if (len && val) {
        memcpy(val, s.p + sizeof c + 8, n < *len ? n : *len);
        *len = n;
    }
    return rc;
}

EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len) {
    return net_call(fd, NC_GETSOCKOPT, level, name, val, len, NULL, 0);
}
EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len) {
    return net_call(fd, NC_SETSOCKOPT, level, name, NULL, NULL, val, len);
}
EXPORT int getsockname(int fd, struct sockaddr *sa, socklen_t *len) {
    return net_call(fd, NC_GETSOCKNAME, 0, 0, sa, len, NULL, 0);
}
EXPORT int getpeername(int fd, struct sockaddr *sa, socklen_t *len) {
    return net_call(fd, NC_GETPEERNAME, 0, 0, sa, len, NULL, 0);
}
EXPORT int shutdown(int fd, int how) {
    return net_call(fd, NC_SHUTDOWN, how, 0, NULL, NULL, NULL, 0);
}

/* ------------------------------------------------------------------ epoll */

/* Which epoll sets hold taped connections, and with what: a set's answers about them
 * are taped (OP_NET_EPOLL) and, at replay, served; the kernel never sees them there. */
typedef struct { int ep, fd; uint32_t events; uint64_t data; } netreg_t;
#define NET_REGS 256
static netreg_t g_nreg[NET_REGS];
static int g_nregs;
static int g_nreg_lock;

static int nreg_find(int ep, int fd) {
    for (int i = 0; i < g_nregs; i++)
        if (g_nreg[i].ep == ep && g_nreg[i].fd == fd) return i;
    return -1;
}

static long nreg_ctl(int ep, int op, int fd, const struct epoll_event *ev) {
    long r = 0;
    spin_lock(&g_nreg_lock);
    int i = nreg_find(ep, fd);
    if (op == EPOLL_CTL_ADD) {
        if (i >= 0) r = -EEXIST;
        else if (g_nregs >= NET_REGS || !ev) r = -ENOSPC;
        else g_nreg[g_nregs++] = (netreg_t){ep, fd, ev->events, ev->data.u64};
    } else if (i < 0) {
        r = -ENOENT;
    } else if (op == EPOLL_CTL_DEL) {
        g_nreg[i] = g_nreg[--g_nregs];
    } else if (ev) {
        g_nreg[i].events = ev->events;
        g_nreg[i].data = ev->data.u64;
    }
    spin_unlock(&g_nreg_lock);
    return r;
}

/* Forget fd (closed): as a taped connection, and as an epoll set. */
static void nreg_drop(int fd) {
    if (!__atomic_load_n(&g_nregs, __ATOMIC_RELAXED)) return;
    spin_lock(&g_nreg_lock);
    for (int i = 0; i < g_nregs;)
        if (g_nreg[i].fd == fd || g_nreg[i].ep == fd) g_nreg[i] = g_nreg[--g_nregs];
        else i++;
    spin_unlock(&g_nreg_lock);
}

static void nfd_clear(int fd) {
    if ((unsigned)fd >= NET_FDS) return;
    if (nfd_is(fd)) __atomic_fetch_and(&g_nfd[fd >> 6], ~(1ULL << (fd & 63)), __ATOMIC_RELAXED);
    nreg_drop(fd);
}

static void nfd_dup(int from, int to) {
    if ((unsigned)to >= NET_FDS || from == to) return;
    nfd_clear(to);
    if (!nfd_is(from)) return;
    g_nconn[to] = g_nconn[from];
    g_nconn[to].ccall[0] = 0; /* (its result: when the first of them is closed) */
    g_nconn[to].held = NULL;
    __atomic_fetch_or(&g_nfd[to >> 6], 1ULL << (to & 63), __ATOMIC_RELAXED);
}

static int nreg_has(int ep) {
    if (!__atomic_load_n(&g_nregs, __ATOMIC_RELAXED)) return 0;
    spin_lock(&g_nreg_lock);
    int yes = 0;
    for (int i = 0; i < g_nregs && !yes; i++) yes = g_nreg[i].ep == ep;
    spin_unlock(&g_nreg_lock);
    return yes;
}

EXPORT int epoll_ctl(int ep, int op, int fd, struct epoll_event *ev) {
    if (!NET_ON(fd)) {
        long r = RS4(SYS_epoll_ctl, ep, op, fd, ev);
        if (!is_err(r) && op == EPOLL_CTL_DEL && UNLIKELY(g_nregs)) nreg_ctl(ep, op, fd, ev);
        return (int)sys_ret(r);
    }
    long r = g_mode == MODE_RECORD ? RS4(SYS_epoll_ctl, ep, op, fd, ev) : 0;
    if (!is_err(r)) {
        long k = nreg_ctl(ep, op, fd, ev);
        if (g_mode != MODE_RECORD) r = k;
    }
    return (int)sys_ret(r);
}

/* OP_NET_EPOLL: arguments i32 timeout_ms | i32 maxevents; then i32 result | u32 n |
 * n x (u32 connection | u32 events | u64 data), every event the wait returned, in order
 * (connection ~0: another fd, named by its data). At replay the connections' events are
 * served, and the others are waited for in the live set (their peers are replayed) and
 * handed back as recorded: which fds a wait found ready is the recording's, not a race. */
typedef struct { uint32_t conn, events; uint64_t data; } netev_t;
_Static_assert(sizeof(netev_t) == 16, "OP_NET_EPOLL event: u32 conn | u32 events | u64 data");
#define NET_EVMAX 256
#define NOT_A_CONN 0xffffffffu

static void go_live(void); /* live.c */

static uint32_t net_epoll_others(int ep, const unsigned char *p, uint32_t n, const sigset_t *ss) {
    uint64_t want[NET_EVMAX];
    uint32_t left = 0;
    for (uint32_t i = 0; i < n && left < NET_EVMAX; i++) {
        netev_t e;
        memcpy(&e, p + 16 * i, 16);
        if (e.conn == NOT_A_CONN) want[left++] = e.data;
    }
    struct epoll_event got[64];
    /* A replay's wait is bounded by quiet time on the clock (no record served by any
     * thread), not by tries: an fd of the set that is ready but not wanted (level-
     * triggered, read later) makes each wait return at once, and 1000 tries then passed
     * in microseconds on a loaded machine, before the wanted fd's writer had run at all
     * (a flaky divergence). */
    int64_t start = mono_ns();
    unsigned seen = __atomic_load_n(&g_served, __ATOMIC_RELAXED);
    for (int tries = 0; left; tries++) {
        unsigned now = __atomic_load_n(&g_served, __ATOMIC_RELAXED);
        if (now != seen) { /* the rest of the process is still replaying: not stuck */
            seen = now;
            start = mono_ns();
        }
        if ((mono_ns() - start) / 1000000 >= NET_OTHERS_WAIT_MS) break; /* a divergence */
        /* a resume that went live meanwhile: the write that makes them ready may be a
         * live thread's, past its prefix (an eventfd the main thread signals after its
         * cut); the recorded events are handed back, the fds read as they are */
        if (UNLIKELY(g_resume) && __atomic_load_n(&g_mode, __ATOMIC_SEQ_CST) == MODE_RECORD)
            return 0;
        /* still waiting after LIVE_WAIT_MS / 10 tries in a resumed prefix: the writer is
         * another thread that can only go on live (parked at its cut, or behind this
         * one's turn): the process goes live now, as live.c's wait would. Tries, as
         * before, not quiet time: going live is the remedy here, and a wait for quiet
         * let this thread keep a turn another needed ("the turn never came", seen once
         * in CI with an MCP server resumed) */
        if (UNLIKELY(g_resume) && tries >= LIVE_WAIT_MS / 10) {
            go_live();
            return 0;
        }
        long r = RS6(SYS_epoll_pwait, ep, got, 64, 10, ss, 8);
        uint32_t before = left;
        for (long i = 0; i < r; i++)
            for (uint32_t j = 0; j < left; j++)
                if (want[j] == got[i].data.u64) { want[j] = want[--left]; break; }
        if (!g_resume && r > 0 && left == before) { /* only fds it does not want */
            struct timespec ts = {0, 1000 * 1000};
            RS2(SYS_nanosleep, &ts, NULL);
        }
    }
    return left;
}

/* Resume, gone live: a served connection in this set connects now (net_live), and the
 * kernel's set gets it as the program registered it (replay never gave it one). */
static void net_epoll_resumed(int ep) {
    for (int i = 0; i < g_nregs; i++)
        if (g_nreg[i].ep == ep && nfd_is(g_nreg[i].fd) && g_nconn[g_nreg[i].fd].served)
            net_live(g_nreg[i].fd);
}

static void nreg_to_kernel(int fd) {
    for (int i = 0; i < g_nregs; i++) {
        netreg_t r = g_nreg[i];
        if (r.fd != fd) continue;
        struct epoll_event e = {.events = r.events, .data = {.u64 = r.data}};
        RS4(SYS_epoll_ctl, r.ep, EPOLL_CTL_ADD, fd, &e);
    }
}

static int net_epoll(int ep, struct epoll_event *ev, int max, int timeout, const sigset_t *ss) {
    tls_t *t = me();
    int32_t args[2] = {timeout, max};
    served_t s;
    step_t step = tape_step(t, CH_NET, OP_NET_EPOLL, args, 8, &s);
    if (step == STEP_RECORD && g_resume) net_epoll_resumed(ep);
    if (step != STEP_SERVED) {
        long r = RS6(SYS_epoll_pwait, ep, ev, max, timeout, ss, 8);
        if (step == STEP_RECORD) {
            static __thread unsigned char out[8 + 16 * NET_EVMAX];
            uint32_t n = 0;
            spin_lock(&g_nreg_lock);
            for (long i = 0; i < r && n < NET_EVMAX; i++) {
                netev_t e = {NOT_A_CONN, ev[i].events, ev[i].data.u64};
                for (int j = 0; j < g_nregs; j++)
                    if (g_nreg[j].ep == ep && g_nreg[j].data == e.data && nfd_is(g_nreg[j].fd)) {
                        e.conn = g_nconn[g_nreg[j].fd].conn;
                        break;
                    }
                memcpy(out + 8 + 16 * n++, &e, 16);
            }
            spin_unlock(&g_nreg_lock);
            int32_t res = (int32_t)r;
            memcpy(out, &res, 4);
            memcpy(out + 4, &n, 4);
            rec2(t, CH_NET, OP_NET_EPOLL, args, 8, out, 8 + 16 * n);
        }
        return (int)sys_ret(r);
    }
    int32_t res;
    uint32_t n;
    memcpy(&res, s.p + 8, 4);
    memcpy(&n, s.p + 12, 4);
    if (res < 0) { errno = -res; return -1; }
    const unsigned char *p = s.p + 16;
    if (net_epoll_others(ep, p, n, ss)) /* its data may name memory of the recorded run */
        net_report(t, -1, "an epoll wait found other fds ready",
                   "they did not become ready live (" NET_OTHERS_WAIT_S " s)");
    int k = 0;
    spin_lock(&g_nreg_lock);
    for (uint32_t i = 0; i < n && k < max; i++) {
        netev_t e;
        memcpy(&e, p + 16 * i, 16);
        ev[k].events = e.events;
        ev[k].data.u64 = e.data;
        if (e.conn != NOT_A_CONN)
            for (int j = 0; j < g_nregs; j++)
                if (g_nreg[j].ep == ep && nfd_is(g_nreg[j].fd) && g_nconn[g_nreg[j].fd].conn == e.conn) {
                    ev[k].data.u64 = g_nreg[j].data;
                    break;
                }
        k++;
    }
    spin_unlock(&g_nreg_lock);
    return k;
}

/* ------------------------------------------------------------------ the rest */

EXPORT int socket(int dom, int type, int proto) {
    long r = RS3(SYS_socket, dom, type, proto);
    if (!is_err(r)) nfd_clear((int)r); /* a number a connection closed unseen had */
    return (int)sys_ret(r);
}

static void net_note_bind(int fd); /* seccomp.c: a bound address is the tree's own */

/* An IPv4/IPv6 bind to port 0: the port the kernel chose is taped (OP_NET_BIND, since
 * protocol 7) and a replay binds that one, so the port a program finds for its server
 * (and passes to it, prints, puts in URLs) is the recorded one. The recorded run's
 * connections may still hold it in TIME_WAIT for a minute: record binds with
 * SO_REUSEADDR on (which changes nothing for a port the kernel picks, and is inherited
 * by the connections the socket accepts), so the replay's bind, with it on too, may
 * take the port again. One another process holds is reported. */
static int bind_port0(const struct sockaddr *sa, socklen_t len) {
    if (!sa || !ACTIVE()) return 0;
    if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
        return ((const struct sockaddr_in *)sa)->sin_port == 0;
    if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))
        return ((const struct sockaddr_in6 *)sa)->sin6_port == 0;
    return 0;
}

static long bind_recorded(int fd, const struct sockaddr *sa, socklen_t len, uint16_t port) {
    struct sockaddr_storage ss;
    memcpy(&ss, sa, len < sizeof ss ? len : sizeof ss);
    if (sa->sa_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = htons(port);
    else ((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
    int on = 1; /* as record left it */
    RS6(SYS_setsockopt, fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on, 0);
    return RS3(SYS_bind, fd, &ss, len);
}

EXPORT int bind(int fd, const struct sockaddr *sa, socklen_t len) {
    if (SINCE(7) && bind_port0(sa, len)) {
        tls_t *t = me();
        uint32_t fam = sa->sa_family;
        served_t s;
        struct { int32_t result; uint32_t port; } b;
        switch (tape_step(t, CH_NET, OP_NET_BIND, &fam, 4, &s)) {
        case STEP_RECORD: {
            int on = 1;
            RS6(SYS_setsockopt, fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on, 0);
            b.result = (int32_t)RS3(SYS_bind, fd, sa, len);
            b.port = 0;
            if (b.result == 0) {
                struct sockaddr_storage got;
                socklen_t gl = sizeof got;
                if (!is_err(RS3(SYS_getsockname, fd, &got, &gl)))
                    b.port = ntohs(got.ss_family == AF_INET
                                       ? ((struct sockaddr_in *)&got)->sin_port
                                       : ((struct sockaddr_in6 *)&got)->sin6_port);
                net_note_bind(fd);
            }
            rec2(t, CH_NET, OP_NET_BIND, &fam, 4, &b, sizeof b);
            return (int)sys_ret(b.result);
        }
        case STEP_SERVED:
            if (s.n >= 4 + sizeof b) {
                memcpy(&b, s.p + 4, sizeof b);
                if (b.result || !b.port) return (int)sys_ret(b.result);
                long r = bind_recorded(fd, sa, len, (uint16_t)b.port);
                if (r == 0) return 0;
                char rec_[48], *q = s_put(rec_, rec_ + 40, "bind to port ");
                *u_put(q, rec_ + 47, b.port) = 0;
                net_report(t, -1, rec_, "the port is in use by a process outside the replay");
            }
            break;
        case STEP_LIVE:
            break;
        }
    }
    long r = RS3(SYS_bind, fd, sa, len);
    if (r == 0 && g_mode == MODE_RECORD) net_note_bind(fd);
    return (int)sys_ret(r);
}
