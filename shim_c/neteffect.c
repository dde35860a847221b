/* A taped connection's HTTP/1 requests as effects (net.c holds the connections).
 *
 * Record: a request whose method changes things gets its intent made durable before its
 * first byte leaves (MSG_INTENT, which the run's policy may refuse) and its result when
 * its answer begins (MSG_RESULT). Resume, gone live: a connection the prefix served
 * connects again only for a request that may be made again (net_live, net_may_send). */

/* An HTTP request on a taped connection whose method changes things (anything but GET,
 * HEAD, OPTIONS, TRACE) is an effect: before its first byte leaves, the recorder makes a
 * ToolIntent durable (MSG_INTENT: "call id \t METHOD http://host/path"), and when the
 * first bytes of an answer arrive, its ToolResult (MSG_RESULT: "call id \t status line").
 * A crash between the two leaves it in doubt, for `status` and a person to see. The call
 * id, <proc>/net/<connection>.<request>, is the same in every run of the prefix. */

static size_t iov_head(const struct iovec *iov, size_t cnt, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < cnt && k < n && k < cap; i++) {
        size_t c = iov[i].iov_len;
        if (c > n - k) c = n - k;
        if (c > cap - k) c = cap - k;
        memcpy(out + k, iov[i].iov_base, c);
        k += c;
    }
    return k;
}

static int ci_starts(const char *s, const char *end, const char *p) {
    for (; *p; s++, p++)
        if (s >= end || (*s | 0x20) != (*p | 0x20)) return 0;
    return 1;
}

/* 1: an HTTP request that is an effect, its target in `target`; -1: a read-only one;
 * 0: not the start of an HTTP/1 request. */
static int http_request(const netconn_t *c, const char *b, size_t k, char *target, size_t cap) {
    const char *end = b + k, *m = b;
    while (m < end && m - b < 16 && *m >= 'A' && *m <= 'Z') m++;
    if (m == b || m >= end || *m != ' ') return 0;
    const char *path = m + 1, *sp = path;
    while (sp < end && *sp != ' ' && *sp != '\r') sp++;
    if (sp >= end || *sp != ' ' || !ci_starts(sp + 1, end, "HTTP/1.")) return 0;
    size_t ml = (size_t)(m - b);
    static const char *const RO[] = {"GET", "HEAD", "OPTIONS", "TRACE"};
    for (size_t i = 0; i < sizeof RO / sizeof *RO; i++)
        if (s_len(RO[i]) == ml && !memcmp(b, RO[i], ml)) return -1;
    const char *host = NULL, *hend = NULL;
    for (const char *q = sp; q + 7 < end; q++)
        if (q[0] == '\n' && ci_starts(q + 1, end, "host:")) {
            host = q + 6;
            while (host < end && *host == ' ') host++;
            hend = host;
            while (hend < end && *hend != '\r' && *hend != '\n') hend++;
            break;
        }
    char *p = target, *tend = target + cap - 1;
    for (const char *q = b; q < m && p < tend; q++) *p++ = *q;
    p = s_put(p, tend, " ");
    if (*path == '/') {
        p = s_put(p, tend, "http://");
        if (host) {
            for (const char *q = host; q < hend && p < tend; q++) *p++ = *q;
        } else { /* the connection's address ("tcp 127.0.0.1:8080" less its kind) */
            const char *n = c->name;
            while (*n && *n != ' ') n++;
            p = s_put(p, tend, *n ? n + 1 : c->name);
        }
    }
    for (const char *q = path; q < sp && p < tend; q++) *p++ = *q;
    *p = 0;
    return 1;
}

/* A stream connection whose first bytes are not an HTTP/1 request (PostgreSQL's startup
 * message, a TLS hello, Redis, SMTP): what it does cannot be read, so the connection
 * itself is the effect, unless the policy names its destination read-only. Its intent
 * (MSG_INTENT "<proc>/net/<conn>.0 \t connect tcp HOST:PORT \t first bytes") before
 * the first byte leaves; its result when it is closed (net_conn_closed). Answers: 1 an
 * effect, 2 not one, 0 refused by the policy. */
static int net_conn_intent(netconn_t *c, const char *head, size_t k) {
    char id[64], msg[512];
    char *p = s_put(id, id + sizeof id - 1, g_proc);
    p = s_put(p, id + sizeof id - 1, "/net/");
    p = u_put(p, id + sizeof id - 1, c->conn);
    p = s_put(p, id + sizeof id - 1, ".0");
    *p = 0;
    p = s_put(msg, msg + sizeof msg - 1, id);
    p = s_put(p, msg + sizeof msg - 1, "\tconnect ");
    p = s_put(p, msg + sizeof msg - 1, c->name);
    p = s_put(p, msg + sizeof msg - 1, "\t");
    for (size_t i = 0; i < k && i < 120 && p < msg + sizeof msg - 1; i++)
        *p++ = head[i] >= 32 && head[i] < 127 ? head[i] : '.';
    int a = barrier_with(MSG_INTENT, msg, (size_t)(p - msg));
    if (a == 1) memcpy(c->ccall, id, sizeof id);
    return a != 0;
}

static void net_conn_closed(int fd, const char *how) {
    netconn_t *c = &g_nconn[fd];
    if (!c->ccall[0] || g_mode != MODE_RECORD || !g_sockpath[0]) return;
    char msg[128];
    char *p = s_put(msg, msg + sizeof msg - 1, c->ccall);
    p = s_put(p, msg + sizeof msg - 1, "\t");
    p = s_put(p, msg + sizeof msg - 1, how);
    c->ccall[0] = 0;
    barrier_with(MSG_RESULT, msg, (size_t)(p - msg));
}

/* The process ends: each connection that is an effect and still open ends with it. */
static void net_conns_end(void) {
    for (int fd = 0; fd < NET_FDS; fd++)
        if (nfd_is(fd) && g_nconn[fd].ccall[0]) net_conn_closed(fd, "closed at exit");
}

/* 1 if the send may go out; 0 if the run's policy refused the effect it begins. */
static int net_request(tls_t *t, int fd, const struct msghdr *mh, size_t n) {
    netconn_t *c = &g_nconn[fd];
    (void)t;
    if (c->phase == 1 || !g_sockpath[0]) return 1; /* the rest of a request, or no recorder */
    char head[2048], target[700], msg[1000];
    size_t k = iov_head(mh->msg_iov, mh->msg_iovlen, n, head, sizeof head);
    int h = http_request(c, head, k, target, sizeof target);
    if (!h && c->stream && !c->sends && !c->reqs && !c->ccall[0])
        return net_conn_intent(c, head, k);
    if (!h) return 1; /* a request's body, or the rest of a conversation */
    c->phase = 1;
    c->reqs++;
    if (h < 0) return 1;
    char *p = s_put(c->call, c->call + sizeof c->call - 1, g_proc);
    p = s_put(p, c->call + sizeof c->call - 1, "/net/");
    p = u_put(p, c->call + sizeof c->call - 1, c->conn);
    p = s_put(p, c->call + sizeof c->call - 1, ".");
    p = u_put(p, c->call + sizeof c->call - 1, c->reqs);
    *p = 0;
    p = s_put(msg, msg + sizeof msg - 1, c->call);
    p = s_put(p, msg + sizeof msg - 1, "\t");
    p = s_put(p, msg + sizeof msg - 1, target);
    p = s_put(p, msg + sizeof msg - 1, "\t");
    size_t hend = k;
    for (size_t i = 3; i < k; i++) /* what of the body this send holds: for a person */
        if (!memcmp(head + i - 3, "\r\n\r\n", 4)) {
            hend = i;
            for (size_t j = i + 1; j < k && j < i + 1 + 160 && p < msg + sizeof msg - 1; j++)
                *p++ = head[j] == '\t' || head[j] == '\n' || head[j] == '\r' ? ' ' : head[j];
            break;
        }
    /* its Idempotency-Key, if it carries one: a resume may send it again (the service
     * answers a key it has seen with its first answer) */
    for (size_t i = 0; i + 17 < hend; i++)
        if (head[i] == '\n' && ci_starts(head + i + 1, head + hend, "idempotency-key:")) {
            const char *v = head + i + 17, *e = head + hend;
            while (v < e && *v == ' ') v++;
            p = s_put(p, msg + sizeof msg - 1, "\t");
            for (; v < e && *v != '\r' && *v != '\n' && p < msg + sizeof msg - 1; v++)
                *p++ = *v == '\t' ? ' ' : *v;
            break;
        }
    if (barrier_with(MSG_INTENT, msg, (size_t)(p - msg))) return 1; /* durable: send it */
    c->call[0] = 0; /* the policy said no (stenograph record --policy) */
    return 0;
}

/* A resumed process that went live goes on with a connection its prefix served: the
 * socket was never connected. If nothing was sent on it yet, it connects now (a connect
 * alone changes nothing), and its first request is let out only if it may be made
 * again: a read-only one, or an effect a person settled as not done (TAPE/net-redo
 * lists those); any other is refused unsent, as is anything on a connection that was
 * mid-conversation when the prefix ended. Nothing is ever sent twice. */
static void nreg_to_kernel(int fd); /* netio.c */

static void net_live(int fd) {
    netconn_t *c = &g_nconn[fd];
    c->served = 0;
    if (!c->sends && !c->phase) { /* (mid-conversation: its sends are refused) */
        long r = RS3(SYS_connect, fd, &c->sa, c->salen);
        if (r == -EINPROGRESS) {
            struct pollfd pf = {fd, POLLOUT, 0};
            RS3(SYS_poll, &pf, 1, 10000);
        }
        c->fresh = 1;
    }
    /* the epoll sets it is in get it now (replay kept it out of the kernel's): connected,
     * it reports its traffic; never connected, its hang-up, so no one waits for ever */
    nreg_to_kernel(fd);
}

static int net_may_send(int fd, const struct msghdr *mh, size_t n) {
    netconn_t *c = &g_nconn[fd];
    if (!c->fresh) return 0;
    c->fresh = 0;
    char head[2048], target[700];
    size_t k = iov_head(mh->msg_iov, mh->msg_iovlen, n, head, sizeof head);
    int h = http_request(c, head, k, target, sizeof target);
    if (h < 0) return 1; /* read-only: yes */
    if (!h && (!c->stream || c->sends || c->reqs)) return 0; /* the rest of a conversation */
    /* an effect (a request, or a connection that is one) a person settled as not done */
    char id[80], list[16384], path[TAPE_PATH];
    char *p = s_put(id, id + sizeof id - 2, g_proc);
    p = s_put(p, id + sizeof id - 2, "/net/");
    p = u_put(p, id + sizeof id - 2, c->conn);
    p = s_put(p, id + sizeof id - 2, ".");
    p = u_put(p, id + sizeof id - 2, h ? c->reqs + 1 : 0);
    *p++ = '\n';
    *p = 0;
    tape_path(path, 0, "net-redo");
    long got = tape_file_get(path, list, sizeof list - 1);
    if (got <= 0) return 0;
    list[got] = 0;
    for (char *l = list; *l;) {
        if (starts(l, id)) return 1;
        while (*l && *l++ != '\n') {}
    }
    return 0;
}

static void net_answered(tls_t *t, int fd, const struct iovec *iov, size_t cnt, size_t n) {
    netconn_t *c = &g_nconn[fd];
    (void)t;
    if (c->phase == 1) c->phase = 2;
    if (!c->call[0]) return;
    char head[128], msg[256];
    size_t k = iov_head(iov, cnt, n, head, sizeof head);
    size_t line = 0;
    while (line < k && head[line] != '\r' && head[line] != '\n') line++;
    char *p = s_put(msg, msg + sizeof msg - 1, c->call);
    p = s_put(p, msg + sizeof msg - 1, "\t");
    for (size_t i = 0; i < line && p < msg + sizeof msg - 1; i++) *p++ = head[i];
    c->call[0] = 0;
    barrier_with(MSG_RESULT, msg, (size_t)(p - msg));
}
