/* CRC-32C (Castagnoli), hardware-accelerated where the CPU has SSE4.2. */
#ifndef CHUTE_CRC32C_H
#define CHUTE_CRC32C_H
#include <stddef.h>
#include <stdint.h>

/* Builds the fallback tables; call once before any thread uses chute_crc32c. */
void chute_crc32c_init(void);
uint32_t chute_crc32c(uint32_t crc, const void *buf, size_t len);

#endif
