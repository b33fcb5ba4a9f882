// Whether a pool can take what a descriptor describes (same geometry,
// dtype and FP8 scales): Error(kInvalidArgument) naming the first field
// that differs, before anything is allocated.
#pragma once

#include "kv_pool.h"
#include "transfer/descriptor.h"

namespace pagedkv {

void check_importable(const TransferDescriptor& d, const Pool& pool);
// The descriptor fields that describe pool's layout.
void describe_layout(const Pool& pool, TransferDescriptor* d);

}  // namespace pagedkv
