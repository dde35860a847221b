/* stenograph shim: wire constants shared by record and replay.
 *
 * The Python side mirrors these numbers (stenograph.recorder.tape, interpose.shim,
 * interpose.pytape; tests/test_shim_constants.py holds them equal); docs/shim-protocol.md
 * is the spec. Bump STENO_PROTOCOL when a layout below changes.
 */
#ifndef STENO_SHIM_H
#define STENO_SHIM_H

#define STENO_PROTOCOL 7 /* 2: sched, meta, signal channels; pid, exit and interface ops; loop ticks
                          * 3: getpid is not taped per call (the procinfo record has it)
                          * 4: the net channel (connections outside the tree)
                          * 5: pipe marks through dup/fcntl and exec; statx via syscall();
                          *    scheduler turns in runs of clock reads (OP_SCHED_SPIN)
                          * 6: node runs with --single-threaded (proc.c, NORMALIZE); every
                          *    epoll wait's ready set is taped (OP_NET_EPOLL)
                          * 7: a connect to the tree's own address is taped (OP_NET_LOCAL), its
                          *    receives and accepts are shaped (OP_IO_READ, OP_IO_ACCEPT),
                          *    the port a bind to port 0 got (OP_NET_BIND), and the HTTP hooks'
                          *    question whether a server is the tree's own (OP_NET_PEER);
                          *    ppoll/pselect as io polls; renames (OP_IO_RENAME) */
/* (the tape's bytes are unchanged by the shared rings below: how records travel to the
 * recorder is not part of what a recording holds) */

#define STENO_MAGIC "STP1" /* first 4 bytes of every message */

/* message types (u16 after the magic) */
#define MSG_DATA 1    /* records: appended as they are (not sent by this shim any more) */
#define MSG_BARRIER 2 /* drain this process's rings, then answer one byte */
#define MSG_EXIT 3    /* the same, as the process ends */
#define MSG_RING 4    /* u64 arena id | i32 pid: this connection's arena; the memfd travels
                       * with it (SCM_RIGHTS) the first time, a reconnect names it by id */
#define MSG_NUDGE 5   /* a ring is half full: drain soon (no answer) */
#define MSG_BIG 6     /* one record too big for a ring: drain, append it, answer one byte */
#define MSG_SYNC 7    /* drain every process's rings, make the log durable, then answer one
                       * byte: a connection outside the tree is on disk before it is used */
#define MSG_INTENT 8  /* "call id \t METHOD url \t body head": an HTTP effect on a taped connection is about
                       * to be sent: drain every ring, append its ToolIntent, sync, answer */
#define MSG_RESULT 9  /* "call id \t status line": its answer is whole (or the connection, an
                       * effect, closed): drain every ring, ToolResult, sync, answer -- a cut */
#define MSG_EXEC 10   /* "L|R call id \0 cwd \0 argv..." (record, and a resume's prefix, R:
                       * replayed): about to exec; drain the process, decide (ANS_*); an
                       * effect's ToolIntent is synced first. MSG_EXIT's body "status N" is
                       * the exit status, its result */

/* The recorder's answers to MSG_INTENT and MSG_EXEC: the first byte, then what it carries */
#define ANS_REFUSED 0  /* the policy refused it (or a resume: settled done, no answer known) */
#define ANS_GO 1       /* make it */
#define ANS_SKIP 2     /* MSG_INTENT: not an effect (a read-only destination); MSG_EXEC: a
                        * person settled the command as done: not run, status 0 */
#define ANS_ANSWERED 3 /* settled with its answer: MSG_INTENT "u16 port": a stand-in on
                        * 127.0.0.1 gives the answer; MSG_EXEC "i32 status | path": not run,
                        * the file's bytes are its stdout (taped as a whole child's) */

/* The shared rings (ring.c; read by stenograph.recorder.rings): one memfd arena per
 * process, mapped by the process and by the recorder, so a record is the recorder's the
 * moment it is written, whatever happens to the process after. Layout, little-endian:
 *   arena header (ARENA_HDR bytes): "STR1" | u32 version | u32 slots in use | i32 pid | u64 id
 *   RING_SLOTS slots of RING_SLOT bytes: a header page, then RING_CAP bytes of records
 *   slot header: u32 used | u32 thread (the stream the records belong to) |
 *                u64 head @RING_OFF_HEAD (bytes ever written: the thread alone stores it) |
 *                u64 tail @RING_OFF_TAIL (bytes ever drained: the recorder alone stores it)
 * A record is complete before head covers it; the thread changes a slot's thread index
 * only while the slot is empty (head == tail). */
#define RING_MAGIC "STR1"
#define RING_VERSION 1
#define ARENA_HDR 4096
#define ARENA_OFF_NSLOTS 8
#define ARENA_OFF_PID 12
#define ARENA_OFF_ID 16
#define RING_SLOTS 1024
#define RING_HDR 4096
#define RING_CAP 1048576 /* a power of two */
#define RING_SLOT 1052672 /* RING_HDR + RING_CAP */
#define RING_OFF_TINDEX 4
#define RING_OFF_HEAD 64
#define RING_OFF_TAIL 128

/* channels (u8) */
#define CH_CLOCK 1
#define CH_ENTROPY 2
#define CH_DIRENTS 3
#define CH_IDENTITY 4
#define CH_WAIT 5
#define CH_IO 6
#define CH_SCHED 7
#define CH_META 8
#define CH_SIGNAL 9
#define CH_NET 10
#define NCH 11

/* clock ops: payload  i32 arg | i32 rc | i64 a | i64 b   (args prefix: 4 bytes) */
#define OP_CLOCK_GETTIME 1 /* arg clock id, a/b = sec/nsec */
#define OP_GETTIMEOFDAY 2  /* a/b = sec/usec */
#define OP_TIME 3          /* a = seconds */
#define OP_TIMESPEC_GET 4  /* arg base, a/b = sec/nsec */
#define OP_CLOCK 5         /* a = clock_t */

/* entropy ops */
#define OP_GETRANDOM 1   /* u32 size | u32 flags | i32 rc | u32 0 | bytes[rc] */
#define OP_GETENTROPY 2  /* u32 size | i32 rc | bytes[size if rc==0] */
#define OP_RANDOM_READ 3 /* u32 size | i32 rc | bytes[rc]   (read() on /dev/[u]random) */
#define OP_GETRANDOM_RAW 4 /* a raw `syscall` instruction for getrandom in the program's own
                            * code, trapped by seccomp (SIGSYS): payload as OP_GETRANDOM */

/* dirents ops */
#define OP_OPENDIR 1 /* u16 pathlen | path | i32 errno | u32 count | count x (u64 ino | u8 type | u16 len | name) */

/* identity ops: payload i32 value unless noted */
#define OP_GETPID 1
#define OP_GETPPID 2
#define OP_GETTID 3
#define OP_GETHOSTNAME 4 /* u32 size | i32 rc | u32 n | bytes[n] */
#define OP_UNAME 5       /* i32 rc | struct utsname (390 bytes) */
#define OP_PROCINFO 6    /* i32 pid | i32 ppid: taped once as each process (or image) starts */
/* pids the program is handed (7..19); replay serves the recorded one and maps it to the
 * live one for the calls that take a pid back (kill, waitpid, sched_*, setpgid...) */
#define OP_FORK 7        /* i32 result (child pid, or -errno) of fork/vfork in the parent */
#define OP_SPAWN 8       /* i32 rc | i32 pid: posix_spawn[p] */
#define OP_WAIT 9        /* i32 pid | i32 options | i32 result (pid or -errno) | i32 status: blocking wait*/
#define OP_WAITID 10     /* i32 idtype | i32 id | i32 options | i32 rc | i32 si_pid | i32 si_code | i32 si_status | i32 si_uid */
#define OP_GETPGID 11    /* i32 pid | i32 result: getpgid, getpgrp (pid 0) */
#define OP_GETSID 12     /* i32 pid | i32 result */
/* host network interfaces (20..29, netif.c) */
#define OP_NETIF_IOCTL 20 /* u32 request | u32 in (SIOCGIFCONF: ifc_len asked, ~0 = size query) |
                           * name[16] (ifreq requests) | i32 rc | u32 n | bytes[n] (the ifreq,
                           * or the ifconf buffer; a size query: n = the size, no bytes) */
#define OP_EXIT 13       /* no payload: the process ends through exit/_exit (record only: a
                          * process whose tape has none was killed, or outlived the run) */

/* wait ops */
#define OP_NANOSLEEP 1       /* i64 sec | i64 nsec | i32 rc | i32 0 | i64 rem sec | i64 rem nsec */
#define OP_CLOCK_NANOSLEEP 2 /* i32 clock | i32 flags | i64 sec | i64 nsec | i32 rc | i32 0 | rem */
#define OP_SLEEP 3           /* u32 seconds | u32 rc */
#define OP_USLEEP 4          /* u32 usec | i32 rc */
#define OP_POLL 5            /* i32 timeout_ms | u32 nfds | i32 timed_out */
#define OP_SELECT 6          /* i32 nfds | i32 0 | i64 timeout_us | i32 timed_out */
#define OP_EPOLL 7           /* i32 timeout_ms | i32 maxevents | i32 timed_out */
#define OP_LOOP_TICK 8       /* an asyncio loop iteration (stenograph.interpose.aioloop): u32 n |
                              * n x (u32 registration | u32 mask) of the program's ready fds */

/* io ops: the shape of I/O on pipes and socketpairs the process made itself. Only sizes
 * and ready sets are taped; the bytes come live from the (replayed) peer, which replay
 * waits for until the recorded shape holds. */
#define OP_IO_READ 1 /* u32 asked | i32 result (bytes, or -errno) */
#define OP_IO_POLL 2 /* i32 timeout_ms | u32 nfds | nfds x i16 events | i32 result | nfds x i16 revents */
#define OP_IO_WAIT 3 /* i32 options | i32 result (0 running, >0 reaped, -errno) | i32 status */
#define OP_IO_ACCEPT 7 /* i32 result (0 a connection, or -errno: EAGAIN...): since protocol 7 */
#define OP_IO_RENAME 8 /* i32 result (0, or -EXDEV: crossed file systems): since protocol 7 */
/* a child the shim cannot see into (static, another loader), recorded whole (whole.c) */
#define OP_WHOLE_EXEC 4 /* argv strings, each with its NUL (checked) */
#define OP_WHOLE_OUT 5  /* u32 fd (1 stdout, 2 stderr) | the bytes, as they came */
#define OP_WHOLE_EXIT 6 /* i32 wait status */

/* sched ops: one record per grant of the baton, on the taking thread's stream:
 * u32 grant (per process, from 0) | i32 outcome of the call the grant ends */
#define OP_SCHED_START 1  /* a new thread's first turn */
#define OP_SCHED_MUTEX 2  /* pthread_mutex_*lock retried: 0 or EAGAIN, ETIMEDOUT */
#define OP_SCHED_COND 3   /* pthread_cond_*wait woke: 0 or ETIMEDOUT */
#define OP_SCHED_SEM 4    /* sem_*wait retried: 0 or EAGAIN, ETIMEDOUT */
#define OP_SCHED_SLEEP 5  /* after a sleep */
#define OP_SCHED_IO 6     /* after a pipe read, poll/select/epoll_wait, recv/accept */
#define OP_SCHED_JOIN 7   /* after pthread_join */
#define OP_SCHED_YIELD 8  /* sched_yield */
#define OP_SCHED_FUTEX 9  /* futex(FUTEX_WAIT*) through syscall(): its result */
#define OP_SCHED_CHILD 10 /* after a blocking wait for a child process */
#define OP_SCHED_SPIN 11  /* after a run of SPIN_RUN clock reads with no turn between */

/* meta ops: file metadata (the stat family). The arguments are checked; replay serves the
 * whole recorded result and reports a live one whose existence, type or size differs as drift */
#define OP_FSTATAT 1 /* i32 dir | i32 flags | u32 pathlen | path | i32 fd | i32 rc | struct stat (144) */
#define OP_STATX 2   /* i32 dir | i32 flags | u32 mask | u32 pathlen | path | i32 fd | i32 rc | struct statx (256) */

/* signal ops: where an asynchronous signal's handler ran (signals.c) */
#define OP_SIG_RUN 1 /* u32 pos (records so far on the thread's other streams) | u32 k (mask
                      * calls since) | i32 sig | u32 flags (1 = ran untaped) | siginfo (128) */

/* net ops: a connection to a peer outside the recorded tree (net.c). Every record but
 * connect's and epoll's starts with u32 connection (numbered per process, in connect
 * order); replay serves them all and opens nothing. */
#define OP_NET_CONNECT 1 /* u16 family | u16 port | u32 n | address[n] (IPv4/IPv6 bytes, unix
                          * name) | i32 result (0 or -errno: EINPROGRESS, ECONNREFUSED...) */
#define OP_NET_SEND 2    /* u32 conn | u32 asked | i32 result | u64 FNV-1a of the bytes taken |
                          * u32 head | u32 0 | the first head (<= 64) of them */
#define OP_NET_RECV 3    /* u32 conn | u32 asked | i32 result | i32 msg_flags | u32 alen |
                          * sender address[alen] | bytes[min(result, asked)] */
#define OP_NET_CALL 4    /* u32 conn | u32 kind | i32 level | i32 name | i32 rc | u32 n | bytes[n]
                          * kind: 1 getsockopt, 2 getsockname, 3 getpeername, 4 setsockopt,
                          * 5 shutdown (level = how) */
#define OP_NET_EPOLL 5   /* i32 timeout_ms | i32 maxevents | i32 result | u32 n | n x (u32 conn
                          * (~0: another fd) | u32 events | u64 data): a wait of an epoll set
                          * holding connections, every event it returned */
#define OP_NET_LOCAL 6   /* OP_NET_CONNECT's address | i32 result | u32 resolved | u32 this
                          * end's port: a connect to
                          * an address the tree bound; it stays live (net.c, local_replay) */
#define OP_NET_BIND 7    /* u32 family | i32 result | u32 port: a bind to port 0 and the port the
                          * kernel chose; replay binds that port (netio.c) */
#define OP_NET_PEER 8    /* u32 port | host[n] | i32 yes: did the tree bind host:port, as the
                          * HTTP hooks asked it (pyctl.c, steno_tree_peer) */

#define DIVERGENCE_EXIT 86

#endif
