/* Exports besides the wrapped symbols: the controls the Python hooks reach through ctypes
 * (stenograph.interpose.pytape), and the reentry counter. */

/* Pause the tape for this thread (nestable): the Python hooks call these around work that
 * replay will not repeat -- their own I/O, and in record mode the real network or tool
 * call -- so none of it lands on the tape. Children spawned while paused run off the
 * tape and take no spawn number. */
EXPORT void steno_pause(void) { T.guard++; }
EXPORT void steno_resume(void) { if (T.guard > 0) T.guard--; }

/* How many wrapped calls of this process ran live and untaped because a signal handler
 * made them while its thread was inside the shim (see reentered). */
/* The Python tape ran out where the program asks for more: the end of a killed
 * recording is handled as the C streams' end is (await_kill); returns when the process's
 * recording has an exit record, i.e. the end is a divergence. */
EXPORT void steno_tape_ended(void) {
    if (g_mode == MODE_REPLAY) await_kill();
}

EXPORT unsigned long steno_reentries(void) { return __atomic_load_n(&g_reentries, __ATOMIC_RELAXED); }

/* The STENO_* settings the shim hid from the environment; STENO_PROC follows forks. */
EXPORT const char *steno_getenv(const char *name) {
    if (!name || !g_mode) return NULL;
    if (!strcmp(name, "STENO_MODE")) return g_mode == MODE_RECORD ? "record" : "replay";
    if (!strcmp(name, "STENO_PROC")) return g_proc;
    if (!strcmp(name, "STENO_TAPE")) return g_mode == MODE_REPLAY || g_resume ? g_tape : NULL;
    if (!strcmp(name, "STENO_SOCK")) return g_mode == MODE_RECORD || g_resume ? g_sockpath : NULL;
    if (!strcmp(name, "STENO_LENIENT")) return g_lenient ? "1" : NULL;
    size_t n = s_len(name);
    for (size_t at = 0; at < g_extra_len; at += s_len(g_extra + at) + 1) {
        const char *e = g_extra + at;
        if (!strncmp(e, name, n) && e[n] == '=') return e + n + 1;
    }
    return NULL;
}

/* Python-level records on this thread's wait stream (an asyncio loop's iterations,
 * stenograph.interpose.aioloop): they are written and served even while the tape is
 * paused, since the code that makes them pauses the tape around the real wait. */
EXPORT int steno_tape_put(int op, const void *p, uint32_t n) {
    if (g_mode != MODE_RECORD || op != OP_LOOP_TICK) return -1;
    rec(me(), CH_WAIT, op, p, n);
    return 0;
}

/* Replay: the next record of this thread's wait stream, which must be `op`; its payload
 * is copied to out (at most cap bytes). Returns its length, or -1 (lenient, nothing). */
EXPORT int steno_tape_get(int op, void *out, uint32_t cap) {
    if (g_mode != MODE_REPLAY || op != OP_LOOP_TICK) return -1;
    served_t s;
    if (tape_step(me(), CH_WAIT, op, NULL, 0, &s) != STEP_SERVED) return -1;
    memcpy(out, s.p, s.n < cap ? s.n : cap);
    return (int)s.n;
}

/* The next wait this thread makes (epoll_wait, poll, select), though paused, releases the
 * baton around its real call and takes a turn after it, as every wrapped wait does: the
 * asyncio loop's real select under record runs paused (its outcome is taped as a loop
 * tick instead). Set right before the call, so no Python code runs between. */
EXPORT void steno_gate_next(void) { T.gate_next = 1; }

/* Replay: release the baton, block until every fd shows (at least) its events (or hangs
 * up), take the turn after: an asyncio loop tick's recorded readiness, in one wait. */
EXPORT int steno_wait_fds(const int *fds, const short *events, int n) {
    int gated = !T.sched_off && g_mode && UNLIKELY(S.on) && !S.broken;
    if (gated) sched_release(&T);
    int peer = peer_wait_in();
    struct pollfd pf[64];
    int left = n < 64 ? n : 64;
    for (int i = 0; i < left; i++) pf[i] = (struct pollfd){fds[i], events[i], 0};
    while (left > 0) {
        long r = RS3(SYS_poll, pf, left, -1);
        if (is_err(r) && r != -EINTR) break;
        for (int i = 0; i < left;) {
            short want = pf[i].events, got = pf[i].revents;
            if ((got & want) == want || (got & (POLLHUP | POLLERR | POLLNVAL))) pf[i] = pf[--left];
            else i++;
        }
    }
    peer_wait_out(peer);
    if (gated) sched_take(&T, OP_SCHED_IO, 0);
    return 0;
}

/* Is `host`:`port` a server of the recorded tree (an address a process of the tree bound:
 * seccomp.c, net_tree)? The HTTP hooks ask before they intercept a request: one to the
 * tree's own server is the program's conversation with itself and goes to the socket
 * level, live at both ends. The answer is taped (OP_NET_PEER), since whether the server
 * had bound yet is timing: replay hooks the same requests record did. `host` is an IP
 * literal or "localhost" (both loopbacks); anything else is not the tree's. */
EXPORT int steno_tree_peer(const char *host, int port) {
    if (!g_mode || !host || port <= 0 || port > 65535) return 0;
    struct {
        uint32_t port;
        char host[64];
    } a = {(uint32_t)port, {0}};
    size_t hn = s_len(host);
    if (hn >= sizeof a.host) return 0;
    memcpy(a.host, host, hn);
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
    int v4 = inet_pton(AF_INET, host, &in.sin_addr) == 1;
    int v6 = !v4 && inet_pton(AF_INET6, host, &in6.sin6_addr) == 1;
    if (!v4 && !v6 && strcmp(host, "localhost")) return 0;
    if (!v4 && !v6) {
        in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        in6.sin6_addr = in6addr_loopback;
    }
    int32_t yes = 0;
    uint32_t an = 4 + (uint32_t)hn;
    served_t s;
    step_t step = ACTIVE() && SINCE(7) ? tape_step(me(), CH_NET, OP_NET_PEER, &a, an, &s)
                                       : STEP_LIVE;
    if (step == STEP_SERVED) {
        if (s.n >= an + 4) memcpy(&yes, s.p + an, 4);
        return yes;
    }
    yes = (!v6 && net_tree((const struct sockaddr *)&in, sizeof in, SOCK_STREAM)) ||
          (!v4 && net_tree((const struct sockaddr *)&in6, sizeof in6, SOCK_STREAM));
    if (step == STEP_RECORD) rec2(me(), CH_NET, OP_NET_PEER, &a, an, &yes, 4);
    return yes;
}
