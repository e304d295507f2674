/* Per-thread zstd contexts, created on a thread's first use and reused for its life (worker or
 * caller), freed when the thread ends. */
#ifndef CHUTE_ZCTX_H
#define CHUTE_ZCTX_H
#include <stdint.h>

#include "zstd_api.h"

/* The calling thread's context, or NULL when memory ran out. */
ZSTD_DCtx *chute_thread_dctx(void);
ZSTD_CCtx *chute_thread_cctx(void);

/* The calling thread's MAX_RECORD bytes to decode one record into, or NULL. */
uint8_t *chute_thread_scratch(void);

#endif
