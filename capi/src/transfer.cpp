// pagedkv/transfer.h: KV transfers between pools (impl/transfer/).
#include "capi_util.h"
#include "transfer/engine.h"
#ifdef PAGEDKV_WITH_UCX
#include "transfer/ucx_api.h"
#endif

namespace pc = pkv_capi;
using pagedkv::Errc;
using pagedkv::fail;

struct pkv_transfer_engine {
  std::shared_ptr<pagedkv::TransferEngine> impl;
};

struct pkv_transfer {
  std::shared_ptr<pagedkv::Transfer> impl;
};

namespace {

constexpr uint32_t kTransferOptionsV1 = sizeof(pkv_transfer_options);

// The defaults of pkv_transfer_options that are not 0 (for pc::fill_defaults).
void transfer_options_defaults(pkv_transfer_options& o) { o.timeout_ms = 30000; }

pagedkv::TransferEngine& engine_of(pkv_transfer_engine* e) {
  pc::require(e, "engine");
  return *e->impl;
}

pagedkv::Transfer& transfer_of(const pkv_transfer* t) {
  pc::require(t, "transfer");
  return *t->impl;
}

}  // namespace

extern "C" {

uint32_t pkv_transfer_available(void) {
#ifdef PAGEDKV_WITH_UCX
  // Built with UCX, and its runtime (dlopened, not linked) loads here.
  return pagedkv::ucxdl::load(nullptr) != nullptr ? 1 : 0;
#else
  return 0;
#endif
}

void pkv_transfer_options_init(pkv_transfer_options* opts) {
  pc::init_frozen<pc::kTransferOptionsFrozen>(opts, transfer_options_defaults);
}

pkv_status pkv_transfer_options_init_sized(pkv_transfer_options* opts, size_t size) {
  PKV_GUARD(pc::init_sized(opts, "opts", size, kTransferOptionsV1, "pkv_transfer_options",
                           transfer_options_defaults));
}

pkv_status pkv_transfer_engine_create(const pkv_transfer_options* opts, pkv_transfer_engine** out) {
  PKV_GUARD({
    pc::require(out, "out");
    pagedkv::TransferOptions o;
    if (opts) {
      pc::check_struct_size(opts->struct_size, kTransferOptionsV1, "opts", "pkv_transfer_options",
                            "pkv_transfer_options_init");
      o.timeout_ms = opts->timeout_ms;
      if (opts->transports) o.transports = opts->transports;
      o.export_ttl_ms = opts->export_ttl_ms;
    }
    auto h = std::make_unique<pkv_transfer_engine>();
    h->impl = pagedkv::TransferEngine::create(o);
    *out = h.release();
  });
}

void pkv_transfer_engine_destroy(pkv_transfer_engine* engine) {
  if (!engine) return;
  try {
    engine->impl->close();
  } catch (...) {
  }
  delete engine;
}

pkv_status pkv_transfer_engine_progress(pkv_transfer_engine* engine) {
  PKV_GUARD(engine_of(engine).progress());
}

pkv_status pkv_transfer_export(pkv_transfer_engine* engine, pkv_pool* pool, pkv_seq_id seq,
                               uint64_t* out_export_id) {
  PKV_GUARD({
    pagedkv::TransferEngine& e = engine_of(engine);
    pc::require(pool, "pool");
    pc::require(out_export_id, "out_export_id");
    pc::pool_of(pool);  // multi-group pools do not transfer (yet)
    *out_export_id = e.export_seq(pool->impl, seq);
  });
}

pkv_status pkv_transfer_export_descriptor(pkv_transfer_engine* engine, uint64_t export_id,
                                          uint8_t* buf, uint64_t capacity, uint64_t* out_size) {
  PKV_GUARD({
    pagedkv::TransferEngine& e = engine_of(engine);
    pc::require(out_size, "out_size");
    const std::vector<uint8_t> d = e.descriptor(export_id);
    *out_size = d.size();
    if (!buf || capacity < d.size())
      fail(Errc::kBufferTooSmall, "capacity " + std::to_string(buf ? capacity : 0) +
                                      " is below the descriptor's " + std::to_string(d.size()) +
                                      " bytes (*out_size)");
    std::memcpy(buf, d.data(), d.size());
  });
}

pkv_status pkv_transfer_export_release(pkv_transfer_engine* engine, uint64_t export_id) {
  PKV_GUARD(engine_of(engine).release(export_id));
}

pkv_status pkv_transfer_engine_num_exports(pkv_transfer_engine* engine, uint64_t* out) {
  PKV_GUARD({
    pagedkv::TransferEngine& e = engine_of(engine);
    pc::require(out, "out");
    *out = e.num_exports();
  });
}

pkv_status pkv_transfer_import(pkv_transfer_engine* engine, pkv_pool* pool,
                               const pkv_seq_options* opts, const uint8_t* descriptor,
                               uint64_t size, pkv_transfer** out) {
  PKV_GUARD({
    pagedkv::TransferEngine& e = engine_of(engine);
    pc::require(pool, "pool");
    pc::require(descriptor, "descriptor");
    pc::require(out, "out");
    pc::pool_of(pool);  // multi-group pools do not transfer (yet)
    const pagedkv::SeqOptions o = pc::seq_options(opts);
    auto h = std::make_unique<pkv_transfer>();
    h->impl = e.import_seq(pool->impl, o, descriptor, size);
    *out = h.release();
  });
}

pkv_status pkv_transfer_poll(pkv_transfer* transfer, uint32_t* out_state, pkv_seq_id* out_seq) {
  PKV_GUARD({
    pagedkv::Transfer& t = transfer_of(transfer);
    pc::require(out_state, "out_state");
    const pagedkv::Transfer::Status s = t.poll();
    *out_state = uint32_t(s.state);
    if (out_seq) *out_seq = s.state == pagedkv::TransferState::kDone ? s.seq : 0;
    if (s.state == pagedkv::TransferState::kFailed) fail(s.error, s.message);
  });
}

pkv_status pkv_transfer_cancel(pkv_transfer* transfer) {
  PKV_GUARD(transfer_of(transfer).cancel());
}

pkv_status pkv_transfer_bytes(const pkv_transfer* transfer, uint64_t* out) {
  PKV_GUARD({
    const pagedkv::Transfer& t = transfer_of(transfer);
    pc::require(out, "out");
    *out = t.bytes();
  });
}

void pkv_transfer_destroy(pkv_transfer* transfer) { delete transfer; }

}  // extern "C"
