#include "zctx.h"

#include "format.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    ZSTD_DCtx *dctx;
    ZSTD_CCtx *cctx;
    uint8_t *scratch;
} thread_ctx;

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void free_ctx(void *p) {
    thread_ctx *t = p;
    if (!t) return;
    if (t->dctx) ZSTD_freeDCtx(t->dctx);
    if (t->cctx) ZSTD_freeCCtx(t->cctx);
    free(t->scratch);
    free(t);
}

static void make_key(void) { pthread_key_create(&ctx_key, free_ctx); }

static thread_ctx *get_ctx(void) {
    pthread_once(&ctx_once, make_key);
    thread_ctx *t = pthread_getspecific(ctx_key);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t) return NULL;
        pthread_setspecific(ctx_key, t);
    }
    return t;
}

ZSTD_DCtx *chute_thread_dctx(void) {
    thread_ctx *t = get_ctx();
    if (t && !t->dctx) t->dctx = ZSTD_createDCtx();
    return t ? t->dctx : NULL;
}

ZSTD_CCtx *chute_thread_cctx(void) {
    thread_ctx *t = get_ctx();
    if (t && !t->cctx) t->cctx = ZSTD_createCCtx();
    return t ? t->cctx : NULL;
}

uint8_t *chute_thread_scratch(void) {
    thread_ctx *t = get_ctx();
    if (t && !t->scratch) t->scratch = malloc(MAX_RECORD);
    return t ? t->scratch : NULL;
}
