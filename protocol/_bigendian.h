/* Big-endian integers in byte buffers, as every aiobk format stores them, for the compiled
 * modules (aiobk.bookie._records, aiobk.protocol._runs). */
#ifndef AIOBK_BIGENDIAN_H
#define AIOBK_BIGENDIAN_H

#include <stdint.h>

static inline void aiobk_put16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static inline void aiobk_put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void aiobk_put64(unsigned char *p, uint64_t v) {
    aiobk_put32(p, (uint32_t)(v >> 32));
    aiobk_put32(p + 4, (uint32_t)v);
}

static inline uint32_t aiobk_get32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline int64_t aiobk_get64(const unsigned char *p) {
    return (int64_t)(((uint64_t)aiobk_get32(p) << 32) | aiobk_get32(p + 4));
}

#endif
