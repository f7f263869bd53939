// test_sha256.cc: SHA-256 and HMAC-SHA256 (src/base/sha256.c) against FIPS 180-4's example
// messages, RFC 4231's HMAC test cases, and random inputs against Python's hashlib/hmac (skipped
// with a message when python3 is missing); the constant-time compare and the auth proofs.
#include <gtest/gtest.h>
#include <stdio.h>

#include <random>
#include <string>
#include <vector>

extern "C" {
#include "auth.h"
#include "sha256.h"
}

namespace {

std::string hex(const uint8_t *p, size_t n) {
    static const char d[] = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; i++) {
        s += d[p[i] >> 4];
        s += d[p[i] & 15];
    }
    return s;
}

std::string sha(const std::string &m) {
    uint8_t out[32];
    chorus_sha256(m.data(), m.size(), out);
    return hex(out, 32);
}

std::string hmac(const std::string &k, const std::string &m) {
    uint8_t out[32];
    chorus_hmac_sha256(k.data(), k.size(), m.data(), m.size(), out);
    return hex(out, 32);
}

TEST(Sha256, FipsShortAndLongMessages) {
    EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(sha("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklm"
                  "nopqrlmnopqrsmnopqrstnopqrstu"),
              "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    EXPECT_EQ(sha(std::string(1000000, 'a')),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Pieces of every size through update() give the one-call digest (block and padding edges).
TEST(Sha256, StreamingMatchesOneCall) {
    std::string m;
    for (int i = 0; i < 300; i++)
        m += (char)(i * 7 + 3);
    for (size_t len : {0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 300}) {
        for (size_t piece : {1, 3, 63, 64, 100}) {
            chorus_sha256_t s;
            chorus_sha256_init(&s);
            for (size_t off = 0; off < len; off += piece)
                chorus_sha256_update(&s, m.data() + off, std::min(piece, len - off));
            uint8_t out[32];
            chorus_sha256_final(&s, out);
            EXPECT_EQ(hex(out, 32), sha(m.substr(0, len))) << len << " in pieces of " << piece;
        }
    }
}

TEST(HmacSha256, Rfc4231) {
    EXPECT_EQ(hmac(std::string(20, '\x0b'), "Hi There"),
              "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    EXPECT_EQ(hmac("Jefe", "what do ya want for nothing?"),
              "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    EXPECT_EQ(hmac(std::string(20, '\xaa'), std::string(50, '\xdd')),
              "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    std::string k4;
    for (int i = 1; i <= 25; i++)
        k4 += (char)i;
    EXPECT_EQ(hmac(k4, std::string(50, '\xcd')),
              "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    EXPECT_EQ(hmac(std::string(20, '\x0c'), "Test With Truncation").substr(0, 32),
              "a3b6167473100ee06e0c796c2955552b");
    EXPECT_EQ(hmac(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
              "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    EXPECT_EQ(hmac(std::string(131, '\xaa'),
                   "This is a test using a larger than block-size key and a larger than block-size "
                   "data. The key needs to be hashed before being used by the HMAC algorithm."),
              "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

// Random keys and messages of random lengths (0 to 300 bytes, keys to 150: both sides of the
// block size) against Python's hashlib and hmac, which the test runs.
TEST(HmacSha256, RandomAgainstPython) {
    if (system("python3 -c 'import hashlib, hmac' >/dev/null 2>&1") != 0)
        GTEST_SKIP() << "python3 with hashlib is not available: the cross-check is skipped";
    std::mt19937 rng(12345);
    const int kCases = 200;
    std::string script = "import hashlib, hmac, sys\nfor line in sys.stdin:\n"
                         "    k, m = (bytes.fromhex(x) for x in line.split(':'))\n"
                         "    print(hashlib.sha256(m).hexdigest(), "
                         "hmac.new(k, m, 'sha256').hexdigest())\n";
    char in_path[] = "/tmp/chorus_sha_in_XXXXXX";
    int fd = mkstemp(in_path);
    ASSERT_GE(fd, 0);
    FILE *in = fdopen(fd, "w");
    std::vector<std::string> want;
    for (int c = 0; c < kCases; c++) {
        std::string k(rng() % 151, '\0'), m(rng() % 301, '\0');
        for (auto &ch : k) ch = (char)rng();
        for (auto &ch : m) ch = (char)rng();
        fprintf(in, "%s:%s\n", hex((const uint8_t *)k.data(), k.size()).c_str(),
                hex((const uint8_t *)m.data(), m.size()).c_str());
        want.push_back(sha(m) + " " + hmac(k, m));
    }
    fclose(in);
    std::string cmd = "python3 -c \"" + std::string("exec(") + "'''" + script + "'''" + ")\" < " +
                      in_path;
    FILE *p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char line[256];
    int n = 0;
    while (fgets(line, sizeof(line), p) && n < kCases) {
        std::string got(line);
        got.erase(got.find_last_not_of("\n") + 1);
        EXPECT_EQ(want[n], got) << "case " << n;
        n++;
    }
    EXPECT_EQ(pclose(p), 0);
    unlink(in_path);
    EXPECT_EQ(n, kCases);
}

TEST(ConstantTimeEqual, FindsEveryDifference) {
    uint8_t a[32], b[32];
    for (int i = 0; i < 32; i++)
        a[i] = b[i] = (uint8_t)(i * 13);
    EXPECT_TRUE(chorus_ct_equal(a, b, 32));
    EXPECT_TRUE(chorus_ct_equal(a, b, 0));
    for (int i = 0; i < 32; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1 << bit);
            EXPECT_FALSE(chorus_ct_equal(a, b, 32)) << i << "." << bit;
            b[i] ^= (uint8_t)(1 << bit);
        }
    }
}

// A proof checks only with the same key, label, role, nonces and claims.
TEST(AuthProof, BindsEveryInput) {
    uint8_t nc[CHORUS_NONCE_BYTES], ns[CHORUS_NONCE_BYTES], proof[CHORUS_PROOF_BYTES];
    ASSERT_EQ(chorus_random_bytes(nc, sizeof(nc)), 0);
    ASSERT_EQ(chorus_random_bytes(ns, sizeof(ns)), 0);
    const char key[] = "k3y", claims[] = "rank 1 of 4", reply[] = "ok";
    chorus_auth_proof(key, 3, "lbl", CHORUS_AUTH_CLIENT, nc, ns, claims, sizeof(claims), reply,
                      sizeof(reply), proof);
    auto check = [&](const char *k, const char *label, int role, const uint8_t *c,
                     const uint8_t *s, const char *cl, const char *rp) {
        return chorus_auth_check(k, 3, label, role, c, s, cl, strlen(cl) + 1, rp, strlen(rp) + 1,
                                 proof);
    };
    EXPECT_TRUE(check(key, "lbl", CHORUS_AUTH_CLIENT, nc, ns, claims, reply));
    EXPECT_FALSE(check("k3Y", "lbl", CHORUS_AUTH_CLIENT, nc, ns, claims, reply));
    EXPECT_FALSE(check(key, "lbm", CHORUS_AUTH_CLIENT, nc, ns, claims, reply));
    EXPECT_FALSE(check(key, "lbl", CHORUS_AUTH_SERVER, nc, ns, claims, reply));
    EXPECT_FALSE(check(key, "lbl", CHORUS_AUTH_CLIENT, ns, nc, claims, reply));
    EXPECT_FALSE(check(key, "lbl", CHORUS_AUTH_CLIENT, nc, ns, "rank 2 of 4", reply));
    EXPECT_FALSE(check(key, "lbl", CHORUS_AUTH_CLIENT, nc, ns, claims, "no"));
    uint8_t n2[CHORUS_NONCE_BYTES];
    ASSERT_EQ(chorus_random_bytes(n2, sizeof(n2)), 0);
    EXPECT_NE(hex(n2, sizeof(n2)), hex(ns, sizeof(ns))) << "two nonces alike";
}

} // namespace
