// CRC32C with a run-time choice between the CPU instruction and a
// slicing-by-8 table. No global compiler flags: the hardware paths use
// per-function target attributes, so the target builds without unsafe flags.
#include "ccrc32c.h"

#include <string.h>

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static int table_ready = 0;

static void build_table(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = table[0][n];
        for (int t = 1; t < 8; t++) {
            c = table[0][c & 0xff] ^ (c >> 8);
            table[t][n] = c;
        }
    }
    __atomic_store_n(&table_ready, 1, __ATOMIC_RELEASE);
}

static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

uint32_t ferry_crc32c_portable(uint32_t crc, const void *data, size_t length) {
    if (!__atomic_load_n(&table_ready, __ATOMIC_ACQUIRE)) build_table();
    const unsigned char *p = (const unsigned char *)data;
    uint32_t c = ~crc;
    while (length && ((uintptr_t)p & 7)) {
        c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        length--;
    }
    while (length >= 8) {
        uint64_t w = load_le64(p) ^ c;
        c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^
            table[5][(w >> 16) & 0xff] ^ table[4][(w >> 24) & 0xff] ^
            table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
            table[1][(w >> 48) & 0xff] ^ table[0][(w >> 56) & 0xff];
        p += 8;
        length -= 8;
    }
    while (length--) c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

__attribute__((target("sse4.2")))
static uint32_t crc32c_hw(uint32_t crc, const void *data, size_t length) {
    const unsigned char *p = (const unsigned char *)data;
    uint64_t c = (uint32_t)~crc;
    while (length && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        length--;
    }
    while (length >= 32) {
        uint64_t a, b, d, e;
        memcpy(&a, p, 8); memcpy(&b, p + 8, 8); memcpy(&d, p + 16, 8); memcpy(&e, p + 24, 8);
        c = _mm_crc32_u64(c, a);
        c = _mm_crc32_u64(c, b);
        c = _mm_crc32_u64(c, d);
        c = _mm_crc32_u64(c, e);
        p += 32;
        length -= 32;
    }
    while (length >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c = _mm_crc32_u64(c, a);
        p += 8;
        length -= 8;
    }
    while (length--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

static int detect_hw(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
#define HAVE_HW_PATH 1

#elif defined(__aarch64__)
#include <arm_acle.h>
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

__attribute__((target("crc")))
static uint32_t crc32c_hw(uint32_t crc, const void *data, size_t length) {
    const unsigned char *p = (const unsigned char *)data;
    uint32_t c = ~crc;
    while (length && ((uintptr_t)p & 7)) {
        c = __crc32cb(c, *p++);
        length--;
    }
    while (length >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c = __crc32cd(c, a);
        p += 8;
        length -= 8;
    }
    while (length--) c = __crc32cb(c, *p++);
    return ~c;
}

static int detect_hw(void) {
#if defined(__APPLE__)
    return 1;  // every Apple ARM64 CPU has the CRC extension
#elif defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#else
    return 0;
#endif
}
#define HAVE_HW_PATH 1
#endif

// 0 = not yet detected, 1 = hardware, 2 = portable
static int chosen = 0;

static int choose(void) {
    int c = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (c) return c;
#ifdef HAVE_HW_PATH
    c = detect_hw() ? 1 : 2;
#else
    c = 2;
#endif
    __atomic_store_n(&chosen, c, __ATOMIC_RELEASE);
    return c;
}

int ferry_crc32c_hardware_available(void) { return choose() == 1; }

uint32_t ferry_crc32c(uint32_t crc, const void *data, size_t length) {
#ifdef HAVE_HW_PATH
    if (choose() == 1) return crc32c_hw(crc, data, length);
#endif
    return ferry_crc32c_portable(crc, data, length);
}
