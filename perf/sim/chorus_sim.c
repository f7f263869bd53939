/*
 * chorus_sim: predicted all-reduce times of Chorus's algorithms on a modelled network, and the
 * tuner's choice (sim.h, sim.c).
 *
 *   chorus_sim [-n RANKS[,RANKS...]] [-L RANKS_PER_HOST] [-b MIN] [-e MAX] [-f FACTOR]
 *              [--shm ALPHA_US/GBPS] [--net ALPHA_US/GBPS] [--ib] [--nic-rx GBPS]
 *              [--nic-burst BYTES[/PEAK_GBPS]]
 *              [--leaf HOSTS/UPLINK_GBPS] [--cores C] [--wake US/C] [--threads] [--channels N] [--slot BYTES]
 *              [--nslots N] [--p2p-nslots N] [--ring-chunk BYTES] [--lag N] [-a ALGOS]
 *              [--events N] [--no-symmetry] [-M] [-v] [--markdown]
 *
 * Per rank count and size: the simulated time (us) of each algorithm that runs there, the
 * fastest of them, and what the tuner picks (with its reason under -v). -M adds the cost model's
 * closed-form time of each. The defaults are the cost model's link table (CHORUS_COST_MODEL
 * applies), the network class TCP unless --ib.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static void usage(FILE *f) {
    fprintf(f, "usage: chorus_sim [options]\n"
               "  -n RANKS[,RANKS...]   rank counts (default 16)\n"
               "  -L N                  ranks per host (default 8; the rank count when larger)\n"
               "  -b MIN -e MAX -f F    sizes in bytes (K, M, G suffixes; default 64K..4M, x4)\n"
               "  --shm A/G             shared memory: A us per step, G GB/s per rank\n"
               "  --net A/G             between hosts: A us per hop, G GB/s per host NIC\n"
               "  --ib                  the network is RDMA for the tuner (default TCP)\n"
               "  --nic-rx G            GB/s of a NIC's receiving side (default: the same)\n"
               "  --nic-burst B[/P]     a token bucket of B bytes on each host's sending side\n"
               "                        (tc tbf): P GB/s (default --nic-rx's) until it is\n"
               "                        empty; ops then run in a loop, the buckets carried\n"
               "  --leaf H/G            H hosts per leaf switch, G GB/s per leaf uplink\n"
               "  --cores C             cores per host (more ranks than cores slow shm steps)\n"
               "  --wake US/C           the test bed: the job's ranks share C cores; with\n"
               "                        more ranks, a rank that waited for its input\n"
               "                        sleeps, and its step runs US after one of the C\n"
               "                        cores takes its wake-up (ring, tree, rd; default off)\n"
               "  --threads             one host's ranks are threads of one process\n"
               "  --channels N          rings (default as the topology makes them)\n"
               "  --slot BYTES          slot size (default NCCL_BUFFSIZE / CHORUS_NSLOTS)\n"
               "  --nslots N            slots per connection (default CHORUS_NSLOTS)\n"
               "  --p2p-nslots N        slots per point-to-point connection, the tree's (default\n"
               "                        as connect: CHORUS_P2P_NSLOTS, 2 from 9 ranks)\n"
               "  --ring-chunk BYTES    the ring's chunk (default a slot's payload)\n"
               "  --lag N               tree and hier: pieces (columns) a tree connection's chunks\n"
               "                        up may run ahead of its chunks down (-1: twice the\n"
               "                        tree's depth; 0: piece order; default CHORUS_TREE_LAG)\n"
               "  -a ALGOS              algorithms, comma separated (ring,tree,hier,rd,oneshot)\n"
               "  --events N            simulated messages per run before extrapolating\n"
               "  --no-symmetry         simulate every rank of the ring (not one host's)\n"
               "  -M                    also print the cost model's closed-form times\n"
               "  -v                    the tuner's reason for each choice\n"
               "  --markdown            a markdown table\n");
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    double m = 1;
    if (*end == 'K' || *end == 'k')
        m = 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        m = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g')
        m = 1073741824.0, end++;
    if (*end != 0) return -1;
    *out = (size_t)(v * m);
    return 0;
}

static int parse_pair(const char *s, double *a, double *b) {
    char *end;
    *a = strtod(s, &end);
    if (end == s || *end != '/') return -1;
    const char *t = end + 1;
    *b = strtod(t, &end);
    if (end == t || *end != 0) return -1;
    return 0;
}

static void fmt_bytes(size_t b, char *buf, size_t len) {
    if (b >= (1u << 30) && b % (1u << 30) == 0)
        snprintf(buf, len, "%zu GiB", b >> 30);
    else if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(buf, len, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(buf, len, "%zu KiB", b >> 10);
    else
        snprintf(buf, len, "%zu B", b);
}

static void fmt_us(double us, char *buf, size_t len) {
    if (us >= 1e6)
        snprintf(buf, len, "%.3g s", us / 1e6);
    else if (us >= 1e3)
        snprintf(buf, len, "%.3g ms", us / 1e3);
    else
        snprintf(buf, len, "%.3g us", us);
}

int main(int argc, char **argv) {
    sim_net_t net;
    memset(&net, 0, sizeof(net));
    int ib = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--ib") == 0) ib = 1;
    net.net_class = ib;
    sim_net_defaults(&net);
    const char *nlist = "16";
    int L = 8, model = 0, verbose = 0, markdown = 0;
    size_t minb = 65536, maxb = 4u << 20;
    double factor = 4;
    int want[SIM_NALGOS] = {1, 1, 1, 1, 1};
    enum {
        O_SHM = 256,
        O_NET,
        O_IB,
        O_RX,
        O_LEAF,
        O_CORES,
        O_THREADS,
        O_CH,
        O_SLOT,
        O_NSLOTS,
        O_EVENTS,
        O_MD,
        O_NOSYM,
        O_RCHUNK,
        O_LAG,
        O_P2P,
        O_BURST,
        O_WAKE
    };
    static const struct option opts[] = {{"shm", 1, 0, O_SHM},
                                         {"net", 1, 0, O_NET},
                                         {"ib", 0, 0, O_IB},
                                         {"nic-rx", 1, 0, O_RX},
                                         {"nic-burst", 1, 0, O_BURST},
                                         {"leaf", 1, 0, O_LEAF},
                                         {"cores", 1, 0, O_CORES},
                                         {"wake", 1, 0, O_WAKE},
                                         {"threads", 0, 0, O_THREADS},
                                         {"channels", 1, 0, O_CH},
                                         {"slot", 1, 0, O_SLOT},
                                         {"nslots", 1, 0, O_NSLOTS},
                                         {"p2p-nslots", 1, 0, O_P2P},
                                         {"events", 1, 0, O_EVENTS},
                                         {"markdown", 0, 0, O_MD},
                                         {"no-symmetry", 0, 0, O_NOSYM},
                                         {"ring-chunk", 1, 0, O_RCHUNK},
                                         {"lag", 1, 0, O_LAG},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "n:L:b:e:f:a:Mvh", opts, NULL)) != -1) {
        double a, g;
        size_t z;
        switch (c) {
        case 'n':
            nlist = optarg;
            break;
        case 'L':
            L = atoi(optarg);
            break;
        case 'b':
            if (parse_size(optarg, &minb)) goto bad;
            break;
        case 'e':
            if (parse_size(optarg, &maxb)) goto bad;
            break;
        case 'f':
            factor = atof(optarg);
            break;
        case 'a': {
            memset(want, 0, sizeof(want));
            char *copy = strdup(optarg), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                const int id = sim_algo_parse(t);
                if (id < 0) {
                    fprintf(stderr, "chorus_sim: unknown algorithm '%s'\n", t);
                    free(copy);
                    return 2;
                }
                want[id] = 1;
            }
            free(copy);
            break;
        }
        case 'M':
            model = 1;
            break;
        case 'v':
            verbose = 1;
            break;
        case O_SHM:
            if (parse_pair(optarg, &a, &g)) goto bad;
            net.shm_alpha_us = a;
            net.shm_gbps = g;
            break;
        case O_NET:
            if (parse_pair(optarg, &a, &g)) goto bad;
            net.net_alpha_us = a;
            net.nic_gbps = g;
            break;
        case O_IB:
            break;
        case O_RX:
            net.nic_rx_gbps = atof(optarg);
            break;
        case O_BURST: {
            char *slash = strchr(optarg, '/');
            if (slash) *slash = 0;
            const int bad_size = parse_size(optarg, &z);
            if (slash) *slash = '/';
            if (bad_size || z == 0) goto bad;
            net.nic_burst = z;
            if (slash) {
                char *end;
                net.nic_peak = strtod(slash + 1, &end);
                if (end == slash + 1 || *end != 0 || !(net.nic_peak > 0)) goto bad;
            }
            break;
        }
        case O_LEAF:
            if (parse_pair(optarg, &a, &g)) goto bad;
            net.leaf_hosts = (int)a;
            net.uplink_gbps = g;
            break;
        case O_CORES:
            net.cores = atoi(optarg);
            break;
        case O_WAKE:
            if (parse_pair(optarg, &a, &g) || !(a > 0) || !(g >= 1)) goto bad;
            net.wake_us = a;
            net.wake_cores = (int)g;
            break;
        case O_THREADS:
            net.threads = 1;
            break;
        case O_CH:
            net.nchannels = atoi(optarg);
            break;
        case O_SLOT:
            if (parse_size(optarg, &z)) goto bad;
            net.slot_bytes = z;
            break;
        case O_NSLOTS:
            net.nslots = atoi(optarg);
            break;
        case O_P2P:
            net.p2p_nslots = atoi(optarg);
            if (net.p2p_nslots < 1) goto bad;
            break;
        case O_EVENTS:
            net.max_events = atol(optarg);
            break;
        case O_MD:
            markdown = 1;
            break;
        case O_NOSYM:
            net.no_symmetry = 1;
            break;
        case O_RCHUNK:
            if (parse_size(optarg, &z)) goto bad;
            net.ring_chunk = z;
            break;
        case O_LAG:
            net.tree_lag = atoi(optarg);
            if (net.tree_lag < -1) goto bad;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "chorus_sim: bad value '%s'\n", optarg);
        return 2;
    }
    if (net.nic_burst > 0 && net.nic_peak == 0) net.nic_peak = net.nic_rx_gbps;
    if (factor <= 1 || minb > maxb || L < 1) {
        usage(stderr);
        return 2;
    }
    int status = 0;
    char *copy = strdup(nlist), *save = NULL;
    int first = 1;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        const int n = atoi(t);
        net.nranks = n;
        net.host_ranks = L < n ? L : n;
        if (n < 1 || n % net.host_ranks != 0) {
            fprintf(stderr, "chorus_sim: %d ranks do not make hosts of %d\n", n, net.host_ranks);
            status = 2;
            continue;
        }
        const int hosts = n / net.host_ranks;
        if (!markdown) {
            printf("# %d ranks = %d host%s x %d; shm %.3g us/step %.3g GB/s per rank%s", n, hosts,
                   hosts > 1 ? "s" : "", net.host_ranks, net.shm_alpha_us, net.shm_gbps,
                   net.threads ? " (threads)" : "");
            if (net.cores > 0) printf(", %d cores per host", net.cores);
            if (net.wake_cores > 0)
                printf(", all ranks on %d cores, %.3g us a wake-up", net.wake_cores, net.wake_us);
            if (hosts > 1) {
                printf("; net %.3g us/hop, NIC %.3g GB/s per host (%s)", net.net_alpha_us,
                       net.nic_gbps, ib ? "rdma" : "tcp");
                if (net.nic_rx_gbps > 0) printf(", rx %.3g GB/s", net.nic_rx_gbps);
                if (net.nic_burst > 0)
                    printf(", burst %zu B at %.3g GB/s", net.nic_burst, net.nic_peak);
                if (net.leaf_hosts > 0)
                    printf(", leaves of %d hosts, uplink %.3g GB/s", net.leaf_hosts,
                           net.uplink_gbps);
            }
            printf("\n# us per all-reduce (float); ~ extrapolated from the first pipeline units;"
                   " - does not run\n");
            printf("%12s", "bytes");
            for (int a = 0; a < SIM_NALGOS; a++)
                if (want[a]) printf(" %11s", sim_algo_name(a));
            printf("  %-8s %-8s%s\n", "best", "tuner", model ? "  (model: same columns)" : "");
        } else if (first) {
            printf("| ranks | hosts | bytes |");
            for (int a = 0; a < SIM_NALGOS; a++)
                if (want[a]) printf(" %s |", sim_algo_name(a));
            printf(" best | tuner |\n|---|---|---|");
            for (int a = 0; a < SIM_NALGOS; a++)
                if (want[a]) printf("---|");
            printf("---|---|\n");
        }
        first = 0;
        for (size_t b = minb;;) {
            double us[SIM_NALGOS];
            int best = -1;
            char cell[SIM_NALGOS][24];
            for (int a = 0; a < SIM_NALGOS; a++) {
                us[a] = NAN;
                snprintf(cell[a], sizeof(cell[a]), "-");
                if (!want[a] || !sim_algo_applies(&net, a, b)) continue;
                sim_result_t r;
                char err[160];
                if (sim_run(&net, a, b, &r, err, sizeof(err)) != 0) {
                    fprintf(stderr, "chorus_sim: %s\n", err);
                    status = 1;
                    continue;
                }
                us[a] = r.us;
                const char *mark = r.simulated < r.units ? "~" : "";
                if (markdown) {
                    char u[16];
                    fmt_us(r.us, u, sizeof(u));
                    snprintf(cell[a], sizeof(cell[a]), "%s%s", mark, u);
                } else {
                    snprintf(cell[a], sizeof(cell[a]), "%s%.1f", mark, r.us);
                }
                if (best < 0 || r.us < us[best]) best = a;
            }
            const char *tname, *why;
            const int tuned = sim_tuner_choice(&net, b, &tname, &why);
            char tcell[64];
            if (tuned >= 0 && !isnan(us[tuned]) && best >= 0 && tuned != best)
                snprintf(tcell, sizeof(tcell), "%s (+%.0f%%)", tname,
                         100.0 * (us[tuned] / us[best] - 1));
            else
                snprintf(tcell, sizeof(tcell), "%s", tname);
            char bs[24];
            fmt_bytes(b, bs, sizeof(bs));
            if (markdown) {
                printf("| %d | %d | %s |", n, hosts, bs);
                for (int a = 0; a < SIM_NALGOS; a++)
                    if (want[a]) printf(" %s |", cell[a]);
                printf(" %s | %s |\n", best >= 0 ? sim_algo_name(best) : "-", tcell);
            } else {
                printf("%12zu", b);
                for (int a = 0; a < SIM_NALGOS; a++)
                    if (want[a]) printf(" %11s", cell[a]);
                printf("  %-8s %s", best >= 0 ? sim_algo_name(best) : "-", tcell);
                if (verbose) printf(" [%s]", why);
                printf("\n");
                if (model) {
                    printf("%12s", "model");
                    for (int a = 0; a < SIM_NALGOS; a++) {
                        if (!want[a]) continue;
                        if (sim_algo_applies(&net, a, b))
                            printf(" %11.1f", sim_model_us(&net, a, b));
                        else
                            printf(" %11s", "-");
                    }
                    printf("\n");
                }
            }
            const double next = (double)b * factor;
            if (next > (double)maxb || b == 0) break;
            b = (size_t)next;
        }
        if (!markdown) printf("\n");
    }
    free(copy);
    return status;
}
