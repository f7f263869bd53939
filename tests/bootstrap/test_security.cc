// test_security.cc: who may join a job, and what strangers on its ports can do to it.
//
// A fixed root address (CHORUS_COMM_ID, NCCL_COMM_ID, MASTER_ADDR:MASTER_PORT) takes its secret
// from the job secret (CHORUS_JOB_SECRET or CHORUS_JOB_SECRET_FILE) and is refused without one
// unless CHORUS_COMM_ID_INSECURE=1. A stranger that knows only the port (no secret, a wrong one, or
// the secret NCCL would derive from the address) never joins; hellos forged with that derived
// secret do not break the ranks' own connections; hundreds of silent connections to the root or to
// a rank's listener do not stall the rendezvous; an absurd nranks fails at once and closes no
// descriptor it did not open. Every connection runs a challenge-response (bs_internal.h): the
// secret, and any fixed function of it, never appears on the wire; a fake root that does not know
// it is detected by the rank; a recorded hello replayed on a new connection is refused by the root
// and by a rank. Keys are 256 bits: a fixed address's is HMAC-SHA256 (checked against independent
// vectors), random ids' keys are random in all their bits, a peer that knows only 64 bits of the
// key is refused, and an id or root of the older 64-bit version is named as such.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bs_test_env.h"
#include "chorus.h"
#include "launch.h"
#include "nccl.h"

extern "C" {
#include "bootstrap.h"
#include "bootstrap/bs_internal.h"
#include "bs_test_util.h"
#include "log.h"
#include "param.h"
}

using chorus_test::connect_to;
using chorus_test::exercise_bs;
using chorus_test::free_port;
using chorus_test::now_s;
using chorus_test::ScopedEnv;

namespace {

// No root address, job secret or opt-in from the caller's environment.
struct CleanEnv {
    ScopedEnv a{"CHORUS_COMM_ID", nullptr}, b{"NCCL_COMM_ID", nullptr},
        c{"CHORUS_JOB_SECRET", nullptr}, d{"CHORUS_JOB_SECRET_FILE", nullptr},
        e{"CHORUS_COMM_ID_INSECURE", nullptr};
};

std::string root_addr() { return "127.0.0.1:" + std::to_string(free_port()); }


// n silent connections to a; they stay open until the vector is closed with close_all.
std::vector<int> open_silent(const chorus_sockaddr_t &a, int n) {
    std::vector<int> fds;
    for (int i = 0; i < n; i++) {
        int fd = connect_to(a);
        if (fd < 0) break;
        fds.push_back(fd);
    }
    return fds;
}

void close_all(std::vector<int> &fds) {
    for (int fd : fds)
        close(fd);
    fds.clear();
}

// The key NCCL's scheme gives a fixed address: a function of the address text alone (what
// CHORUS_COMM_ID_INSECURE=1 uses; JobSecret.FixedAddressKeyIsHmacSha256 checks it against
// vectors computed independently).
chorus_key_t address_derived_secret(const std::string &hostport) {
    chorus_key_t k;
    bootstrap_fixed_key(nullptr, hostport.c_str(), &k);
    return k;
}

using chorus_test::same_key;

std::string key_hex(const chorus_key_t &k) {
    char buf[2 * CHORUS_KEY_BYTES + 1];
    for (int i = 0; i < CHORUS_KEY_BYTES; i++)
        snprintf(buf + 2 * i, 3, "%02x", k.b[i]);
    return buf;
}

// Wait (with a deadline) until counter reaches want.
bool wait_for(const std::atomic<int> &counter, int want, double seconds) {
    double end = now_s() + seconds;
    while (counter.load() < want) {
        if (now_s() > end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

TEST(JobSecret, FixedAddressWithoutSecretIsRefused) {
    CleanEnv clean;
    std::string addr = root_addr();
    ScopedEnv e("NCCL_COMM_ID", addr.c_str());
    chorus_unique_id_t id;
    EXPECT_EQ(bootstrap_get_unique_id(&id), ncclInvalidUsage);
    std::string err = chorus_log_last_error();
    EXPECT_NE(err.find("NCCL_COMM_ID=" + addr), std::string::npos) << err;
    EXPECT_NE(err.find("CHORUS_JOB_SECRET"), std::string::npos) << err;
    EXPECT_NE(err.find("CHORUS_JOB_SECRET_FILE"), std::string::npos) << err;
    EXPECT_NE(err.find("CHORUS_COMM_ID_INSECURE=1"), std::string::npos) << err;
    ncclUniqueId uid;
    EXPECT_EQ(ncclGetUniqueId(&uid), ncclInvalidUsage);

    // The launcher path: MASTER_ADDR:MASTER_PORT without a secret.
    ScopedEnv n("NCCL_COMM_ID", nullptr), r("RANK", "0"), w("WORLD_SIZE", "2"),
        ma("MASTER_ADDR", "127.0.0.1"), mp("MASTER_PORT", addr.substr(10).c_str());
    ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
    EXPECT_EQ(chorusCommInitFromEnv(&comm), ncclInvalidUsage);
    EXPECT_EQ(comm, nullptr);
    err = chorus_log_last_error();
    EXPECT_NE(err.find("MASTER_ADDR:MASTER_PORT"), std::string::npos) << err;
}

// The same secret text through the variable or a private file gives the same id; another text or
// another address gives another secret; the opt-in gives NCCL's address-derived one.
TEST(JobSecret, SecretSourcesAndOptIn) {
    CleanEnv clean;
    std::string addr = root_addr();
    ScopedEnv e("CHORUS_COMM_ID", addr.c_str());
    chorus_unique_id_t a, b, c;
    {
        ScopedEnv s("CHORUS_JOB_SECRET", "correct horse battery staple");
        ASSERT_EQ(bootstrap_get_unique_id(&a), ncclSuccess);
    }
    {
        ScopedEnv s("CHORUS_JOB_SECRET", "correct horse battery stapler");
        ASSERT_EQ(bootstrap_get_unique_id(&b), ncclSuccess);
    }
    EXPECT_FALSE(same_key(a.secret, b.secret));
    EXPECT_FALSE(same_key(a.secret, address_derived_secret(addr)));
    {
        ScopedEnv s("CHORUS_JOB_SECRET", "correct horse battery staple");
        ScopedEnv other("CHORUS_COMM_ID", root_addr().c_str());
        ASSERT_EQ(bootstrap_get_unique_id(&c), ncclSuccess);
        EXPECT_FALSE(same_key(c.secret, a.secret)) << "one job secret on two addresses";
    }

    char path[] = "/tmp/chorus_secret_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    const char text[] = "correct horse battery staple\nsecond line is ignored\n";
    ASSERT_EQ(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
    close(fd);
    {
        ASSERT_EQ(chmod(path, 0600), 0);
        ScopedEnv f("CHORUS_JOB_SECRET_FILE", path);
        ASSERT_EQ(bootstrap_get_unique_id(&b), ncclSuccess);
        EXPECT_TRUE(same_key(b.secret, a.secret)) << "file and variable with the same text";
        ScopedEnv s("CHORUS_JOB_SECRET", "x");
        EXPECT_EQ(bootstrap_get_unique_id(&b), ncclInvalidUsage) << "both set";
    }
    for (mode_t mode : {0640, 0604, 0620}) {
        ASSERT_EQ(chmod(path, mode), 0);
        ScopedEnv f("CHORUS_JOB_SECRET_FILE", path);
        EXPECT_EQ(bootstrap_get_unique_id(&b), ncclInvalidUsage) << std::oct << mode;
        std::string err = chorus_log_last_error();
        EXPECT_NE(err.find("chmod 600"), std::string::npos) << err;
    }
    ASSERT_EQ(chmod(path, 0600), 0);
    fd = open(path, O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "\n", 1), 1);
    close(fd);
    {
        ScopedEnv f("CHORUS_JOB_SECRET_FILE", path);
        EXPECT_EQ(bootstrap_get_unique_id(&b), ncclInvalidUsage) << "empty first line";
    }
    unlink(path);
    {
        ScopedEnv f("CHORUS_JOB_SECRET_FILE", path);
        EXPECT_EQ(bootstrap_get_unique_id(&b), ncclInvalidUsage) << "missing file";
    }
    {
        ScopedEnv s("CHORUS_JOB_SECRET", "");
        EXPECT_EQ(bootstrap_get_unique_id(&b), ncclInvalidUsage) << "empty secret";
    }

    // The opt-in: the address-derived secret, and a working rendezvous with it.
    ScopedEnv i("CHORUS_COMM_ID_INSECURE", "1");
    ASSERT_EQ(bootstrap_get_unique_id(&c), ncclSuccess);
    EXPECT_TRUE(same_key(c.secret, address_derived_secret(addr)));
    auto res = chorus_test::run_threads(
        2,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&c, rank, n, nullptr, &bs));
            int rc = exercise_bs(bs, rank, n);
            bootstrap_close(bs);
            return rc;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// A fixed address's key is HMAC-SHA256 keyed with the job secret over a label and the address
// text; the vectors below were computed independently with Python's hmac module:
//   hmac.new(secret, b"chorus-job-key-v1\0" + addr, hashlib.sha256).hexdigest()
// (and an empty key over "chorus-comm-id-insecure-v1\0" + addr for CHORUS_COMM_ID_INSECURE=1).
// The id bootstrap_id_from_string builds carries exactly that key.
TEST(JobSecret, FixedAddressKeyIsHmacSha256) {
    CleanEnv clean;
    const std::string long_secret(100, 'x'); // longer than SHA-256's block: HMAC hashes it first
    struct Vec {
        const char *secret, *addr, *hex;
    } vecs[] = {
        {"correct horse battery staple", "127.0.0.1:29500",
         "0335bee98110c98135b74a411f6eae694461aeb7b2099bebfb75c71bf2000e74"},
        {nullptr, "127.0.0.1:29500",
         "32c44350c22dc2724852bb6ad654b84891d7f3f9535b875497b87fd685aa3452"},
        {long_secret.c_str(), "[::1]:80",
         "678df8df2e4df89fa4a93a6fa1cbb637989d20132d71d57469c37188c91a6a7a"},
    };
    for (const Vec &v : vecs) {
        chorus_key_t k;
        bootstrap_fixed_key(v.secret, v.addr, &k);
        EXPECT_EQ(key_hex(k), v.hex) << (v.secret ? v.secret : "(insecure)") << " " << v.addr;
        ScopedEnv s("CHORUS_JOB_SECRET", v.secret);
        ScopedEnv i("CHORUS_COMM_ID_INSECURE", v.secret ? nullptr : "1");
        chorus_unique_id_t id;
        ASSERT_EQ(bootstrap_id_from_string(v.addr, "TEST", &id), ncclSuccess);
        EXPECT_EQ(key_hex(id.secret), v.hex) << v.addr;
        EXPECT_EQ(id.magic, CHORUS_ID_MAGIC);
    }
}

// Two strangers know the job's fixed address: one takes the secret NCCL derives from it, the other
// a wrong secret. Each claims a rank of the job before the real rank arrives. Neither joins: the
// real ranks build their communicator and all-reduce correctly, and the strangers fail.
TEST(JobSecret, StrangerKnowingThePortCannotJoin) {
    CleanEnv clean;
    std::string addr = root_addr();
    const int kReal = 3;
    auto res = chorus_test::run_forked(
        kReal + 2,
        [&](int proc, int) {
            setenv("NCCL_COMM_ID", addr.c_str(), 1);
            if (proc < kReal) {
                setenv("CHORUS_JOB_SECRET", "the real job's secret", 1);
            } else {
                if (proc == kReal)
                    setenv("CHORUS_COMM_ID_INSECURE", "1", 1);
                else
                    setenv("CHORUS_JOB_SECRET", "a guess", 1);
                setenv("CHORUS_TIMEOUT", "3", 1);
            }
            ncclResetDebugInit();
            ncclUniqueId uid;
            RANK_NCCL(ncclGetUniqueId(&uid));
            ncclComm_t comm = nullptr;
            if (proc >= kReal) {
                int claim = proc - kReal + 1; // ranks 1 and 2
                ncclResult_t r = ncclCommInitRank(&comm, kReal, uid, claim);
                RANK_CHECK(r != ncclSuccess, "a stranger joined as rank %d", claim);
                return 0;
            }
            // The real ranks 1 and 2 come late, after the strangers claimed their places.
            if (proc > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
            RANK_NCCL(ncclCommInitRank(&comm, kReal, uid, proc));
            for (int iter = 0; iter < 3; iter++) {
                std::vector<float> buf(1000);
                for (size_t i = 0; i < buf.size(); i++)
                    buf[i] = (float)(proc + 1) * (float)(i % 13 + iter);
                RANK_NCCL(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum,
                                        comm, nullptr));
                for (size_t i = 0; i < buf.size(); i++) {
                    float want = (float)(kReal * (kReal + 1) / 2) * (float)(i % 13 + iter);
                    RANK_CHECK(buf[i] == want, "iter %d: [%zu] = %g, want %g", iter, i, buf[i],
                               want);
                }
            }
            RANK_NCCL(ncclCommDestroy(comm));
            return 0;
        },
        90);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// After the rendezvous, hellos forged with the address-derived secret claim every (from, to) pair
// on every rank's listener before the real ranks connect. The ranks' own traffic still works.
TEST(JobSecret, ForgedPeerHellosDoNotBreakTheJob) {
    CleanEnv clean;
    std::string addr = root_addr();
    ScopedEnv e("CHORUS_COMM_ID", addr.c_str());
    ScopedEnv s("CHORUS_JOB_SECRET", "forged hello test");
    chorus_unique_id_t id;
    ASSERT_EQ(bootstrap_get_unique_id(&id), ncclSuccess);
    const chorus_key_t forged_secret = address_derived_secret(addr);
    EXPECT_FALSE(same_key(id.secret, forged_secret)) << "the job secret was ignored";
    std::atomic<int> inited{0}, forged{0};
    std::vector<int> forged_fds;
    auto res = chorus_test::run_threads(
        4,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            inited++;
            if (rank == 0) {
                RANK_CHECK(wait_for(inited, n, 30), "the other ranks did not init");
                for (int to = 0; to < n; to++) {
                    for (int from = 0; from < n; from++) {
                        if (from == to) continue;
                        int fd = connect_to(*bootstrap_addr(bs, to));
                        RANK_CHECK(fd >= 0, "connect to rank %d", to);
                        bs_hello_t h = chorus_test::hello_claims(BS_HELLO_PEER, from, n, to);
                        RANK_CHECK(chorus_test::send_signed_hello(fd, forged_secret, &h),
                                   "forged hello to rank %d", to);
                        forged_fds.push_back(fd);
                    }
                }
                // Give the listeners time to read the forged hellos before real ones come.
                std::this_thread::sleep_for(std::chrono::milliseconds(300));
                forged++;
            } else {
                RANK_CHECK(wait_for(forged, 1, 30), "rank 0 did not forge the hellos");
            }
            int rc = exercise_bs(bs, rank, n);
            bootstrap_close(bs);
            return rc;
        },
        60);
    close_all(forged_fds);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// 500 connections that never speak, held open on the root port and on ranks' listeners, must not
// stall the rendezvous or the ranks' own connections. BS_HELLO_TIMEOUT_S (10 s) is how long a
// silent connection may otherwise wait; the bound below only proves "does not stall".
TEST(SilentConnections, DoNotStallInit) {
    CleanEnv clean;
    const int kRanks = 4, kSilent = 500;
    const double kBound = 5.0;
    double init_s[2] = {0, 0}, exercise_s[2] = {0, 0};
    for (int silent : {0, kSilent}) {
        chorus_unique_id_t id;
        ASSERT_EQ(bootstrap_get_unique_id(&id), ncclSuccess);
        std::vector<int> root_flood = open_silent(id.root, silent);
        ASSERT_EQ((int)root_flood.size(), silent);
        std::atomic<int> inited{0}, flooded{0};
        std::vector<int> peer_flood;
        double t0 = now_s(), t_init = 0, t_flooded = 0;
        auto res = chorus_test::run_threads(
            kRanks,
            [&](int rank, int n) {
                bootstrap_t *bs = nullptr;
                RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
                if (++inited == n) t_init = now_s();
                if (rank == 0) {
                    RANK_CHECK(wait_for(inited, n, 60), "the other ranks did not init");
                    // Ranks 1 and 2 get silent connections before any peer connects to them.
                    for (int to : {1, 2}) {
                        std::vector<int> fds = open_silent(*bootstrap_addr(bs, to), silent);
                        RANK_CHECK((int)fds.size() == silent, "%zu silent connections to rank %d",
                                   fds.size(), to);
                        peer_flood.insert(peer_flood.end(), fds.begin(), fds.end());
                    }
                    t_flooded = now_s();
                    flooded++;
                } else {
                    RANK_CHECK(wait_for(flooded, 1, 60), "rank 0 did not open the connections");
                }
                int rc = exercise_bs(bs, rank, n);
                bootstrap_close(bs);
                return rc;
            },
            120);
        double t_end = now_s();
        close_all(root_flood);
        close_all(peer_flood);
        EXPECT_TRUE(res.ok()) << silent << " silent: " << res.detail;
        int k = silent ? 1 : 0;
        init_s[k] = t_init - t0;
        exercise_s[k] = t_end - t_flooded;
        EXPECT_LT(init_s[k], kBound) << silent << " silent connections on the root port";
        EXPECT_LT(exercise_s[k], kBound) << silent << " silent connections on ranks' listeners";
    }
    printf("%d ranks: rendezvous %.3f s with 0 silent connections on the root port, %.3f s with "
           "%d; allgather+ring+barrier %.3f s with 0 and %.3f s with %d on ranks 1 and 2's "
           "listeners\n",
           kRanks, init_s[0], init_s[1], kSilent, exercise_s[0], exercise_s[1], kSilent);
}

// nranks = INT_MAX or 1e9: an error at once (not minutes of allocating and touching gigabytes), and
// no descriptor the process owns is closed (a half-built bootstrap once closed fd 0 over and over).
TEST(HugeNranks, FailsAtOnceAndClosesNothing) {
    CleanEnv clean;
    auto res = chorus_test::run_forked(
        1,
        [&](int, int) {
            setenv("CHORUS_TIMEOUT", "5", 1);
            ncclResetDebugInit();
            if (fcntl(0, F_GETFD) == -1) { // make sure fd 0 is something to watch
                int fd = open("/dev/null", O_RDONLY);
                RANK_CHECK(fd == 0, "/dev/null opened as fd %d", fd);
            }
            int mine[2];
            RANK_CHECK(pipe(mine) == 0, "pipe");
            ncclUniqueId uid;
            RANK_NCCL(ncclGetUniqueId(&uid));
            for (int nranks : {INT_MAX, 1000000000}) {
                double t0 = now_s();
                ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
                ncclResult_t r = ncclCommInitRank(&comm, nranks, uid, 0);
                double took = now_s() - t0;
                RANK_CHECK(r == ncclInvalidArgument, "nranks %d -> %s", nranks,
                           ncclGetErrorString(r));
                RANK_CHECK(comm == nullptr, "comm set");
                RANK_CHECK(strstr(ncclGetLastError(nullptr), "nranks") != nullptr, "message: %s",
                           ncclGetLastError(nullptr));
                RANK_CHECK(took < 10.0, "nranks %d took %.1f s", nranks, took);
                for (int fd : {0, mine[0], mine[1]})
                    RANK_CHECK(fcntl(fd, F_GETFD) != -1, "fd %d was closed (nranks %d)", fd,
                               nranks);
            }
            // The same at the bootstrap level.
            chorus_unique_id_t id;
            memcpy(&id, uid.internal, sizeof(id));
            bootstrap_t *bs = nullptr;
            RANK_CHECK(bootstrap_init(&id, 0, INT_MAX, nullptr, &bs) == ncclInvalidArgument,
                       "bootstrap_init with INT_MAX ranks");
            for (int fd : {0, mine[0], mine[1]})
                RANK_CHECK(fcntl(fd, F_GETFD) != -1, "fd %d was closed (bootstrap)", fd);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// ---- the challenge-response ---------------------------------------------------------------

// A fake root on a loopback port: for each of `rounds` connections it sends a challenge with the
// same nonce every time, records the hello that comes back and answers with a proof it cannot
// make (it does not know the secret) and a "joined" reply.
struct FakeRoot {
    int lfd = -1;
    chorus_sockaddr_t addr;
    std::vector<std::string> hellos;
    std::thread th;
    // version: the wire version its challenge names (another one: a root of another Chorus).
    explicit FakeRoot(int rounds, uint32_t version = BS_WIRE_VERSION) {
        memset(&addr, 0, sizeof(addr));
        addr.sin.sin_family = AF_INET;
        addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        socklen_t len = sizeof(addr.sin);
        if (lfd < 0 || bind(lfd, &addr.sa, len) != 0 || listen(lfd, 8) != 0 ||
            getsockname(lfd, &addr.sa, &len) != 0)
            ADD_FAILURE() << "fake root: cannot listen";
        th = std::thread([this, rounds, version] {
            for (int r = 0; r < rounds; r++) {
                int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
                if (fd < 0) return;
                bs_challenge_t c;
                memset(&c, 0, sizeof(c));
                c.magic = BS_WIRE_MAGIC;
                c.version = version;
                memset(c.nonce, 0x42, sizeof(c.nonce)); // the same challenge every time
                bs_hello_t h;
                if (write(fd, &c, sizeof(c)) == (ssize_t)sizeof(c) &&
                    chorus_test::read_exact(fd, &h, sizeof(h), 20.0)) {
                    hellos.emplace_back((const char *)&h, sizeof(h));
                    struct {
                        bs_answer_t a;
                        bs_reply_t rep;
                    } m;
                    memset(&m, 0, sizeof(m));
                    m.a.status = BS_ANSWER_OK; // and a proof of zeros
                    m.rep.status = BS_REPLY_JOINED;
                    m.rep.nranks = 2;
                    if (write(fd, &m, sizeof(m)) != (ssize_t)sizeof(m)) {
                    }
                }
                char b;
                (void)chorus_test::read_exact(fd, &b, 1, 2.0); // until the rank closes
                close(fd);
            }
        });
    }
    ~FakeRoot() {
        if (th.joinable()) th.join();
        if (lfd >= 0) close(lfd);
    }
    std::string addr_str() const {
        char buf[64];
        return chorus_sockaddr_str(&addr, buf, sizeof(buf));
    }
};

// Whether any 8 consecutive bytes of the key appear in hay, in either byte order.
bool contains(const std::string &hay, const chorus_key_t &k) {
    for (int i = 0; i + 8 <= CHORUS_KEY_BYTES; i++) {
        std::string run((const char *)k.b + i, 8), rev(run.rbegin(), run.rend());
        if (hay.find(run) != std::string::npos || hay.find(rev) != std::string::npos) return true;
    }
    return false;
}

// The bytes a rank puts on the wire when it joins, recorded by a fake root, twice: the secret
// appears nowhere (neither a random id's nor the address-derived one of NCCL's scheme), and the two
// hellos differ although the fake root sent the same challenge both times, so no fixed function
// of the secret is sent either. The rank refuses the fake root, which cannot prove it knows the
// secret, within a second, naming its address.
TEST(Handshake, SecretNeverCrossesTheWireAndAFakeRootIsRefused) {
    CleanEnv clean;
    ScopedEnv t("CHORUS_TIMEOUT", "10");
    for (int fixed = 0; fixed < 2; fixed++) {
        FakeRoot fake(2);
        chorus_unique_id_t id;
        memset(&id, 0, sizeof(id));
        int rank = 0;
        if (fixed) { // NCCL's scheme: the secret derived from the address text
            ScopedEnv c("NCCL_COMM_ID", fake.addr_str().c_str()), i("CHORUS_COMM_ID_INSECURE", "1");
            ASSERT_EQ(bootstrap_get_unique_id(&id), ncclSuccess);
            ASSERT_TRUE(same_key(id.secret, address_derived_secret(fake.addr_str())));
            rank = 1; // rank 0 would start a root of its own there
        } else {
            id.magic = CHORUS_ID_MAGIC;
            ASSERT_EQ(chorus_random_bytes(id.secret.b, sizeof(id.secret.b)), 0);
            id.root = fake.addr;
        }
        for (int attempt = 0; attempt < 2; attempt++) {
            bootstrap_t *bs = nullptr;
            double t0 = now_s();
            ncclResult_t r = bootstrap_init(&id, rank, 2, nullptr, &bs);
            double took = now_s() - t0;
            EXPECT_EQ(r, ncclRemoteError) << "fixed " << fixed;
            EXPECT_EQ(bs, nullptr);
            EXPECT_LT(took, 5.0) << "the fake root was detected only after " << took << " s";
            std::string err = chorus_log_last_error();
            EXPECT_NE(err.find("failed authentication"), std::string::npos) << err;
            EXPECT_NE(err.find(fake.addr_str()), std::string::npos) << err;
            if (bs) bootstrap_close(bs);
        }
        fake.th.join();
        ASSERT_EQ(fake.hellos.size(), 2u);
        for (const std::string &h : fake.hellos) {
            EXPECT_FALSE(contains(h, id.secret)) << "the secret is on the wire (fixed " << fixed
                                                 << ")";
            EXPECT_FALSE(contains(h, address_derived_secret(fake.addr_str())));
        }
        EXPECT_NE(fake.hellos[0], fake.hellos[1])
            << "the same challenge drew the same hello: a replayable function of the secret";
    }
}

// A rank's hello to the root, recorded whole (a valid one: the recorder knows the secret), is
// replayed on a new connection: the root refuses it (its proof was for another challenge), as it
// refuses a hello proved with another secret. The real ranks then join as usual.
TEST(Handshake, ReplayedHelloIsRefusedByTheRoot) {
    CleanEnv clean;
    chorus_unique_id_t id;
    ASSERT_EQ(bootstrap_get_unique_id(&id), ncclSuccess);
    // Rank 1's claims, with a listen address nothing listens at (so the real rank 1 replaces it).
    bs_hello_t h = chorus_test::hello_claims(BS_HELLO_ROOT, 1, 2, -1);
    h.addr = id.root;
    {
        int tmp = socket(AF_INET, SOCK_STREAM, 0);
        ASSERT_GE(tmp, 0);
        struct sockaddr_in a = id.root.sin;
        a.sin_port = 0;
        socklen_t len = sizeof(a);
        ASSERT_EQ(bind(tmp, (struct sockaddr *)&a, sizeof(a)), 0);
        ASSERT_EQ(getsockname(tmp, (struct sockaddr *)&a, &len), 0);
        h.addr.sin.sin_port = a.sin_port;
        close(tmp);
    }
    struct {
        bs_answer_t a;
        bs_reply_t rep;
    } m;
    int fd = connect_to(id.root);
    ASSERT_GE(fd, 0);
    bs_challenge_t c;
    ASSERT_TRUE(chorus_test::send_signed_hello(fd, id.secret, &h, &c));
    ASSERT_TRUE(chorus_test::read_exact(fd, &m, sizeof(m), 5.0));
    EXPECT_TRUE(bs_answer_ok(&m.a, &h, &id.secret, c.nonce, &m.rep, sizeof(m.rep)))
        << "the root's answer does not prove it knows the secret";
    EXPECT_EQ(m.rep.status, (uint32_t)BS_REPLY_JOINED);
    close(fd);

    fd = connect_to(id.root); // the replay
    ASSERT_GE(fd, 0);
    bs_challenge_t c2;
    ASSERT_TRUE(chorus_test::read_exact(fd, &c2, sizeof(c2), 5.0));
    EXPECT_NE(memcmp(c.nonce, c2.nonce, sizeof(c.nonce)), 0) << "the root reused a challenge";
    ASSERT_EQ(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
    bs_answer_t a;
    ASSERT_TRUE(chorus_test::read_exact(fd, &a, sizeof(a), 5.0));
    EXPECT_EQ(a.status, (uint32_t)BS_ANSWER_REFUSED) << "a replayed hello was accepted";
    close(fd);

    fd = connect_to(id.root); // another secret
    ASSERT_GE(fd, 0);
    bs_hello_t h2 = chorus_test::hello_claims(BS_HELLO_ROOT, 0, 2, -1);
    ASSERT_TRUE(chorus_test::send_signed_hello(fd, chorus_test::other_key(id.secret, 31, 0x10), &h2));
    ASSERT_TRUE(chorus_test::read_exact(fd, &a, sizeof(a), 5.0));
    EXPECT_EQ(a.status, (uint32_t)BS_ANSWER_REFUSED) << "a hello with another secret was accepted";
    close(fd);

    // The real rank 1 replaces the recorded one (nothing listens at its address) before rank 0
    // completes the rendezvous.
    auto res = chorus_test::run_threads(
        2,
        [&](int rank, int n) {
            if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            int rc = exercise_bs(bs, rank, n);
            bootstrap_close(bs);
            return rc;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// The same on a rank's own listener: rank 1 opens its first connection to rank 0 by hand with a
// valid hello (rank 0's answer proves rank 0 knows the secret) and sends a message on it; the
// same hello replayed on a second connection, and one proved with another secret, are refused,
// and the first connection carries on. (Three ranks: the rendezvous never connects rank 1 to
// rank 0, so the hand-made connection is rank 1's first to it.)
TEST(Handshake, ReplayedHelloIsRefusedByAPeer) {
    CleanEnv clean;
    chorus_unique_id_t id;
    ASSERT_EQ(bootstrap_get_unique_id(&id), ncclSuccess);
    std::atomic<int> received{0};
    auto res = chorus_test::run_threads(
        3,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            if (rank == 1) {
                const chorus_sockaddr_t to = *bootstrap_addr(bs, 0);
                int fd = connect_to(to);
                RANK_CHECK(fd >= 0, "connect to rank 0");
                bs_hello_t h = chorus_test::hello_claims(BS_HELLO_PEER, 1, n, 0);
                bs_challenge_t c;
                RANK_CHECK(chorus_test::send_signed_hello(fd, id.secret, &h, &c), "hello");
                RANK_CHECK(chorus_test::got_answer(fd, id.secret, h, c),
                           "rank 0 did not prove it knows the secret");
                bs_msg_hdr_t hdr = {9, 0, sizeof(int)};
                int v = 1234;
                RANK_CHECK(write(fd, &hdr, sizeof(hdr)) == (ssize_t)sizeof(hdr) &&
                               write(fd, &v, sizeof(v)) == (ssize_t)sizeof(v),
                           "message");
                for (int k = 0; k < 2; k++) { // the replay, then another secret
                    int f2 = connect_to(to);
                    RANK_CHECK(f2 >= 0, "connect to rank 0");
                    if (k == 0) {
                        bs_challenge_t c2;
                        RANK_CHECK(chorus_test::read_exact(f2, &c2, sizeof(c2), 5.0), "challenge");
                        RANK_CHECK(write(f2, &h, sizeof(h)) == (ssize_t)sizeof(h), "replay");
                    } else {
                        bs_hello_t h2 = chorus_test::hello_claims(BS_HELLO_PEER, 2, n, 0);
                        RANK_CHECK(chorus_test::send_signed_hello(
                                       f2, chorus_test::other_key(id.secret, 17), &h2),
                                   "hello");
                    }
                    bs_answer_t a;
                    RANK_CHECK(chorus_test::read_exact(f2, &a, sizeof(a), 5.0), "answer %d", k);
                    RANK_CHECK(a.status == BS_ANSWER_REFUSED, "%s was accepted",
                               k == 0 ? "a replayed hello" : "a hello with another secret");
                    close(f2);
                }
                hdr.tag = 10;
                v = 5678;
                RANK_CHECK(write(fd, &hdr, sizeof(hdr)) == (ssize_t)sizeof(hdr) &&
                               write(fd, &v, sizeof(v)) == (ssize_t)sizeof(v),
                           "message");
                RANK_CHECK(wait_for(received, 1, 30), "rank 0 did not receive");
                close(fd);
            } else if (rank == 0) {
                int a = 0, b = 0;
                RANK_NCCL(bootstrap_recv(bs, 1, 9, &a, sizeof(a)));
                RANK_NCCL(bootstrap_recv(bs, 1, 10, &b, sizeof(b)));
                RANK_CHECK(a == 1234 && b == 5678, "got %d and %d", a, b);
                received++;
            }
            bootstrap_close(bs);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Keys of random ids are 256 random bits: among 32 ids every bit position takes both values,
// every pair of keys differs in about half its bits, and no 64-bit word of one key equals any
// word of another (a key made from 64 bits, or padded with zeros, fails all three). The chance
// that a true random source fails is below 1e-6.
TEST(UniqueId, RandomKeysHave256Bits) {
    CleanEnv clean;
    ScopedEnv t("CHORUS_TIMEOUT", "2"); // the roots of these unused ids give up soon
    const int kIds = 32;
    std::vector<chorus_key_t> keys(kIds);
    for (int i = 0; i < kIds; i++) {
        ncclUniqueId uid;
        ASSERT_EQ(ncclGetUniqueId(&uid), ncclSuccess);
        chorus_unique_id_t id;
        memcpy(&id, uid.internal, sizeof(id));
        ASSERT_EQ(id.magic, CHORUS_ID_MAGIC);
        keys[i] = id.secret;
    }
    for (int bit = 0; bit < 8 * CHORUS_KEY_BYTES; bit++) {
        int ones = 0;
        for (const chorus_key_t &k : keys)
            ones += (k.b[bit / 8] >> (bit % 8)) & 1;
        EXPECT_TRUE(ones > 0 && ones < kIds) << "key bit " << bit << " is " << (ones ? 1 : 0)
                                             << " in all " << kIds << " ids";
    }
    std::vector<uint64_t> words;
    for (int i = 0; i < kIds; i++) {
        for (int w = 0; w < CHORUS_KEY_BYTES / 8; w++) {
            uint64_t v;
            memcpy(&v, keys[i].b + 8 * w, 8);
            for (uint64_t seen : words)
                EXPECT_NE(v, seen) << "id " << i << " word " << w << " repeats";
            words.push_back(v);
        }
        for (int j = 0; j < i; j++) {
            int diff = 0;
            for (int b = 0; b < CHORUS_KEY_BYTES; b++)
                diff += __builtin_popcount(keys[i].b[b] ^ keys[j].b[b]);
            EXPECT_TRUE(diff >= 64 && diff <= 192) << "ids " << j << " and " << i << " differ in "
                                                   << diff << " of 256 key bits";
        }
    }
}

// Sign a hello's claims as a peer that knows only the first 64 bits of the key would: those 8
// bytes as the whole HMAC key (what a 64-bit key was), or zero-extended to 256 bits.
void sign_truncated(bs_hello_t *h, const chorus_key_t &key, const bs_challenge_t &c, bool pad) {
    h->magic = BS_WIRE_MAGIC;
    h->version = BS_WIRE_VERSION;
    memset(h->nonce, 0x33, sizeof(h->nonce));
    chorus_key_t k;
    memset(&k, 0, sizeof(k));
    memcpy(k.b, key.b, 8);
    chorus_auth_proof(k.b, pad ? sizeof(k.b) : 8, BS_AUTH_LABEL, CHORUS_AUTH_CLIENT, h->nonce,
                      c.nonce, h, BS_HELLO_CLAIMS, nullptr, 0, h->proof);
}

// A peer that knows only the 64-bit truncation of the key is refused by the root and by a rank's
// listener; the real ranks then join and talk as usual.
TEST(Handshake, KeyTruncatedTo64BitsIsRefused) {
    CleanEnv clean;
    chorus_unique_id_t id;
    ASSERT_EQ(bootstrap_get_unique_id(&id), ncclSuccess);
    for (bool pad : {false, true}) {
        int fd = connect_to(id.root);
        ASSERT_GE(fd, 0);
        bs_challenge_t c;
        ASSERT_TRUE(chorus_test::read_exact(fd, &c, sizeof(c), 5.0));
        ASSERT_TRUE(bs_challenge_ok(&c));
        bs_hello_t h = chorus_test::hello_claims(BS_HELLO_ROOT, 0, 2, -1);
        sign_truncated(&h, id.secret, c, pad);
        ASSERT_EQ(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
        bs_answer_t a;
        ASSERT_TRUE(chorus_test::read_exact(fd, &a, sizeof(a), 5.0));
        EXPECT_EQ(a.status, (uint32_t)BS_ANSWER_REFUSED)
            << "the root accepted a hello keyed by the key's first 64 bits (pad " << pad << ")";
        close(fd);
    }
    auto res = chorus_test::run_threads(
        2,
        [&](int rank, int n) {
            bootstrap_t *bs = nullptr;
            RANK_NCCL(bootstrap_init(&id, rank, n, nullptr, &bs));
            if (rank == 1) {
                for (bool pad : {false, true}) {
                    int fd = connect_to(*bootstrap_addr(bs, 0));
                    RANK_CHECK(fd >= 0, "connect to rank 0");
                    bs_challenge_t c;
                    RANK_CHECK(chorus_test::read_exact(fd, &c, sizeof(c), 5.0), "challenge");
                    bs_hello_t h = chorus_test::hello_claims(BS_HELLO_PEER, 1, n, 0);
                    sign_truncated(&h, id.secret, c, pad);
                    RANK_CHECK(write(fd, &h, sizeof(h)) == (ssize_t)sizeof(h), "hello");
                    bs_answer_t a;
                    RANK_CHECK(chorus_test::read_exact(fd, &a, sizeof(a), 5.0), "answer");
                    RANK_CHECK(a.status == BS_ANSWER_REFUSED,
                               "rank 0 accepted a hello keyed by the key's first 64 bits (pad %d)",
                               (int)pad);
                    close(fd);
                }
            }
            int rc = exercise_bs(bs, rank, n);
            bootstrap_close(bs);
            return rc;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// A job that mixes this Chorus with one of a 64-bit key fails with a message saying so: an id
// made by the older version is refused by ncclCommInitRank, and a root that speaks the older
// wire version is named as such (not taken for a stranger without the secret).
TEST(Handshake, OlderVersionIsNamed) {
    CleanEnv clean;
    ScopedEnv t("CHORUS_TIMEOUT", "10");
    ncclUniqueId uid;
    memset(&uid, 0, sizeof(uid));
    uint64_t old_magic = CHORUS_ID_MAGIC_V1, old_key = 0x0123456789abcdefull;
    chorus_sockaddr_t root;
    memset(&root, 0, sizeof(root));
    root.sin.sin_family = AF_INET;
    root.sin.sin_port = htons(1);
    root.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    memcpy(uid.internal, &old_magic, 8); // the older layout: magic, 8-byte key, root address
    memcpy(uid.internal + 8, &old_key, 8);
    memcpy(uid.internal + 16, &root, sizeof(root));
    ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
    EXPECT_EQ(ncclCommInitRank(&comm, 2, uid, 0), ncclInvalidArgument);
    std::string err = ncclGetLastError(nullptr);
    EXPECT_NE(err.find("older Chorus version"), std::string::npos) << err;

    FakeRoot fake(1, 2);
    chorus_unique_id_t id;
    memset(&id, 0, sizeof(id));
    id.magic = CHORUS_ID_MAGIC;
    ASSERT_EQ(chorus_random_bytes(id.secret.b, sizeof(id.secret.b)), 0);
    id.root = fake.addr;
    bootstrap_t *bs = nullptr;
    double t0 = now_s();
    EXPECT_EQ(bootstrap_init(&id, 0, 2, nullptr, &bs), ncclRemoteError);
    EXPECT_LT(now_s() - t0, 5.0);
    EXPECT_EQ(bs, nullptr);
    err = chorus_log_last_error();
    EXPECT_NE(err.find("wire version 2"), std::string::npos) << err;
    EXPECT_NE(err.find("same"), std::string::npos) << err;
    EXPECT_NE(err.find(fake.addr_str()), std::string::npos) << err;
    fake.th.join();
    EXPECT_TRUE(fake.hellos.empty()) << "a hello went to a root of another wire version";
}

} // namespace
