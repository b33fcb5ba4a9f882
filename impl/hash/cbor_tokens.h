// A block's token ids as CBOR integers (the bulk of a block hash's input)
// at the widest vector width the CPU has. XXH3 hashes a block's ~90 bytes
// faster than the scalar or SSE2 encoder writes them, so the encoder sets
// the rate of XXH3 block hashing (bench_hash: `prefix` against
// `digest_only`).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagedkv {
namespace cbor {

// put_int32s (cbor_writer.h), through AVX2 where the CPU has it: the same
// bytes, and the same room needed (n * kMaxInt32Size + kInt32sSlack).
uint8_t* put_tokens(uint8_t* p, const int32_t* t, size_t n);

using PutInt32s = uint8_t* (*)(uint8_t* p, const int32_t* t, size_t n);

// The AVX2 encoder, or nullptr where it is not built or the CPU lacks
// AVX2 (put_tokens then uses put_int32s).
PutInt32s avx2_put_int32s();

}  // namespace cbor
}  // namespace pagedkv
