/* Per-thread zstd contexts, created on a thread's first use and reused for its life (worker or
 * caller), freed when the thread ends. */
#ifndef CHUTE_ZCTX_H
#define CHUTE_ZCTX_H
#include "zstd_api.h"

/* The calling thread's context, or NULL when memory ran out. */
ZSTD_DCtx *chute_thread_dctx(void);
ZSTD_CCtx *chute_thread_cctx(void);

#endif
