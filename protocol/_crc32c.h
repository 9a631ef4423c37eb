/* CRC32C (Castagnoli, reflected, as the crc32c package computes it) for the compiled modules
 * (aiobk.bookie._records, aiobk.protocol._runs):
 * the SSE4.2 instruction where the CPU has it, else a byte table. */
#ifndef AIOBK_CRC32C_H
#define AIOBK_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t aiobk_crc32c_table[256];
static int aiobk_crc32c_hw = 0;

static void aiobk_crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        aiobk_crc32c_table[i] = c;
    }
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    aiobk_crc32c_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t aiobk_crc32c_sw(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n--) crc = aiobk_crc32c_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2")))
static uint32_t aiobk_crc32c_sse42(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = ~crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

/* crc32c.crc32c(data, crc): ``crc`` is the value of the bytes before ``p`` (0 to start). */
static uint32_t aiobk_crc32c(uint32_t crc, const unsigned char *p, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (aiobk_crc32c_hw) return aiobk_crc32c_sse42(crc, p, n);
#endif
    return aiobk_crc32c_sw(crc, p, n);
}

/* The software path whatever the CPU (tests hold both to the crc32c package). */
static uint32_t aiobk_crc32c_portable(uint32_t crc, const unsigned char *p, size_t n) {
    return aiobk_crc32c_sw(crc, p, n);
}

#endif
