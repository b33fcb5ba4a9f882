/* transfer_shim.h: pkvgo_* wrappers of pagedkv/transfer.h (see shim.h). */
#ifndef PAGEDKV_GO_TRANSFER_SHIM_H
#define PAGEDKV_GO_TRANSFER_SHIM_H

#include "shim.h"

pkvgo_result pkvgo_transfer_engine_create(const pkv_transfer_options* opts,
                                          pkv_transfer_engine** out);
pkvgo_result pkvgo_transfer_engine_progress(pkv_transfer_engine* engine);
pkvgo_result pkvgo_transfer_export(pkv_transfer_engine* engine, pkv_pool* pool, pkv_seq_id seq,
                                   uint64_t* out_export_id);
pkvgo_result pkvgo_transfer_export_descriptor(pkv_transfer_engine* engine, uint64_t export_id,
                                              uint8_t* buf, uint64_t capacity, uint64_t* out_size);
pkvgo_result pkvgo_transfer_export_release(pkv_transfer_engine* engine, uint64_t export_id);
pkvgo_result pkvgo_transfer_engine_num_exports(pkv_transfer_engine* engine, uint64_t* out);
pkvgo_result pkvgo_transfer_import(pkv_transfer_engine* engine, pkv_pool* pool,
                                   const pkv_seq_options* opts, const uint8_t* descriptor,
                                   uint64_t size, pkv_transfer** out);
pkvgo_result pkvgo_transfer_poll(pkv_transfer* transfer, uint32_t* out_state, pkv_seq_id* out_seq);
pkvgo_result pkvgo_transfer_cancel(pkv_transfer* transfer);
pkvgo_result pkvgo_transfer_bytes(const pkv_transfer* transfer, uint64_t* out);

#endif
