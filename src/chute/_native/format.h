/* The Zrecord facts the compiled core shares: table and sidecar entries, codec tags, the record
 * cap. Python's copies (store/_format.py) are checked against the module's constants at import. */
#ifndef CHUTE_FORMAT_H
#define CHUTE_FORMAT_H
#include <stdint.h>

/* One entry of the Zrecord table in meta.zr (16 bytes, little-endian, naturally aligned). */
typedef struct {
    uint32_t offset;
    uint32_t phys_length;
    uint32_t logic_length;
    uint16_t chunk_id;
    uint8_t codec;
    uint8_t reserved;
} zr_loc;

/* One entry of chute's checksum sidecar: where the record was when it was summed, and the
 * CRC-32C of its logical bytes. A location that no longer matches the table means the
 * store was changed by a writer that keeps no sidecar: the record cannot be checked. */
typedef struct {
    uint32_t crc;
    uint32_t offset;
    uint32_t phys_length;
    uint16_t chunk_id;
    uint8_t codec;
    uint8_t valid;
} zr_sum;

enum { CODEC_RAW = 0, CODEC_ZSTD = 1, CODEC_ZSTD_DICT = 2 };
enum { MAX_RECORD = 1u << 20 };

#endif
