/* stenograph LD_PRELOAD shim: records (or serves back) what a process reads from the
 * world -- clocks, entropy, directory listings, identity, timed-wait outcomes.
 *
 * Rules the shim keeps, and why:
 *  - Hot paths (clock reads, getrandom, readdir, getpid) use no malloc, no stdio and no
 *    lock shared between threads: every thread appends to its own ring (shared with the
 *    recorder, so a killed process loses nothing it taped). A wrapper that
 *    calls back into libc deadlocks in forked children and recurses at start-up (rr's
 *    syscallbuf and libfaketime's issue tracker both document it).
 *  - Kernel calls the shim makes for itself are raw `syscall` instructions, so they are
 *    never intercepted by this very library.
 *  - The shim's own memory lives in a private address range (MAP_FIXED_NOREPLACE hints
 *    far below the mmap base), so recording and replaying leave the program's own heap
 *    and mmap layout identical: with ASLR off, id() and default reprs repeat.
 *  - STENO_* variables are removed from `environ` at start-up and re-added only in the
 *    environments of exec'd / spawned children: record and replay must look the same to
 *    the program.
 * Spec: docs/shim-protocol.md.
 *
 * A unity build: the parts below are one translation unit, included in dependency order
 * (each sees everything above it), so every helper stays `static` and the hot paths
 * inline across parts. setup.py compiles this file only.
 */
#include "shim.h"     /* includes, raw syscalls, global state, per-thread types, gates */
#include "build.c"    /* build replay: served while it fits, else live; drift counts */
#include "core.c"     /* helpers, arena, spin locks, the connection, barriers, serve, reports */
#include "ring.c"     /* record: per-thread rings shared with the recorder, rec / rec2 */
#include "clock.c"    /* channel clock */
#include "entropy.c"  /* channel entropy; fds on /dev/[u]random; open*, fopen* */
#include "sched.c"    /* channel sched: threads take turns; locks, conditions, semaphores */
#include "identity.c" /* channel identity: pids (and the recorded->live map), hostname, uname */
#include "net.c"      /* channel net: connections to peers outside the tree, connect */
#include "neteffect.c" /* their HTTP/1 requests as effects; a resumed connection going live */
#include "netio.c"    /* their sends, receives, socket calls, epoll sets */
#include "io.c"       /* channel io: read/poll shape of own pipes, waitpid(WNOHANG); child waits */
#include "move.c"     /* io: whether a rename crossed file systems; the seal's EXDEV moved by hand */
#include "wait.c"     /* channel wait: sleeps, poll/select/epoll timeouts, deadlines */
#include "dirents.c"  /* channel dirents: listings, scandir */
#include "meta.c"     /* channel meta: the stat family */
#include "threads.c"  /* pthread_create, thread indices, thread-exit flush */
#include "netif.c"    /* identity: the host's network interfaces (SIOCGIF* ioctls) */
#include "overrides.c" /* wrappers that tape nothing: fd marks, temp names, pids handed back */
#include "signals.c"  /* channel signal: handlers run where the recording ran them */
#include "live.c"     /* resume: the recorded prefix, then live */
#include "pathmap.c"  /* sealed without namespaces: paths mapped by a seccomp trap */
#include "seccomp.c"  /* BPF filter: raw getrandom trap, replay network refusal */
#include "init.c"     /* constructor / destructor, environment, final flush */
#include "whole.c"    /* a static or foreign-loader child: recorded whole, served whole */
#include "proc.c"     /* fork, exec*, posix_spawn, system, popen, _exit */
#include "syscall.c"  /* syscall() dispatcher */
#include "pyctl.c"    /* steno_pause / steno_resume / steno_getenv / steno_reentries */
