/* A taped connection's HTTP/1 requests as effects (net.c holds the connections).
 *
 * Record: a request whose method changes things gets its intent made durable before its
 * first byte leaves (MSG_INTENT, which the run's policy may refuse) and its result once
 * its answer is whole (MSG_RESULT). Where a conversation stands is followed under record
 * and replay alike (net_track_send, net_received), so a resume knows whether a process
 * goes live between two requests or inside one. Gone live, a connection the prefix served
 * connects again between requests only, and the recorder decides each request there as
 * it decides any intent: made, refused, or answered by a stand-in (net_standin). */

/* An HTTP request on a taped connection whose method changes things (anything but GET,
 * HEAD, OPTIONS, TRACE) is an effect: before its first byte leaves, the recorder makes a
 * ToolIntent durable (MSG_INTENT: "call id \t METHOD http://host/path"), and when its
 * answer has arrived whole, its ToolResult (MSG_RESULT: "call id \t status line"), with
 * every ring drained first: a point a resume may cut at, after the whole answer. A crash
 * between the two leaves it in doubt, for `status` and a person to see. The call id,
 * <proc>/net/<connection>.<request>, is the same in every run of the prefix. */

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

/* ------------------------------------------------------------------ the conversation */

/* A send: does it begin an HTTP request (1 an effect, -1 read-only, 0 no: the rest of
 * one, or not HTTP)? The connection's phase and request count follow, in every mode. */
static int net_track_send(netconn_t *c, const char *head, size_t k, char *target, size_t cap) {
    if (c->phase == PH_ASKED || c->phase == PH_ANSWERING) return 0;
    int h = http_request(c, head, k, target, cap);
    if (!h) return 0;
    c->phase = PH_ASKED;
    c->reqs++;
    c->ans.no_body = k >= 5 && !memcmp(head, "HEAD ", 5);
    return h;
}

static int hexval(char ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'f'
                                                ? (ch | 0x20) - 'a' + 10 : -1;
}

/* A whole line of the answer's head (CR dropped): 1 if the answer is complete after it. */
static int answer_line(answer_t *a) {
    size_t n = a->linelen < sizeof a->line ? a->linelen : sizeof a->line;
    if (n && a->line[n - 1] == '\r') n--;
    const char *l = a->line;
    switch (a->st) {
    case AN_STATUS: { /* HTTP/1.1 200 OK */
        size_t i = 0;
        while (i < n && l[i] != ' ') i++;
        a->code = 0;
        for (i++; i < n && l[i] >= '0' && l[i] <= '9'; i++) a->code = a->code * 10 + l[i] - '0';
        size_t m = n < sizeof a->status - 1 ? n : sizeof a->status - 1;
        memcpy(a->status, l, m);
        a->status[m] = 0;
        a->st = AN_HEADERS;
        a->chunked = 0;
        a->length = -1;
        return 0;
    }
    case AN_HEADERS:
        if (n == 0) { /* the head's end */
            if (a->code >= 100 && a->code < 200 && a->code != 101) { a->st = AN_STATUS; return 0; }
            if (a->no_body || a->code == 101 || a->code == 204 || a->code == 304) return 1;
            if (a->chunked) { a->st = AN_CHUNK_SIZE; return 0; }
            if (a->length == 0) return 1;
            if (a->length > 0) { a->st = AN_BODY; a->left = (uint64_t)a->length; return 0; }
            a->st = AN_TO_CLOSE;
            return 0;
        }
        if (n > 15 && ci_starts(l, l + n, "content-length:")) {
            int64_t v = 0;
            for (size_t i = 15; i < n; i++)
                if (l[i] >= '0' && l[i] <= '9') v = v * 10 + l[i] - '0';
            a->length = v;
        } else if (n > 18 && ci_starts(l, l + n, "transfer-encoding:")) {
            for (size_t i = 18; i + 7 <= n; i++)
                if (ci_starts(l + i, l + n, "chunked")) a->chunked = 1;
        }
        return 0;
    case AN_CHUNK_SIZE: {
        uint64_t v = 0;
        size_t i = 0;
        while (i < n && l[i] == ' ') i++;
        for (; i < n && hexval(l[i]) >= 0; i++) v = v * 16 + (uint64_t)hexval(l[i]);
        if (v == 0) { a->st = AN_TRAILER; return 0; }
        a->left = v;
        a->st = AN_CHUNK_DATA;
        return 0;
    }
    case AN_CHUNK_END:
        a->st = AN_CHUNK_SIZE;
        return 0;
    case AN_TRAILER:
        return n == 0;
    default:
        return 0;
    }
}

/* Bytes of an answer: 1 once it is whole (bytes after it are not looked at). */
static int answer_feed(answer_t *a, const unsigned char *b, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (a->st == AN_TO_CLOSE) return 0;
        if (a->st == AN_BODY || a->st == AN_CHUNK_DATA) {
            size_t take = (uint64_t)(n - i) < a->left ? n - i : (size_t)a->left;
            a->left -= take;
            i += take;
            if (a->left == 0) {
                if (a->st == AN_BODY) return 1;
                a->st = AN_CHUNK_END;
                a->linelen = 0;
            }
            continue;
        }
        unsigned char ch = b[i++];
        if (ch == '\n') {
            int done = answer_line(a);
            a->linelen = 0;
            if (done) return 1;
        } else {
            if (a->linelen < sizeof a->line) a->line[a->linelen] = (char)ch;
            if (a->linelen < 0xffff) a->linelen++;
        }
    }
    return 0;
}

/* Bytes received on a taped connection (n 0: the peer closed it), in every mode after
 * they are taped: where its answer stands. Record: an effect whose answer is now whole
 * (or cut short by the close) gets its result. */
static void net_received(int fd, const struct iovec *iov, size_t cnt, size_t n) {
    netconn_t *c = &g_nconn[fd];
    if (c->phase == PH_ASKED) {
        c->phase = PH_ANSWERING;
        int nb = c->ans.no_body;
        memset(&c->ans, 0, sizeof c->ans);
        c->ans.no_body = (uint8_t)nb;
        c->ans.length = -1;
    }
    if (c->phase != PH_ANSWERING) return;
    int closed = !n, whole = closed;
    for (size_t i = 0; i < cnt && n && !whole; i++) {
        size_t k = iov[i].iov_len < n ? iov[i].iov_len : n;
        whole = answer_feed(&c->ans, iov[i].iov_base, k);
        n -= k;
    }
    if (!whole) return;
    c->phase = PH_ANSWERED;
    if (!c->call[0] || g_mode != MODE_RECORD || !g_sockpath[0]) return;
    char msg[256];
    char *p = s_put(msg, msg + sizeof msg - 1, c->call);
    p = s_put(p, msg + sizeof msg - 1, "\t");
    p = s_put(p, msg + sizeof msg - 1, c->ans.status[0] ? c->ans.status : "(no answer)");
    if (closed && c->ans.st != AN_TO_CLOSE) p = s_put(p, msg + sizeof msg - 1, " (cut short)");
    c->call[0] = 0;
    barrier_with(MSG_RESULT, msg, (size_t)(p - msg));
}

/* ------------------------------------------------------------------ effects */

/* A stream connection whose first bytes are not an HTTP/1 request (PostgreSQL's startup
 * message, a TLS hello, Redis, SMTP): what it does cannot be read, so the connection
 * itself is the effect, unless the policy names its destination read-only. Its intent
 * (MSG_INTENT "<proc>/net/<conn>.0 \t connect tcp HOST:PORT \t first bytes") before
 * the first byte leaves; its result when it is closed (net_conn_closed). Answers: 1 an
 * effect, 2 not one, 0 refused by the policy (or settled done at a resume). */
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
    if (a == ANS_GO) memcpy(c->ccall, id, sizeof id);
    return a == ANS_GO || a == ANS_SKIP;
}

static void net_unhold(int fd);

static void net_conn_closed(int fd, const char *how) {
    netconn_t *c = &g_nconn[fd];
    if (g_mode != MODE_RECORD || !g_sockpath[0]) return;
    if (c->held) { /* a head never followed by its body: it never left, nor its intent */
        shim_unmap(c->held, HOLD_MAX);
        c->held = NULL;
        c->call[0] = 0;
    }
    if (c->call[0] && c->phase == PH_ANSWERING) /* an answer the close cut short: as it is */
        net_received(fd, NULL, 0, 0);
    if (!c->ccall[0]) return;
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
        if (nfd_is(fd) && (g_nconn[fd].ccall[0] || g_nconn[fd].call[0] || g_nconn[fd].held))
            net_conn_closed(fd, "closed at exit");
}

static int net_standin(int fd, uint16_t port);

/* The intent message of an HTTP request whose first bytes are `b`: "call id \t METHOD url
 * \t the start of its body \t its Idempotency-Key". */
static size_t intent_msg(const netconn_t *c, const char *b, size_t k, const char *target,
                         char *msg, size_t cap) {
    char *p = s_put(msg, msg + cap - 1, c->call);
    p = s_put(p, msg + cap - 1, "\t");
    p = s_put(p, msg + cap - 1, target);
    p = s_put(p, msg + cap - 1, "\t");
    size_t hend = k;
    for (size_t i = 3; i < k; i++) /* what of the body it holds: for a person */
        if (!memcmp(b + i - 3, "\r\n\r\n", 4)) {
            hend = i;
            for (size_t j = i + 1; j < k && j < i + 1 + 160 && p < msg + cap - 1; j++)
                *p++ = b[j] == '\t' || b[j] == '\n' || b[j] == '\r' ? ' ' : b[j];
            break;
        }
    /* its Idempotency-Key, if it carries one: a resume may send it again (the service
     * answers a key it has seen with its first answer) */
    for (size_t i = 0; i + 17 < hend; i++)
        if (b[i] == '\n' && ci_starts(b + i + 1, b + hend, "idempotency-key:")) {
            const char *v = b + i + 17, *e = b + hend;
            while (v < e && *v == ' ') v++;
            p = s_put(p, msg + cap - 1, "\t");
            for (; v < e && *v != '\r' && *v != '\n' && p < msg + cap - 1; v++)
                *p++ = *v == '\t' ? ' ' : *v;
            break;
        }
    return (size_t)(p - msg);
}

/* Ask the recorder about the request `c->call` (MSG_INTENT): 1 send it, 0 not. A resume
 * may answer it with a stand-in's port: the socket is then the stand-in's. */
static int intent_ask(int fd, netconn_t *c, const char *msg, size_t n) {
    char ans[16];
    int an = barrier_ask(MSG_INTENT, msg, n, ans, sizeof ans);
    if (ans[0] == ANS_ANSWERED && an >= 3) { /* settled, with its answer: a stand-in's */
        uint16_t port;
        memcpy(&port, ans + 1, 2);
        c->call[0] = 0;
        return net_standin(fd, port);
    }
    if (ans[0] != ANS_REFUSED) return 1; /* durable: send it */
    c->call[0] = 0; /* the policy said no (stenograph record --policy), or made already */
    return 0;
}

/* A head whose body is sent apart (urllib, Node's fetch) is held back until the body's
 * first send, so the intent a person reads shows what the request pays, and to whom:
 * only a whole head, with a body announced and no `Expect: 100-continue` (the program
 * waits for the service before sending the body then). */
static int head_to_hold(const char *b, size_t k, size_t n) {
    if (n != k || k < 4 || k > HOLD_MAX || memcmp(b + k - 4, "\r\n\r\n", 4)) return 0;
    int body = 0;
    for (size_t i = 0; i + 1 < k; i++) {
        if (b[i] != '\n') continue;
        const char *l = b + i + 1, *e = b + k;
        if (ci_starts(l, e, "expect:")) return 0;
        if (ci_starts(l, e, "transfer-encoding:")) body = 1;
        if (ci_starts(l, e, "content-length:")) {
            const char *v = l + 15;
            while (v < e && (*v == ' ' || *v == '0')) v++;
            body = v < e && *v >= '1' && *v <= '9';
        }
    }
    return body;
}

/* The held head goes out now, its intent first, with the start of `mh`'s bytes (its body)
 * when there are any. 1 if the send after it may go out too. */
static int net_release(int fd, const struct msghdr *mh, size_t n) {
    netconn_t *c = &g_nconn[fd];
    unsigned char *h = c->held;
    size_t hn = c->heldn;
    c->held = NULL;
    c->heldn = 0;
    char b[HOLD_MAX + 256], target[700], msg[1000];
    memcpy(b, h, hn);
    size_t k = hn + (mh ? iov_head(mh->msg_iov, mh->msg_iovlen, n, b + hn, 200) : 0);
    http_request(c, b, k, target, sizeof target);
    int ok = intent_ask(fd, c, msg, intent_msg(c, b, k, target, msg, sizeof msg));
    for (size_t done = 0; ok && done < hn;) {
        long r = RS6(SYS_sendto, fd, h + done, hn - done, MSG_NOSIGNAL, 0, 0);
        if (r == -EINTR) continue;
        if (r == -EAGAIN) {
            struct pollfd pf = {fd, POLLOUT, 0};
            RS3(SYS_poll, &pf, 1, 10000);
            continue;
        }
        if (is_err(r)) ok = 0;
        else done += (size_t)r;
    }
    shim_unmap(h, HOLD_MAX);
    return ok;
}

/* Record: before a send leaves. 1 if it may go out; 2 if it is held back (a head whose
 * body comes next: net_release); 0 if the run's policy refused the effect it begins (or
 * a resume knows it was made, and no answer for it). */
static int net_request(tls_t *t, int fd, const struct msghdr *mh, size_t n) {
    netconn_t *c = &g_nconn[fd];
    (void)t;
    if (c->held) return net_release(fd, mh, n);
    char head[2048], target[700], msg[1000];
    size_t k = iov_head(mh->msg_iov, mh->msg_iovlen, n, head, sizeof head);
    int fresh_conv = c->stream && !c->sends && !c->reqs && !c->ccall[0];
    int h = net_track_send(c, head, k, target, sizeof target);
    if (!g_sockpath[0] || c->standin) return 1; /* no recorder; a stand-in's answer */
    if (!h && fresh_conv && c->phase == PH_IDLE) return net_conn_intent(c, head, k);
    if (h <= 0) return 1; /* read-only, a request's body, or the rest of a conversation */
    char *p = s_put(c->call, c->call + sizeof c->call - 1, g_proc);
    p = s_put(p, c->call + sizeof c->call - 1, "/net/");
    p = u_put(p, c->call + sizeof c->call - 1, c->conn);
    p = s_put(p, c->call + sizeof c->call - 1, ".");
    p = u_put(p, c->call + sizeof c->call - 1, c->reqs);
    *p = 0;
    if (head_to_hold(head, k, n) && (c->held = shim_map(HOLD_MAX, -1)) != NULL) {
        iov_head(mh->msg_iov, mh->msg_iovlen, n, (char *)c->held, HOLD_MAX);
        c->heldn = (uint32_t)n;
        return 2;
    }
    return intent_ask(fd, c, msg, intent_msg(c, head, k, target, msg, sizeof msg));
}

/* Anything but the body's send on a connection whose head is held (a receive, a close,
 * the process's end): the head goes out first, its intent without a body. */
static void net_unhold(int fd) {
    if ((unsigned)fd < NET_FDS && g_nconn[fd].held && !net_release(fd, NULL, 0))
        RS2(SYS_shutdown, fd, SHUT_RDWR);
}

/* Replay of a send: a head the recording held is kept (a resume may go live before its
 * body, and must hold it as record did); the send after it released it. */
static void net_served_send(int fd, uint32_t flags, const unsigned char *b, uint32_t n) {
    netconn_t *c = &g_nconn[fd];
    if (c->held) {
        shim_unmap(c->held, HOLD_MAX);
        c->held = NULL;
    }
    if ((flags & NET_SEND_HELD) && g_resume && n <= HOLD_MAX &&
        (c->held = shim_map(HOLD_MAX, -1)) != NULL) {
        memcpy(c->held, b, n);
        c->heldn = n;
    }
}

/* ------------------------------------------------------------------ resume, gone live */

/* A resumed process that went live goes on with a connection its prefix served: the
 * socket was never connected. Between two HTTP requests (or before its first byte) it
 * connects now (a connect alone changes nothing), and what it sends next is decided as
 * in any recording (net_request): a new request gets its intent, one the log knows is
 * made again only if it may be, or answered by a stand-in with its known answer. Inside
 * a request or its answer, or inside a conversation that is not HTTP, its sends are
 * refused unsent: nothing is ever sent twice (a resume cuts at an intent or after a
 * whole answer, so a process is there only for a call settled done with no answer). */
static void nreg_to_kernel(int fd); /* netio.c */

static void net_live(int fd) {
    netconn_t *c = &g_nconn[fd];
    c->served = 0;
    /* a head the recording held (OP_NET_SEND's held flag): nothing of the request left
     * the host; its body's send releases it with its intent, as at record */
    int between = c->phase == PH_IDLE || c->phase == PH_ANSWERED || c->held;
    if (c->held) {
        char *p = s_put(c->call, c->call + sizeof c->call - 1, g_proc);
        p = s_put(p, c->call + sizeof c->call - 1, "/net/");
        p = u_put(p, c->call + sizeof c->call - 1, c->conn);
        p = s_put(p, c->call + sizeof c->call - 1, ".");
        p = u_put(p, c->call + sizeof c->call - 1, c->reqs);
        *p = 0;
    }
    int conversation = c->sends && !c->reqs; /* begun, and not HTTP */
    if (between && !conversation) {
        long r = RS3(SYS_connect, fd, &c->sa, c->salen);
        if (r == -EINPROGRESS) {
            struct pollfd pf = {fd, POLLOUT, 0};
            RS3(SYS_poll, &pf, 1, 10000);
        }
        c->fresh = 1;
    } else {
        c->refused = 1;
    }
    /* the epoll sets it is in get it now (replay kept it out of the kernel's): connected,
     * it reports its traffic; never connected, its hang-up, so no one waits for ever */
    nreg_to_kernel(fd);
}

static int net_may_send(int fd, const struct msghdr *mh, size_t n) {
    netconn_t *c = &g_nconn[fd];
    if (c->refused) return 0;
    c->fresh = 0;
    if (c->held) return 1; /* the body of a held head: asked with it (net_release) */
    char head[2048], target[700];
    size_t k = iov_head(mh->msg_iov, mh->msg_iovlen, n, head, sizeof head);
    if (http_request(c, head, k, target, sizeof target)) return 1; /* a request: asked */
    return c->stream && !c->sends && !c->reqs; /* a conversation's first bytes: asked */
}

/* Resume: the recorder answers this request itself (a person settled it done with its
 * answer, or the log holds the answer it got): the socket in fd's place is connected to
 * its stand-in on 127.0.0.1, which reads the request and sends that answer. */
static int net_standin(int fd, uint16_t port) {
    long fl = RS2(SYS_fcntl, fd, F_GETFL), fdf = RS2(SYS_fcntl, fd, F_GETFD);
    long ns = RS3(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (is_err(ns)) return 0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    long r;
    do r = RS3(SYS_connect, ns, &a, sizeof a); while (r == -EINTR);
    if (is_err(r)) { RS1(SYS_close, ns); return 0; }
    RS3(SYS_dup3, ns, fd, (!is_err(fdf) && (fdf & FD_CLOEXEC)) ? O_CLOEXEC : 0);
    RS1(SYS_close, ns);
    if (!is_err(fl)) RS3(SYS_fcntl, fd, F_SETFL, fl);
    g_nconn[fd].standin = 1;
    nreg_to_kernel(fd);
    return 1;
}
