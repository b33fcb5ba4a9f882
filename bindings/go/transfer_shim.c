/* transfer_shim.c: pkvgo_* wrappers of pagedkv/transfer.h (see shim.h). */
#include "transfer_shim.h"

pkvgo_result pkvgo_transfer_engine_create(const pkv_transfer_options* opts,
                                          pkv_transfer_engine** out) {
  return pkvgo_capture(pkv_transfer_engine_create(opts, out));
}
pkvgo_result pkvgo_transfer_engine_progress(pkv_transfer_engine* engine) {
  return pkvgo_capture(pkv_transfer_engine_progress(engine));
}
pkvgo_result pkvgo_transfer_export(pkv_transfer_engine* engine, pkv_pool* pool, pkv_seq_id seq,
                                   uint64_t* out_export_id) {
  return pkvgo_capture(pkv_transfer_export(engine, pool, seq, out_export_id));
}
pkvgo_result pkvgo_transfer_export_descriptor(pkv_transfer_engine* engine, uint64_t export_id,
                                              uint8_t* buf, uint64_t capacity, uint64_t* out_size) {
  return pkvgo_capture(pkv_transfer_export_descriptor(engine, export_id, buf, capacity, out_size));
}
pkvgo_result pkvgo_transfer_export_release(pkv_transfer_engine* engine, uint64_t export_id) {
  return pkvgo_capture(pkv_transfer_export_release(engine, export_id));
}
pkvgo_result pkvgo_transfer_engine_num_exports(pkv_transfer_engine* engine, uint64_t* out) {
  return pkvgo_capture(pkv_transfer_engine_num_exports(engine, out));
}
pkvgo_result pkvgo_transfer_import(pkv_transfer_engine* engine, pkv_pool* pool,
                                   const pkv_seq_options* opts, const uint8_t* descriptor,
                                   uint64_t size, pkv_transfer** out) {
  return pkvgo_capture(pkv_transfer_import(engine, pool, opts, descriptor, size, out));
}
pkvgo_result pkvgo_transfer_poll(pkv_transfer* transfer, uint32_t* out_state, pkv_seq_id* out_seq) {
  return pkvgo_capture(pkv_transfer_poll(transfer, out_state, out_seq));
}
pkvgo_result pkvgo_transfer_cancel(pkv_transfer* transfer) {
  return pkvgo_capture(pkv_transfer_cancel(transfer));
}
pkvgo_result pkvgo_transfer_bytes(const pkv_transfer* transfer, uint64_t* out) {
  return pkvgo_capture(pkv_transfer_bytes(transfer, out));
}
