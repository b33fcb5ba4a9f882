// The bad-input matrix: for every function of the C ABI, each class of bad
// argument, the status the documentation promises and the word the error
// message must contain. One table feeds both the test (bad_input_test.cpp
// runs every case on a fresh environment and checks that nothing changed)
// and the generated section of docs/errors.md (errors_table_main.cpp), so
// the two cannot drift apart.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace pkv_rel {

// A fresh set of objects per case: a CPU pool with storage and a
// manager-only pool, sequences in every state, plans, valid tensors.
struct Env {
  pkv_pool* pool = nullptr;        // CPU, f32, block 16, 32 blocks, 2 layers, 2 KV heads, dim 64
  pkv_pool* mgr = nullptr;         // manager only (num_layers 0), block 4, 16 blocks
  pkv_seq_id a = 0;                // 40 tokens in pool
  pkv_seq_id b = 0;                // fork of a plus 3 tokens
  pkv_seq_id empty = 0;            // created, nothing appended
  pkv_seq_id dead = 0;             // freed: a stale id
  pkv_seq_id unknown = 0;          // never issued
  pkv_seq_id m = 0;                // 10 tokens in mgr
  pkv_batch* batch = nullptr;      // plan over a (8 queries) and b (3)
  pkv_batch* mgr_batch = nullptr;  // plan over m (2)
  int64_t rows = 11;               // query rows of batch
  std::vector<float> k, v, q, out, lse;
  pkv_tensor kt{}, vt{}, qt{}, ot{}, lt{};  // valid for batch
  int32_t tokens[64] = {};
  pkv_block_hash hashes[8] = {};
  int32_t table[64] = {};
  pkv_event events[8] = {};
  uint64_t u64 = 0;
  pkv_seq_id id_out = 0;
  char msg[64] = {};

  Env();
  ~Env();
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
};

// Classes of bad argument (the columns of the table in docs/errors.md).
#define PKV_CLASS_NULL "NULL pointer"
#define PKV_CLASS_RANGE "out of range"
#define PKV_CLASS_STALE "stale id"
#define PKV_CLASS_UNKNOWN "unknown id"
#define PKV_CLASS_SHAPE "wrong shape"
#define PKV_CLASS_DTYPE "wrong dtype"
#define PKV_CLASS_DEVICE "wrong device"
#define PKV_CLASS_STRIDE "wrong stride"
#define PKV_CLASS_ABSURD "absurd size"
#define PKV_CLASS_STRUCT "bad struct_size"
#define PKV_CLASS_STATE "wrong state"
#define PKV_CLASS_CAPACITY "buffer too small"
#define PKV_CLASS_EXHAUSTED "not enough blocks"
#define PKV_CLASS_OVERFLOW "extent overflow"
#define PKV_CLASS_ALIGN "misaligned"
#define PKV_CLASS_ALIAS "aliasing"

struct Case {
  const char* fn;      // C function
  const char* cls;     // PKV_CLASS_*
  const char* what;    // the bad argument, as the table shows it
  pkv_status want;     // documented status (PKV_OK for functions without one)
  const char* needle;  // must appear in pkv_last_error_message(); NULL: no message (void/value)
  const char* result;  // for functions without a status: what they do instead
  pkv_status (*call)(Env&);  // returns the status (or PKV_OK / PKV_E_INTERNAL for value checks)
  pkv_status want_alt = 1;   // a second acceptable status (build-dependent), 1 = none
  void (*setup)(Env&) = nullptr;  // puts the objects in the state the case needs
};

const std::vector<Case>& bad_input_cases();

// Name of a status code ("PKV_E_NOT_FOUND").
const char* status_name(pkv_status s);

}  // namespace pkv_rel
