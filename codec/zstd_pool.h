// Zstd contexts shared by the codec's encoders and decoders over their lifetimes. Making a
// context costs more than compressing a small frame (a fetch of a few records made and freed
// one on each side), so a finished FrameEncoder's or FrameDecoder's contexts go back to a small
// process-wide pool, reset, for the next one; past the pool's room (or past a size worth keeping)
// they are freed.
#ifndef SLUICE_CODEC_ZSTD_POOL_H_
#define SLUICE_CODEC_ZSTD_POOL_H_

#include <zstd.h>

#include <cstddef>

namespace sluice::zstd_pool {

/// Idle contexts kept, of each kind, and the largest kept.
inline constexpr size_t kMaxIdle = 8;
inline constexpr size_t kMaxKeptBytes = 4u << 20;

ZSTD_CCtx* TakeCCtx();
void GiveCCtx(ZSTD_CCtx* cctx);  // null: nothing
ZSTD_DCtx* TakeDCtx();
void GiveDCtx(ZSTD_DCtx* dctx);
/// Idle contexts now (for tests).
size_t IdleCCtx();
size_t IdleDCtx();

}  // namespace sluice::zstd_pool

#endif  // SLUICE_CODEC_ZSTD_POOL_H_
