/* Channel identity, ops 20..29: the host's network interfaces, as the interface ioctls
 * report them (host identity, like gethostname).
 *
 * libuuid's uuid_generate_time takes the node of a time-based UUID from the first
 * interface with a hardware address: socket(AF_INET, SOCK_DGRAM), ioctl(SIOCGIFCONF),
 * then ioctl(SIOCGIFHWADDR) per interface. Those answers are the host's: recorded, and
 * served at replay (the socket itself is a real one: replay refuses only what reaches
 * the network, seccomp.c). Every other ioctl passes straight to the kernel. */

#include <net/if.h>
#include <sys/ioctl.h>

typedef struct {
    uint32_t request;
    uint32_t in;     /* SIOCGIFCONF: ifc_len asked (UINT32_MAX: ifc_buf NULL, a size query) */
    char name[16];   /* the ifreq requests: ifr_name (zeros for SIOCGIFCONF) */
    int32_t rc;
    uint32_t n;      /* bytes that follow: the struct ifreq, or the ifconf buffer */
} netifrec_t;
_Static_assert(sizeof(netifrec_t) == 32 && offsetof(netifrec_t, rc) == 24,
               "OP_NETIF_IOCTL payload: u32 request | u32 in | name[16] | i32 rc | u32 n | bytes[n]");
_Static_assert(sizeof(struct ifreq) == 40, "struct ifreq is 40 bytes");

static int netif_request(unsigned long r) {
    switch (r) {
    case SIOCGIFCONF: case SIOCGIFHWADDR: case SIOCGIFFLAGS: case SIOCGIFADDR:
    case SIOCGIFNETMASK: case SIOCGIFBRDADDR: case SIOCGIFDSTADDR: case SIOCGIFMTU:
    case SIOCGIFINDEX: case SIOCGIFNAME: case SIOCGIFMETRIC: case SIOCGIFTXQLEN:
        return 1;
    }
    return 0;
}

static int netif_ioctl(int fd, unsigned long req, void *arg) {
    tls_t *t = me();
    netifrec_t h;
    memset(&h, 0, sizeof h);
    h.request = (uint32_t)req;
    struct ifconf *ifc = arg;
    struct ifreq *ifr = arg;
    int conf = req == SIOCGIFCONF;
    if (!arg) return (int)sys_ret(RS3(SYS_ioctl, fd, req, arg));
    if (conf) h.in = ifc->ifc_buf ? (uint32_t)ifc->ifc_len : UINT32_MAX;
    else memcpy(h.name, ifr->ifr_name, sizeof h.name);
    served_t s;
    switch (tape_step(t, CH_IDENTITY, OP_NETIF_IOCTL, &h, 24, &s)) {
    case STEP_SERVED:
        if (s.n >= sizeof h) {
            netifrec_t r;
            memcpy(&r, s.p, sizeof r);
            if (r.rc < 0) { errno = -r.rc; return -1; }
            uint32_t got = r.n <= s.n - sizeof h ? r.n : s.n - (uint32_t)sizeof h;
            if (conf) {
                if (ifc->ifc_buf) memcpy(ifc->ifc_buf, s.p + sizeof h, got);
                ifc->ifc_len = (int)(ifc->ifc_buf ? got : r.n);
            } else {
                memcpy(ifr, s.p + sizeof h, got < sizeof *ifr ? got : sizeof *ifr);
            }
            return r.rc;
        }
        return (int)sys_ret(RS3(SYS_ioctl, fd, req, arg));
    case STEP_LIVE:
        return (int)sys_ret(RS3(SYS_ioctl, fd, req, arg));
    case STEP_RECORD:
        break;
    }
    long r = RS3(SYS_ioctl, fd, req, arg);
    h.rc = (int32_t)r;
    const void *out = NULL;
    if (!is_err(r)) {
        if (conf) {
            h.n = ifc->ifc_len > 0 ? (uint32_t)ifc->ifc_len : 0;
            out = ifc->ifc_buf;
            if (!out) h.n = (uint32_t)ifc->ifc_len; /* a size query: no bytes, the size */
        } else {
            h.n = sizeof *ifr;
            out = ifr;
        }
    }
    if (conf && !ifc->ifc_buf && !is_err(r)) {
        /* the size query's answer travels as n with no bytes: replay sets ifc_len */
        rec(t, CH_IDENTITY, OP_NETIF_IOCTL, &h, sizeof h);
    } else {
        rec2(t, CH_IDENTITY, OP_NETIF_IOCTL, &h, sizeof h, out, out ? h.n : 0);
    }
    if (is_err(r)) { errno = (int)-r; return -1; }
    return (int)r;
}

EXPORT int ioctl(int fd, unsigned long req, ...) {
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (LIKELY(!netif_request(req)) || !ACTIVE()) return (int)sys_ret(RS3(SYS_ioctl, fd, req, arg));
    return netif_ioctl(fd, req, arg);
}
