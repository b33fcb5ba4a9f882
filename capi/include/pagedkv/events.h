/* pagedkv/events.h: KV events with what vLLM's carry (token ids, block
 * size, medium), and a publisher that sends them over ZeroMQ exactly as
 * vLLM's ZmqEventPublisher does, so a router written for vLLM's KV events
 * consumes a pagedkv engine's stream unchanged (docs/scale-out.md).
 *
 * Both read the pool's event queue (pkv_pool_options.enable_events): each
 * event is delivered once, to whichever of pkv_pool_drain_events,
 * pkv_pool_drain_events_v2 or a publisher drains it first.
 */
#ifndef PAGEDKV_EVENTS_H
#define PAGEDKV_EVENTS_H

#include "pagedkv/common.h"
#include "pagedkv/pool.h"
#include "pagedkv/tiers.h"

#ifdef __cplusplus
extern "C" {
#endif

/* pkv_event_v2.medium is a PKV_MEDIUM_* of pagedkv/tiers.h: DEVICE ("GPU"
 * or "CPU" on the wire), HOST ("CPU"), FILE ("DISK"). pkv_pool_drain_events
 * (version 1) returns device events only; the versioned drain returns all. */

typedef struct pkv_event_v2 {
  uint32_t struct_size; /* sizeof(pkv_event_v2) of the caller's header; set it */
  uint32_t type;        /* PKV_EVENT_* */
  uint64_t seq_no;      /* as pkv_event.seq_no (device events; tier events count
                           in a sequence of their own: tiers.h) */
  int32_t block_id;
  uint32_t medium; /* PKV_MEDIUM_* */
  pkv_block_hash block_hash;
  pkv_block_hash parent_hash; /* meaningful when has_parent */
  uint32_t has_parent;        /* 0 for the first block of a sequence */
  uint32_t num_tokens;        /* as pkv_event.num_tokens */
  uint64_t lora_id;
  uint32_t block_size;    /* the pool's tokens per block */
  uint32_t num_token_ids; /* ids written at token_buf + token_offset: block_size
                             for a stored block of the device (PKV_MEDIUM_DEVICE),
                             else 0 (tier events carry none, as vLLM's offloading
                             events: docs/scale-out.md) */
  uint64_t token_offset;  /* where in the caller's token buffer */
} pkv_event_v2;

/* Moves up to capacity oldest events into out, in order, every medium.
 * Every element of out must have struct_size set (sizeof(pkv_event_v2),
 * or the size of an older header's struct). The token ids of stored
 * blocks go to token_buf (token_capacity entries), one block after the
 * other; the drain stops before the first event whose ids do not fit, so
 * nothing is lost (that event comes first next time). If not even the
 * first pending event fits, PKV_E_BUFFER_TOO_SMALL, naming the room it
 * needs. token_buf may be NULL when token_capacity is 0. */
PKV_API pkv_status pkv_pool_drain_events_v2(pkv_pool* pool, pkv_event_v2* out, uint64_t capacity,
                                            int32_t* token_buf, uint64_t token_capacity,
                                            uint64_t* out_count);

/* ------------------------------------------------------------ publisher */

typedef struct pkv_event_publisher pkv_event_publisher;

#define PKV_EVENTS_ENCODING_MAP 0   /* each event a msgspec map (vLLM after PR 42892) */
#define PKV_EVENTS_ENCODING_ARRAY 1 /* each event a tagged array (vLLM 0.9 to 0.23) */
#define PKV_EVENTS_HASH_INT 0       /* uint64 of the digest's last 8 bytes (vLLM's default) */
#define PKV_EVENTS_HASH_BYTES 1     /* the whole digest, msgpack bin */

typedef struct pkv_event_publisher_options {
  uint32_t struct_size;        /* set by _init */
  uint32_t data_parallel_rank; /* in every batch; offsets a tcp endpoint's port (an
                                  inproc name gets "_dp<rank>"), as vLLM. Default 0 */
  const char* topic;           /* first frame of every message; copied. Default "" */
  uint64_t buffer_steps;       /* batches kept for replay; default 10000 */
  int32_t hwm;                 /* PUB send high-water mark; default 100000 */
  uint32_t event_encoding;     /* PKV_EVENTS_ENCODING_*; default MAP */
  uint32_t hash_encoding;      /* PKV_EVENTS_HASH_*; default INT */
  uint32_t reserved;           /* 0 */
  const char* device_medium;   /* medium string of PKV_MEDIUM_DEVICE blocks; copied.
                                  NULL (default) = "GPU" for a CUDA pool, "CPU" for a
                                  CPU pool (vLLM itself always says "GPU") */
  /* Added after the first release (read only when struct_size covers it): */
  uint32_t replay_with_topic; /* 1: replay answers carry the topic frame, as vLLM 0.33
                                 on (its PR 45177); 0 (default): as earlier vLLM */
  uint32_t reserved1;         /* 0 */
} pkv_event_publisher_options;

PKV_API void pkv_event_publisher_options_init(pkv_event_publisher_options* opts);
/* pkv_event_publisher_options_init's defaults into exactly size bytes (pass sizeof *opts), zero
 * past the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_event_publisher_options_init_sized(pkv_event_publisher_options* opts,
                                                          size_t size);

/* A publisher of pool's KV events (the pool must have enable_events).
 * endpoint: the PUB address, bound when it holds '*' or '::' or is ipc://
 * or inproc://, else connected (vLLM's rule): "tcp://" then "*:5557"
 * binds port 5557 on every interface.
 * The multicast transports (pgm://, epgm://, norm://) are refused as
 * PKV_E_INVALID_ARGUMENT, for either endpoint: libzmq aborts the process
 * when a NORM session fails to start, and OpenPGM writes to stderr.
 * replay_endpoint: NULL for none, or a ROUTER address to bind: a request
 * [start seq, 8 bytes big endian] (read as vLLM reads it: any length, empty
 * = 0, past 64 bits = after every batch) is answered with every buffered
 * [seq, batch] from there and then [-1, empty]; with
 * opts->replay_with_topic, [topic, seq, batch] and then ["", -1, empty]
 * (vLLM 0.33's framing). opts: NULL for defaults.
 * The publisher keeps the pool alive. PKV_E_UNSUPPORTED in a build
 * without PAGEDKV_EVENTS. */
PKV_API pkv_status pkv_event_publisher_create(pkv_pool* pool, const char* endpoint,
                                              const char* replay_endpoint,
                                              const pkv_event_publisher_options* opts,
                                              pkv_event_publisher** out);

/* Drains every pending event of the pool and sends them as one
 * KVEventBatch [ts, events, data_parallel_rank] with the next sequence
 * number (0, 1, 2...). Call it once per engine step. Nothing is sent when
 * no event is pending. out_num_events (may be NULL): pool events drained. */
PKV_API pkv_status pkv_event_publisher_publish(pkv_event_publisher* pub, uint64_t* out_num_events);

typedef struct pkv_event_publisher_stats {
  uint32_t struct_size;
  uint32_t reserved;
  uint64_t batches_published;     /* messages sent (= the next sequence number) */
  uint64_t events_published;      /* vLLM events in them */
  uint64_t pool_events_published; /* pool events drained into them */
  uint64_t pool_events_dropped;   /* pool events lost to max_events since the
                                     publisher was created: a router's view may
                                     be missing blocks */
  uint64_t replay_requests;
} pkv_event_publisher_stats;

PKV_API void pkv_event_publisher_stats_init(pkv_event_publisher_stats* stats);
/* pkv_event_publisher_stats_init's defaults into exactly size bytes (pass sizeof *stats), zero past
 * the fields this library knows; struct_size = size (common.h, "versioned structs"). */
PKV_API pkv_status pkv_event_publisher_stats_init_sized(pkv_event_publisher_stats* stats,
                                                        size_t size);
PKV_API pkv_status pkv_event_publisher_get_stats(const pkv_event_publisher* pub,
                                                 pkv_event_publisher_stats* out);

/* The PUB endpoint after the rank offset (a bound one as ZeroMQ reports
 * it, so "tcp://127.0.0.1:" + "*" names the port it got), NUL-terminated into buf
 * (capacity bytes); PKV_E_BUFFER_TOO_SMALL with *out_len the length
 * needed (without the NUL). which: 0 = endpoint, 1 = replay endpoint. */
PKV_API pkv_status pkv_event_publisher_endpoint(const pkv_event_publisher* pub, uint32_t which,
                                                char* buf, uint64_t capacity, uint64_t* out_len);

/* Stops the replay thread and closes the sockets (undelivered messages are
 * dropped). NULL is a no-op. */
PKV_API void pkv_event_publisher_destroy(pkv_event_publisher* pub);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_EVENTS_H */
