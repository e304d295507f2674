#include "crc32c.h"

#include <string.h>

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];

/* Bytes per lane of the three-lane hardware loop, and the register's move over that many zero
 * bytes as a GF(2) matrix (column i: what bit i becomes), to join the lanes' sums. */
enum { SPAN = 1 << 16, SPAN_BITS_LOG2 = 19 };
static uint32_t span_shift[32];

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

void chute_crc32c_init(void) {
    if (table[0][1]) return;
    uint32_t one_bit[32], twice[32];
    one_bit[0] = POLY; /* a zero bit shifted in: bit 0 folds the polynomial back */
    for (int n = 1; n < 32; n++) one_bit[n] = 1u << (n - 1);
    for (int k = 0; k < SPAN_BITS_LOG2; k++) { /* 2^19 zero bits: SPAN bytes */
        gf2_square(twice, one_bit);
        memcpy(one_bit, twice, sizeof one_bit);
    }
    memcpy(span_shift, one_bit, sizeof span_shift);
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

/* Slicing-by-8 fallback for CPUs without the crc32 instruction. */
static uint32_t crc_soft(uint32_t crc, const uint8_t *p, size_t len) {
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
              table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
              table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

/* The crc32 instruction takes 3 cycles and issues one a cycle: three independent lanes of
 * SPAN bytes keep it busy, then the register is linear in its start value, so
 * crc(a || b) = shift(crc(a), |b|) ^ crc_from_zero(b) joins them. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
                                                          size_t len) {
    while (len >= 3 * (size_t)SPAN) {
        uint64_t c0 = crc, c1 = 0, c2 = 0;
        for (size_t i = 0; i < SPAN; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + SPAN + i, 8);
            memcpy(&w2, p + 2 * SPAN + i, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        crc = gf2_times(span_shift, (uint32_t)c0) ^ (uint32_t)c1;
        crc = gf2_times(span_shift, crc) ^ (uint32_t)c2;
        p += 3 * (size_t)SPAN;
        len -= 3 * (size_t)SPAN;
    }
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--) c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}

static int have_hw(void) {
    static int cached = -1;
    if (cached < 0) cached = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    return cached;
}
#endif

uint32_t chute_crc32c(uint32_t crc, const void *buf, size_t len) {
    crc = ~crc;
#if defined(__x86_64__)
    if (have_hw()) return ~crc_hw(crc, (const uint8_t *)buf, len);
#endif
    return ~crc_soft(crc, (const uint8_t *)buf, len);
}
