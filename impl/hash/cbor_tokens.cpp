#include "hash/cbor_tokens.h"

#include "hash/cbor_writer.h"

namespace pagedkv {
namespace cbor {

uint8_t* put_tokens(uint8_t* p, const int32_t* t, size_t n) {
  static const PutInt32s chosen = [] {
    const PutInt32s a = avx2_put_int32s();
    return a ? a : static_cast<PutInt32s>(put_int32s);
  }();
  return chosen(p, t, n);
}

}  // namespace cbor
}  // namespace pagedkv
