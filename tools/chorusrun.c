/*
 * chorusrun: start the local ranks of a Chorus (or NCCL) job.
 *
 *   chorusrun -n 4 prog args...                     4 ranks on this host
 *   chorusrun -n 4 --nnodes 2 --node-rank K --master-addr A --master-port P prog args...
 *
 * Each rank is a child process with the variables torchrun sets: RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT (chorusCommInitFromEnv reads them), and
 * NCCL_COMM_ID=MASTER_ADDR:port unless CHORUS_COMM_ID or NCCL_COMM_ID is already set, on a port
 * of its own (MASTER_PORT stays free for torch's store: a second free port on one node,
 * MASTER_PORT + 1 across nodes or with --master-port). With
 * NCCL_COMM_ID, ncclGetUniqueId returns the same fixed id in every rank and rank 0 hosts the
 * rendezvous on that address (NCCL's semantics), so a plain NCCL program that calls
 * ncclGetUniqueId in every rank works unchanged. On one node the master port is a free port picked
 * here below the ephemeral port range (see pick_free_port); across nodes every node must be given
 * the same --master-addr/--master-port.
 * The ranks also get CHORUS_JOB_SECRET, a random secret made here (unless CHORUS_JOB_SECRET or
 * CHORUS_JOB_SECRET_FILE is set already): only processes that know it can join the job at that
 * fixed address. Ranks on other nodes cannot receive a secret made here, so with --nnodes > 1 the
 * user must give every node the same one (or set CHORUS_COMM_ID_INSECURE=1 to run without).
 *
 * Each rank runs in its own process group with stdin from /dev/null. SIGINT/SIGTERM/SIGHUP are
 * forwarded to every rank. When a rank exits non-zero or dies from a signal, chorusrun prints one
 * line naming the rank and how it ended, sends SIGTERM to the others, SIGKILL after a grace period,
 * and exits non-zero (the rank's exit code, or 128 + signal). It exits 0 only when all ranks did.
 * A second SIGINT/SIGTERM kills the ranks at once (SIGKILL).
 * --tag-output pipes the ranks' stdout and stderr through chorusrun and prefixes every line with
 * "[rank] ". --bind auto (the default; --bind none turns it off) gives each local rank an equal,
 * contiguous share of the CPUs chorusrun may use: on a busy machine unbound ranks get packed onto
 * one core. When the local ranks outnumber the CPUs, consecutive ranks share a CPU (4 ranks on 2:
 * 0 and 1 on the first, 2 and 3 on the second), so ring neighbours hand chunks over on one core.
 * Unbound, the kernel sometimes put 3 of 4 ranks on one core of the 2-core KVM guest for a whole
 * run: the lone rank's sched_yield found nothing to switch to while 3 ranks shared the other core
 * (8 B all-reduce 4.0-4.6 us in a quarter of the runs instead of 2.8-3.5). Measured with
 * all_reduce_perf -b 8 -e 4M -f 64 -n 300, 3 rounds, unbound / round-robin / contiguous: 4 ranks
 * 32 KiB 25-28 / 25 / 21 us, 2 MiB 405-457 / 405-414 / 333-345 us; 3 ranks 32 KiB 9-12.5
 * / 12.4-12.8 / 9.1-10.5 us; 8 ranks and 5 ranks at 8 MiB 6.0-8.2 ms contiguous, within the others'
 * spread.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transport.h"

typedef struct {
    pid_t pid;
    int rank; /* global rank */
    int done; /* reaped */
    int status;
    int out_fd, err_fd; /* --tag-output pipes, -1 otherwise */
    char *out_buf, *err_buf;
    size_t out_len, err_len;
} rank_proc_t;

static int g_sigpipe[2] = {-1, -1};
static volatile sig_atomic_t g_forward_sig;
static volatile sig_atomic_t g_nsignals; /* a second SIGINT/SIGTERM kills the ranks at once */

static void on_signal(int sig) {
    int e = errno;
    if (sig != SIGCHLD) {
        g_forward_sig = sig;
        g_nsignals++;
    }
    char c = (char)sig;
    if (write(g_sigpipe[1], &c, 1) < 0) { /* pipe full: a wakeup is pending anyway */
    }
    errno = e;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: chorusrun -n N [options] [--] program [args...]\n"
        "\n"
        "Start N local ranks of a Chorus/NCCL job. Each rank gets RANK, WORLD_SIZE, LOCAL_RANK,\n"
        "LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT and NCCL_COMM_ID=addr:port2\n"
        "(unless CHORUS_COMM_ID/NCCL_COMM_ID is set): rank 0 hosts the rendezvous there.\n"
        "On one node the ranks also get a random CHORUS_JOB_SECRET (unless CHORUS_JOB_SECRET\n"
        "or CHORUS_JOB_SECRET_FILE is set); with --nnodes > 1 set one of them on every node.\n"
        "\n"
        "options:\n"
        "  -n, --nproc-per-node N   ranks on this node (required)\n"
        "  --nnodes N               number of nodes (default 1); ranks = N * n\n"
        "  --node-rank K            this node's index: it runs ranks K*n .. K*n+n-1\n"
        "  --master-addr A          host of rank 0 (default 127.0.0.1; required if nnodes>1)\n"
        "  --master-port P          port of the rendezvous (default: a free port on one node,\n"
        "                           29500 on several)\n"
        "  --tag-output             prefix every output line with [rank]\n"
        "  --bind auto|none         auto (default): give each local rank its own share of the\n"
        "                           CPUs; more ranks than CPUs: consecutive ranks share a CPU\n"
        "  --grace S                seconds between SIGTERM and SIGKILL when stopping (default 5)\n"
        "  -h, --help               this text\n"
        "\n"
        "If a rank exits non-zero or is killed, the others are stopped and chorusrun exits\n"
        "non-zero after one line naming the rank. SIGINT/SIGTERM are forwarded to the ranks.\n");
}

/* A fresh job secret: 32 random bytes (getrandom) as 64 hex digits. -1 when no entropy source
 * answers: a guessable secret would be worse than a clear failure. */
static int make_job_secret(char *out, size_t len) {
    unsigned char raw[32];
    size_t got = 0;
    if (len < 2 * sizeof(raw) + 1) return -1;
    while (got < sizeof(raw)) {
        ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

static int env_set(const char *name) {
    const char *v = getenv(name);
    return v != NULL && *v != '\0';
}

static int parse_int_arg(const char *s, const char *opt, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi) {
        fprintf(stderr, "chorusrun: invalid value '%s' for %s (expected %d..%d)\n", s, opt, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* The lowest port the kernel hands out for bind(port 0) and connect()
 * (net.ipv4.ip_local_port_range); 32768 when it cannot be read. */
static int ephemeral_low(void) {
    int low = 32768, high = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
        fclose(f);
    }
    return low;
}

/* A socket bound to the wildcard address on port, without SO_REUSEADDR: it binds only when no
 * socket of any address or family (listening, connected or in TIME_WAIT) uses the port. IPv6
 * dual-stack covers both families; IPv4 alone where the host has no IPv6. -1 if it is in use. */
static int bind_wildcard(int port) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        int zero = 0;
        struct sockaddr_in6 a6;
        memset(&a6, 0, sizeof(a6));
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t)port);
        if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) == 0 &&
            bind(fd, (struct sockaddr *)&a6, sizeof(a6)) == 0)
            return fd;
        int e = errno;
        close(fd);
        if (e != EAFNOSUPPORT && e != EADDRNOTAVAIL) return -1;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a4;
    memset(&a4, 0, sizeof(a4));
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&a4, sizeof(a4)) == 0) return fd;
    close(fd);
    return -1;
}

/* A free TCP port for a rendezvous on this node (torch's TCPStore on MASTER_PORT, Chorus's root).
 *
 * The port is drawn at random below the ephemeral range, so no bind to port 0 and no connect() of
 * another process is ever handed it. A port from bind(127.0.0.1:0) was not safe: another test's
 * socket bound to the host's other address (eth0's) with port 0 could be given the same port,
 * since the two addresses do not overlap, and torch's store, which binds the wildcard address,
 * then failed with "Address already in use".
 *
 * The port is checked free on every address by a wildcard bind without SO_REUSEADDR, and that
 * socket then stays bound, with SO_REUSEADDR set and never listening, until chorusrun exits:
 * rank 0's store and Chorus's root, which bind with SO_REUSEADDR, can still listen on the port,
 * while the checking bind of another chorusrun started at the same moment fails on it. */
static int pick_free_port(void) {
    int high = ephemeral_low() - 1;
    int low = high - 16383;
    if (low < 1024) low = 1024;
    if (high < low + 255) return -1;
    int span = high - low + 1;
    for (int attempt = 0; attempt < 256; attempt++) {
        uint32_t r = 0;
        if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r)) r = (uint32_t)rand();
        int port = low + (int)(r % (uint32_t)span);
        int fd = bind_wildcard(port);
        if (fd < 0) continue;
        int one = 1;
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
            close(fd);
            continue;
        }
        return port; /* fd is held, on purpose, until exit (see above) */
    }
    return -1;
}

static void setenv_int(const char *name, int v) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%d", v);
    setenv(name, buf, 1);
}

static const char *signame(int sig, char *buf, size_t len) {
    const char *abbr = sigabbrev_np(sig);
    if (abbr)
        snprintf(buf, len, "SIG%s", abbr);
    else
        snprintf(buf, len, "%d", sig);
    return buf;
}

static void describe(int status, char *buf, size_t len) {
    char sb[32];
    if (WIFEXITED(status))
        snprintf(buf, len, "exit %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "signal %s%s", signame(WTERMSIG(status), sb, sizeof(sb)),
                 WCOREDUMP(status) ? " (core dumped)" : "");
    else
        snprintf(buf, len, "status 0x%x", status);
}

/* CPUs of this process, split into nlocal contiguous shares; share `local` goes to the caller.
 * More ranks than CPUs: ranks local*ncpu/nlocal share CPU number local*ncpu/nlocal, so consecutive
 * ranks (ring neighbours) share one. */
static void bind_auto(int local, int nlocal) {
    cpu_set_t all, mine;
    if (sched_getaffinity(0, sizeof(all), &all) != 0) return;
    int cpus[CPU_SETSIZE], ncpu = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) cpus[ncpu++] = c;
    if (ncpu == 0) return;
    CPU_ZERO(&mine);
    if (nlocal >= ncpu) {
        CPU_SET(cpus[(int)((long)local * ncpu / nlocal)], &mine);
    } else {
        int lo = (int)((long)local * ncpu / nlocal), hi = (int)((long)(local + 1) * ncpu / nlocal);
        for (int i = lo; i < hi; i++)
            CPU_SET(cpus[i], &mine);
    }
    (void)sched_setaffinity(0, sizeof(mine), &mine);
}

/* Copy complete lines from a rank's pipe to `out`, each prefixed with [rank]. flush: also the
 * last partial line (at EOF). Returns 0 at EOF or error, 1 while open. */
static int pump(int *fd, char **buf, size_t *len, int rank, FILE *out, int flush) {
    int open_ = 1;
    if (*fd >= 0) {
        char tmp[4096];
        ssize_t n = read(*fd, tmp, sizeof(tmp));
        if (n > 0) {
            char *nb = realloc(*buf, *len + (size_t)n);
            if (nb) {
                memcpy(nb + *len, tmp, (size_t)n);
                *buf = nb;
                *len += (size_t)n;
            }
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            close(*fd);
            *fd = -1;
            open_ = 0;
            flush = 1;
        }
    } else {
        open_ = 0;
    }
    size_t start = 0;
    for (size_t i = 0; i < *len; i++) {
        if ((*buf)[i] != '\n') continue;
        fprintf(out, "[%d] %.*s\n", rank, (int)(i - start), *buf + start);
        start = i + 1;
    }
    if (flush && start < *len) {
        fprintf(out, "[%d] %.*s\n", rank, (int)(*len - start), *buf + start);
        start = *len;
    }
    if (start > 0) {
        memmove(*buf, *buf + start, *len - start);
        *len -= start;
    }
    fflush(out);
    return open_;
}

static void signal_all(rank_proc_t *p, int n, int sig) {
    for (int i = 0; i < n; i++) {
        if (p[i].pid <= 0 || p[i].done) continue;
        /* The rank's process group: also reaches what the rank started (sh -c, ...). */
        if (kill(-p[i].pid, sig) != 0) kill(p[i].pid, sig);
        /* A stopped rank (SIGSTOP, a debugger) acts on SIGTERM only once it runs again. */
        if (sig == SIGTERM && kill(-p[i].pid, SIGCONT) != 0) kill(p[i].pid, SIGCONT);
    }
}

int main(int argc, char **argv) {
    int nlocal = -1, nnodes = 1, node_rank = 0, master_port = -1, tag = 0, bind = -1;
    double grace = 5.0;
    const char *master_addr = NULL;
    enum { O_NNODES = 256, O_NODE_RANK, O_ADDR, O_PORT, O_TAG, O_BIND, O_GRACE };
    static const struct option opts[] = {
        {"nproc-per-node", required_argument, NULL, 'n'},
        {"np", required_argument, NULL, 'n'},
        {"nnodes", required_argument, NULL, O_NNODES},
        {"node-rank", required_argument, NULL, O_NODE_RANK},
        {"master-addr", required_argument, NULL, O_ADDR},
        {"master-port", required_argument, NULL, O_PORT},
        {"tag-output", no_argument, NULL, O_TAG},
        {"bind", required_argument, NULL, O_BIND},
        {"grace", required_argument, NULL, O_GRACE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    /* '+': stop at the first non-option, which is the program. */
    while ((c = getopt_long(argc, argv, "+n:h", opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (parse_int_arg(optarg, "-n", 1, 4096, &nlocal)) return 2;
            break;
        case O_NNODES:
            if (parse_int_arg(optarg, "--nnodes", 1, 1 << 20, &nnodes)) return 2;
            break;
        case O_NODE_RANK:
            if (parse_int_arg(optarg, "--node-rank", 0, 1 << 20, &node_rank)) return 2;
            break;
        case O_ADDR:
            master_addr = optarg;
            break;
        case O_PORT:
            if (parse_int_arg(optarg, "--master-port", 1, 65535, &master_port)) return 2;
            break;
        case O_TAG:
            tag = 1;
            break;
        case O_BIND:
            if (strcmp(optarg, "auto") == 0)
                bind = 1;
            else if (strcmp(optarg, "none") == 0)
                bind = 0;
            else {
                fprintf(stderr, "chorusrun: invalid value '%s' for --bind (auto or none)\n",
                        optarg);
                return 2;
            }
            break;
        case O_GRACE: {
            char *end;
            grace = strtod(optarg, &end);
            if (*optarg == '\0' || *end != '\0' || grace < 0) {
                fprintf(stderr, "chorusrun: invalid value '%s' for --grace\n", optarg);
                return 2;
            }
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (nlocal < 0) {
        fprintf(stderr, "chorusrun: -n N (ranks on this node) is required\n");
        usage(stderr);
        return 2;
    }
    if (optind >= argc) {
        fprintf(stderr, "chorusrun: no program given\n");
        usage(stderr);
        return 2;
    }
    if (node_rank >= nnodes) {
        fprintf(stderr, "chorusrun: --node-rank %d is not below --nnodes %d\n", node_rank, nnodes);
        return 2;
    }
    if (nnodes > 1 && master_addr == NULL) {
        fprintf(stderr, "chorusrun: --master-addr is required with --nnodes %d\n", nnodes);
        return 2;
    }
    if (master_addr == NULL) master_addr = "127.0.0.1";
    /* Chorus's root gets a port of its own: torch's TCPStore (init_process_group) binds
     * MASTER_PORT in rank 0, so the two cannot share it. On one node both are free ports picked
     * here; otherwise the root port is MASTER_PORT + 1, which every node computes alike. */
    int root_port = -1;
    if (master_port < 0) {
        master_port = nnodes > 1 ? 29500 : pick_free_port();
        if (master_port >= 0 && nnodes == 1) root_port = pick_free_port();
        if (master_port < 0 || (nnodes == 1 && root_port < 0)) {
            fprintf(stderr, "chorusrun: cannot find a free port on %s\n", master_addr);
            return 1;
        }
    }
    if (root_port < 0) {
        if (master_port >= 65535) {
            fprintf(stderr, "chorusrun: --master-port %d leaves no port above it for Chorus's "
                            "root (it uses MASTER_PORT + 1)\n", master_port);
            return 2;
        }
        root_port = master_port + 1;
    }
    long world = (long)nnodes * nlocal;
    if (world > 1 << 24) {
        fprintf(stderr, "chorusrun: %d nodes x %d ranks is too many\n", nnodes, nlocal);
        return 2;
    }

    /* Variables common to every rank. */
    char comm_id[300];
    if (strchr(master_addr, ':') && master_addr[0] != '[')
        snprintf(comm_id, sizeof(comm_id), "[%s]:%d", master_addr, root_port);
    else
        snprintf(comm_id, sizeof(comm_id), "%s:%d", master_addr, root_port);
    setenv("MASTER_ADDR", master_addr, 1);
    setenv_int("MASTER_PORT", master_port);
    setenv_int("WORLD_SIZE", (int)world);
    setenv_int("LOCAL_WORLD_SIZE", nlocal);
    setenv_int("NODE_RANK", node_rank);
    setenv_int("GROUP_RANK", node_rank);
    if (getenv("CHORUS_COMM_ID") == NULL && getenv("NCCL_COMM_ID") == NULL)
        setenv("NCCL_COMM_ID", comm_id, 1);
    /* The job secret: without it any local process that knows the port could join the job. */
    if (!env_set("CHORUS_JOB_SECRET") && !env_set("CHORUS_JOB_SECRET_FILE")) {
        const char *insecure = getenv("CHORUS_COMM_ID_INSECURE");
        if (nnodes > 1 && !(insecure && strcmp(insecure, "1") == 0)) {
            fprintf(stderr,
                    "chorusrun: with --nnodes %d the ranks on other nodes cannot receive a job "
                    "secret made here: give every node's chorusrun the same "
                    "CHORUS_JOB_SECRET (e.g. the output of 'openssl rand -hex 32') or "
                    "CHORUS_JOB_SECRET_FILE=<a mode 0600 file present on every node>. "
                    "(CHORUS_COMM_ID_INSECURE=1 runs without a secret: any process that can "
                    "reach the master port could then join the job.)\n",
                    nnodes);
            return 2;
        }
        if (nnodes == 1) {
            char secret[80];
            if (make_job_secret(secret, sizeof(secret)) != 0) {
                fprintf(stderr,
                        "chorusrun: getrandom failed (%s): cannot make a job secret; "
                        "set CHORUS_JOB_SECRET yourself\n",
                        strerror(errno));
                return 1;
            }
            setenv("CHORUS_JOB_SECRET", secret, 1);
            explicit_bzero(secret, sizeof(secret));
        }
    }

    if (pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        perror("chorusrun: pipe");
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    rank_proc_t *p = calloc(nlocal, sizeof(*p));
    if (!p) {
        fprintf(stderr, "chorusrun: out of memory\n");
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    int started = 0, failed_rank = -1, failed_status = 0, exit_code = 0;
    for (int i = 0; i < nlocal; i++) {
        p[i].rank = node_rank * nlocal + i;
        p[i].out_fd = p[i].err_fd = -1;
        int po[2] = {-1, -1}, pe[2] = {-1, -1};
        if (tag && (pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0)) {
            perror("chorusrun: pipe");
            exit_code = 1;
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("chorusrun: fork");
            exit_code = 1;
            break;
        }
        if (pid == 0) {
            setpgid(0, 0);
            struct sigaction dfl;
            memset(&dfl, 0, sizeof(dfl));
            dfl.sa_handler = SIG_DFL;
            sigaction(SIGCHLD, &dfl, NULL);
            sigaction(SIGINT, &dfl, NULL);
            sigaction(SIGTERM, &dfl, NULL);
            sigaction(SIGHUP, &dfl, NULL);
            signal(SIGPIPE, SIG_DFL);
            int devnull = open("/dev/null", O_RDONLY);
            if (devnull >= 0) {
                dup2(devnull, 0);
                close(devnull);
            }
            if (tag) {
                dup2(po[1], 1);
                dup2(pe[1], 2);
            }
            setenv_int("RANK", p[i].rank);
            setenv_int("LOCAL_RANK", i);
            if (bind != 0) bind_auto(i, nlocal);
            execvp(argv[optind], argv + optind);
            fprintf(stderr, "chorusrun: rank %d: cannot run '%s': %s\n", p[i].rank, argv[optind],
                    strerror(errno));
            _exit(127);
        }
        setpgid(pid, pid); /* also here, so that signal_all works even before the child runs */
        p[i].pid = pid;
        started++;
        if (tag) {
            close(po[1]);
            close(pe[1]);
            p[i].out_fd = po[0];
            p[i].err_fd = pe[0];
            fcntl(po[0], F_SETFL, O_NONBLOCK);
            fcntl(pe[0], F_SETFL, O_NONBLOCK);
        }
    }

    int alive = started, stopping = exit_code != 0, forwarded = 0, hard_kill = 0;
    double kill_at = stopping ? now_s() + grace : 0, last_exit_at = 0;
    if (stopping) signal_all(p, nlocal, SIGTERM);
    struct pollfd *pfd = calloc(1 + 2 * (size_t)nlocal, sizeof(*pfd));
    int *pmap = calloc(1 + 2 * (size_t)nlocal, sizeof(int));
    if (!pfd || !pmap) {
        fprintf(stderr, "chorusrun: out of memory\n");
        signal_all(p, nlocal, SIGKILL);
        return 1;
    }
    for (;;) {
        /* Reap. */
        for (;;) {
            int st;
            pid_t pid = waitpid(-1, &st, WNOHANG);
            if (pid <= 0) break;
            for (int i = 0; i < nlocal; i++) {
                if (p[i].pid != pid || p[i].done) continue;
                p[i].done = 1;
                p[i].status = st;
                alive--;
                last_exit_at = now_s();
                int bad = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
                if (bad && !stopping) {
                    char how[64];
                    describe(st, how, sizeof(how));
                    fprintf(stderr,
                            "chorusrun: rank %d (local rank %d, pid %d) failed: %s; stopping "
                            "the other %d rank%s\n",
                            p[i].rank, i, (int)pid, how, alive, alive == 1 ? "" : "s");
                    fflush(stderr);
                    failed_rank = p[i].rank;
                    failed_status = st;
                    stopping = 1;
                    kill_at = now_s() + grace;
                    signal_all(p, nlocal, SIGTERM);
                }
            }
        }
        int sig = g_forward_sig;
        if (g_nsignals >= 2 && !hard_kill && alive > 0) {
            fprintf(stderr, "chorusrun: second signal; killing %d rank%s\n", alive,
                    alive == 1 ? "" : "s");
            fflush(stderr);
            hard_kill = 1;
            stopping = 1;
            kill_at = 0; /* SIGKILL below */
        }
        if (sig && sig != forwarded) {
            char sb[32];
            fprintf(stderr, "chorusrun: got %s; forwarding it to %d rank%s\n",
                    signame(sig, sb, sizeof(sb)), alive, alive == 1 ? "" : "s");
            fflush(stderr);
            forwarded = sig;
            signal_all(p, nlocal, sig);
            if (!stopping) {
                stopping = 1;
                kill_at = now_s() + grace;
            }
            if (exit_code == 0) exit_code = 128 + sig;
        }
        int open_pipes = 0;
        for (int i = 0; i < nlocal; i++)
            open_pipes += (p[i].out_fd >= 0) + (p[i].err_fd >= 0);
        /* Done when all ranks are reaped and their output drained (grandchildren may keep a pipe
         * open: give them one second, then stop reading). */
        if (alive == 0 && (open_pipes == 0 || now_s() > last_exit_at + 1.0)) break;
        if (stopping && alive > 0 && now_s() > kill_at) {
            signal_all(p, nlocal, SIGKILL);
            kill_at = now_s() + 3600;
        }
        int n = 0;
        pfd[n] = (struct pollfd){g_sigpipe[0], POLLIN, 0};
        pmap[n++] = -1;
        for (int i = 0; i < nlocal; i++) {
            if (p[i].out_fd >= 0) {
                pfd[n] = (struct pollfd){p[i].out_fd, POLLIN, 0};
                pmap[n++] = 2 * i;
            }
            if (p[i].err_fd >= 0) {
                pfd[n] = (struct pollfd){p[i].err_fd, POLLIN, 0};
                pmap[n++] = 2 * i + 1;
            }
        }
        int rc = poll(pfd, n, 100);
        if (rc < 0 && errno != EINTR) break;
        if (rc <= 0) continue;
        if (pfd[0].revents) {
            char drain[64];
            while (read(g_sigpipe[0], drain, sizeof(drain)) > 0) {
            }
        }
        for (int j = 1; j < n; j++) {
            if (!pfd[j].revents) continue;
            rank_proc_t *r = &p[pmap[j] / 2];
            if (pmap[j] % 2 == 0)
                pump(&r->out_fd, &r->out_buf, &r->out_len, r->rank, stdout, 0);
            else
                pump(&r->err_fd, &r->err_buf, &r->err_len, r->rank, stderr, 0);
        }
    }
    for (int i = 0; i < nlocal; i++) {
        /* Whatever is left (partial last lines). */
        if (p[i].out_len || p[i].out_fd >= 0)
            pump(&p[i].out_fd, &p[i].out_buf, &p[i].out_len, p[i].rank, stdout, 1);
        if (p[i].err_len || p[i].err_fd >= 0)
            pump(&p[i].err_fd, &p[i].err_buf, &p[i].err_len, p[i].rank, stderr, 1);
        if (p[i].out_fd >= 0) close(p[i].out_fd);
        if (p[i].err_fd >= 0) close(p[i].err_fd);
        free(p[i].out_buf);
        free(p[i].err_buf);
    }
    if (failed_rank >= 0) {
        if (WIFEXITED(failed_status))
            exit_code = WEXITSTATUS(failed_status);
        else if (WIFSIGNALED(failed_status))
            exit_code = 128 + WTERMSIG(failed_status);
        else
            exit_code = 1;
    }
    /* Ranks killed while they set up shared-memory connections can leave a segment name behind
     * (its creator died before the peer mapped and unlinked it): now that no rank runs, remove
     * the names whose creator is gone. */
    int swept = shm_sweep_orphans();
    if (swept > 0)
        fprintf(stderr, "chorusrun: removed %d shared-memory segment%s left in /dev/shm by ranks "
                        "that did not finish connection setup\n",
                swept, swept > 1 ? "s" : "");
    /* A rank that failed only after a forwarded signal still makes the run fail. */
    if (exit_code == 0) {
        for (int i = 0; i < started; i++)
            if (!(WIFEXITED(p[i].status) && WEXITSTATUS(p[i].status) == 0)) exit_code = 1;
    }
    free(pfd);
    free(pmap);
    free(p);
    return exit_code;
}
