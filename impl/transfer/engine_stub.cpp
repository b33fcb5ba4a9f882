// Built when PAGEDKV_UCX is off: transfers are a documented, clean refusal.
#include "transfer/engine.h"

namespace pagedkv {

std::shared_ptr<TransferEngine> TransferEngine::create(const TransferOptions&) {
  fail(Errc::kUnsupported,
       "this build of pagedkv has no UCX transport (configure with -DPAGEDKV_UCX=ON and "
       "libucx-dev installed)");
}

}  // namespace pagedkv
