/* The few libzstd prototypes chute uses. The machines here ship libzstd.so.1 but not
 * zstd.h, so they are declared by hand; all are stable API since zstd 1.3. */
#ifndef CHUTE_ZSTD_API_H
#define CHUTE_ZSTD_API_H
#include <stddef.h>

typedef struct ZSTD_CCtx_s ZSTD_CCtx;
typedef struct ZSTD_DCtx_s ZSTD_DCtx;
typedef struct ZSTD_CDict_s ZSTD_CDict;
typedef struct ZSTD_DDict_s ZSTD_DDict;

size_t ZSTD_compressBound(size_t srcSize);
int ZSTD_minCLevel(void); /* since zstd 1.4.0 */
int ZSTD_maxCLevel(void);
unsigned ZSTD_isError(size_t code);
ZSTD_CCtx *ZSTD_createCCtx(void);
size_t ZSTD_freeCCtx(ZSTD_CCtx *cctx);
ZSTD_DCtx *ZSTD_createDCtx(void);
size_t ZSTD_freeDCtx(ZSTD_DCtx *dctx);
size_t ZSTD_compressCCtx(ZSTD_CCtx *cctx, void *dst, size_t dstCapacity, const void *src,
                         size_t srcSize, int compressionLevel);
size_t ZSTD_decompressDCtx(ZSTD_DCtx *dctx, void *dst, size_t dstCapacity, const void *src,
                           size_t srcSize);
ZSTD_CDict *ZSTD_createCDict(const void *dictBuffer, size_t dictSize, int compressionLevel);
size_t ZSTD_freeCDict(ZSTD_CDict *cdict);
ZSTD_DDict *ZSTD_createDDict(const void *dictBuffer, size_t dictSize);
size_t ZSTD_freeDDict(ZSTD_DDict *ddict);
size_t ZSTD_compress_usingCDict(ZSTD_CCtx *cctx, void *dst, size_t dstCapacity, const void *src,
                                size_t srcSize, const ZSTD_CDict *cdict);
size_t ZSTD_decompress_usingDDict(ZSTD_DCtx *dctx, void *dst, size_t dstCapacity,
                                  const void *src, size_t srcSize, const ZSTD_DDict *ddict);
size_t ZSTD_CCtx_reset(ZSTD_CCtx *cctx, int reset);
size_t ZSTD_CCtx_setParameter(ZSTD_CCtx *cctx, int param, int value);
size_t ZSTD_CCtx_refCDict(ZSTD_CCtx *cctx, const ZSTD_CDict *cdict);
size_t ZSTD_compress2(ZSTD_CCtx *cctx, void *dst, size_t dstCapacity, const void *src,
                      size_t srcSize);
enum { ZSTD_RESET_SESSION_AND_PARAMETERS = 3 };
/* Experimental parameter (ZSTD_c_forceAttachDict = ZSTD_c_experimentalParam4), stable in value
 * since zstd 1.3.6; a library that does not know it rejects it, and chute carries on without. */
enum { ZSTD_C_FORCE_ATTACH_DICT = 1001, ZSTD_DICT_FORCE_ATTACH = 1 };

size_t ZDICT_trainFromBuffer(void *dictBuffer, size_t dictBufferCapacity,
                             const void *samplesBuffer, const size_t *samplesSizes,
                             unsigned nbSamples);
unsigned ZDICT_isError(size_t errorCode);
const char *ZDICT_getErrorName(size_t errorCode);

#endif
