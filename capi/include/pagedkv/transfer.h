/* pagedkv/transfer.h: moving a sequence's K/V between pools, across
 * processes and machines, over UCX (disaggregated prefill and decode).
 *
 * The prefill side exports a sequence: its computed tokens and the blocks
 * holding them are pinned (held by a hidden fork of the sequence, so no
 * eviction, append or free of the original can reuse them) until the export
 * is released or its TTL runs out, and an opaque descriptor describes them
 * (the engine's UCX worker address, the remote key of the pool's arena, the
 * layout, FP8 scales, token ids, block ids and hashes). The engine ships the
 * descriptor to the decode side any way it likes.
 *
 * The decode side imports the descriptor into its pool: the layout (layers,
 * KV heads, block size, head dim, dtype, FP8 scales) must match exactly
 * (else PKV_E_INVALID_ARGUMENT naming the field, and nothing changes);
 * blocks for every token are allocated all or nothing (PKV_E_OUT_OF_BLOCKS,
 * nothing changes); the K/V is pulled with one-sided reads (ucp_get_nbx)
 * straight into them. pkv_transfer_poll drives it without blocking; on
 * completion a new sequence holds the tokens, every one computed (written
 * blocks, DESIGN.md §9) and its full blocks prefix-cacheable. A transfer
 * that fails (peer gone, timeout, pool destroyed) or is cancelled frees its
 * blocks: the pool is as before (stats, free blocks, validate; its event log
 * shows the blocks stored at allocation and removed again).
 *
 * Memory registration: a pool's whole KV arena is registered once per
 * engine (ucp_mem_map), on its first export. CUDA pools register device
 * memory as UCS_MEMORY_TYPE_CUDA (UCX's cuda_copy / cuda_ipc / GPUDirect
 * transports); that path is compiled but not yet run on a GPU.
 *
 * Transports: UCX picks them (UCX_TLS, or options->transports): shared
 * memory (posix, sysv, cma) between processes of one machine, TCP, RDMA.
 * With TCP the exporter serves reads from its own progress: call
 * pkv_transfer_engine_progress on the exporting engine while imports of its
 * exports run. A peer that can reach the engine's worker can read the whole
 * registered arena of an exported pool, and (UCX 1.13 trusts its peers'
 * bytes) crash the process or write into its memory with crafted packets:
 * only trusted engines may reach its ports (docs/scale-out-transfer.md).
 * A descriptor ends with a checksum of its bytes: one cut or corrupted in
 * transit is PKV_E_INVALID_ARGUMENT at import and nothing is read. The
 * exporter's addresses in it are trusted (they cannot be checked against
 * the exporter's memory; over shared memory a read at a wrong one is a
 * wild read in the importer): import descriptors from trusted peers only.
 *
 * Builds without UCX (CMake PAGEDKV_UCX=OFF or libucx-dev missing) compile
 * the same header; pkv_transfer_available() returns 0 and
 * pkv_transfer_engine_create returns PKV_E_UNSUPPORTED.
 *
 * Threads: every call may come from any thread; an engine serialises its
 * UCX work. Failures of transport and peer are PKV_E_INVALID_STATE with a
 * message naming the UCX status.
 */
#ifndef PAGEDKV_TRANSFER_H
#define PAGEDKV_TRANSFER_H

#include "pagedkv/common.h"
#include "pagedkv/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pkv_transfer_engine pkv_transfer_engine;
typedef struct pkv_transfer pkv_transfer;

/* 1 when this build has the UCX transport and the UCX runtime loads, else 0.
 *
 * libpagedkv does not link UCX: it dlopens libucp.so.0 (Debian's libucx0)
 * on the first call of this function or of pkv_transfer_engine_create, so
 * that merely loading pagedkv never installs UCX's crash-signal handlers in
 * the host process. Before loading it sets UCX_HANDLE_ERRORS=none in the
 * environment unless the user set that variable, for the same reason (Go's
 * runtime, Python's faulthandler and the host's own handlers keep theirs). */
PKV_API uint32_t pkv_transfer_available(void);

typedef struct pkv_transfer_options {
  uint32_t struct_size;   /* sizeof(pkv_transfer_options); set by _init */
  uint32_t timeout_ms;    /* an import not complete by then fails (blocks freed);
                             0 = never. Default 30000 */
  const char* transports; /* UCX_TLS list for this engine ("shm", "tcp", "posix,cma",
                             ...); copied; NULL/"" (default) = UCX's own choice or the
                             UCX_TLS environment variable. A list of which UCX has
                             none here: PKV_E_INVALID_ARGUMENT at engine creation */
  uint32_t export_ttl_ms; /* an export not released by then is released by the engine
                             (on its next call); 0 (default) = until released */
  uint32_t reserved0;
} pkv_transfer_options;

PKV_API void pkv_transfer_options_init(pkv_transfer_options* opts);
/* pkv_transfer_options_init's defaults into exactly size bytes (pass sizeof *opts), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_transfer_options_init_sized(pkv_transfer_options* opts, size_t size);

/* One UCX context and worker. opts may be NULL for defaults. Destroy with
 * pkv_transfer_engine_destroy. */
PKV_API pkv_status pkv_transfer_engine_create(const pkv_transfer_options* opts,
                                              pkv_transfer_engine** out);

/* Releases every export and lets go of the engine; imports still running
 * keep its transport alive until they are destroyed. NULL is a no-op.
 * An engine that exported and whose UCX worker still owes a peer a
 * connection reply after 1 s (a peer alive but not progressing, or gone)
 * is not torn down (UCX 1.13 would abort the process): its UCX worker,
 * sockets and any blocks held for unfinished reads stay for the life of
 * the process, never used again (docs/reliability.md). */
PKV_API void pkv_transfer_engine_destroy(pkv_transfer_engine* engine);

/* Serves peers' reads where the transport needs the exporter's help (TCP)
 * and expires exports past their TTL. Never blocks. */
PKV_API pkv_status pkv_transfer_engine_progress(pkv_transfer_engine* engine);

/* Exports the computed tokens of seq (at least one; a sequence with blocks
 * released by a sliding window is PKV_E_UNSUPPORTED, and so is an MLA pool,
 * PKV_KV_LAYOUT_MLA, here and in pkv_transfer_import: descriptors describe
 * K and V planes; a pool without KV storage, num_layers 0, is
 * PKV_E_INVALID_STATE, here and in pkv_transfer_import) and pins their blocks.
 * The sequence stays the caller's: it may grow, shrink or be freed; the
 * export keeps its own reference. *out_export_id names the export. */
PKV_API pkv_status pkv_transfer_export(pkv_transfer_engine* engine, pkv_pool* pool, pkv_seq_id seq,
                                       uint64_t* out_export_id);

/* The export's descriptor: *out_size is always set to its size; its bytes
 * are copied into buf when capacity suffices, else PKV_E_BUFFER_TOO_SMALL
 * (buf may then be NULL). */
PKV_API pkv_status pkv_transfer_export_descriptor(pkv_transfer_engine* engine, uint64_t export_id,
                                                  uint8_t* buf, uint64_t capacity,
                                                  uint64_t* out_size);

/* Unpins the export's blocks. Importers still reading it read stale or
 * reused blocks (zero bytes once the pool was destroyed too: its arena's
 * pages go back to the system, its addresses stay reserved until the
 * engine is destroyed, so a late read never faults the exporter): release
 * after the importer said it is done. Unknown,
 * released or expired ids: PKV_E_NOT_FOUND. */
PKV_API pkv_status pkv_transfer_export_release(pkv_transfer_engine* engine, uint64_t export_id);

/* Number of exports held (not released, not expired). */
PKV_API pkv_status pkv_transfer_engine_num_exports(pkv_transfer_engine* engine, uint64_t* out);

/* Starts pulling a descriptor's sequence into pool. opts: the new
 * sequence's options (LoRA, cache salt: its block hashes are this pool's,
 * computed from the tokens); NULL for defaults. A sequence exported with a
 * lora_id imported with neither a lora_id nor a lora_name is
 * PKV_E_INVALID_ARGUMENT (its K/V would be cached as the base model's).
 * The descriptor is not kept.
 * Destroy *out with pkv_transfer_destroy. */
PKV_API pkv_status pkv_transfer_import(pkv_transfer_engine* engine, pkv_pool* pool,
                                       const pkv_seq_options* opts, const uint8_t* descriptor,
                                       uint64_t size, pkv_transfer** out);

#define PKV_TRANSFER_RUNNING 0
#define PKV_TRANSFER_DONE 1
#define PKV_TRANSFER_FAILED 2
#define PKV_TRANSFER_CANCELLED 3

/* Drives the transfer and reports its state (PKV_TRANSFER_*). Returns
 * PKV_OK while running, done or cancelled; once failed, the failure's
 * status and message (every later poll too), with *out_state still written
 * (PKV_TRANSFER_FAILED): the one call whose out-parameters a failure writes.
 * DONE: *out_seq (may be NULL) is the new sequence, the caller's to use and
 * free; else 0. */
PKV_API pkv_status pkv_transfer_poll(pkv_transfer* transfer, uint32_t* out_state,
                                     pkv_seq_id* out_seq);

/* Stops the reads and frees the blocks (returns once no read can land in
 * them). While other imports from the same exporter are running on the
 * engine (they share its endpoint), reads of this one already in flight
 * cannot be stopped alone: its blocks then stay held until those reads
 * ended (seen at a later poll or pkv_transfer_engine_progress) or the other
 * imports ended, never freed under a read. No-op when already failed or
 * cancelled; PKV_E_INVALID_STATE when done (the sequence is the caller's). */
PKV_API pkv_status pkv_transfer_cancel(pkv_transfer* transfer);

/* Bytes of K/V the transfer reads. */
PKV_API pkv_status pkv_transfer_bytes(const pkv_transfer* transfer, uint64_t* out);

/* Cancels a running transfer and frees the handle. NULL is a no-op. */
PKV_API void pkv_transfer_destroy(pkv_transfer* transfer);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_TRANSFER_H */
