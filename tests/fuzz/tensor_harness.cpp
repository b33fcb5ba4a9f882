// The tensor/attention entry-point harness (fuzz_tensors, tensor_replay):
// each input builds a small CPU pool and plan, then drives pkv_cache_write,
// pkv_attention_forward, pkv_pool_copy_blocks and pkv_pool_swap_blocks with
// descriptors decoded from the bytes: shapes, strides, byte offsets, dtypes,
// devices, misaligned data pointers, outputs aliasing inputs or the pool's
// own storage, and writes into the callers' copy of the plan arrays.
//
// Every buffer is allocated to exactly the bytes its descriptor spans (as a
// correct caller would), so ASan reports any access outside it. A call the
// library accepts must also have been a correct call, as the harness judges
// it independently: extent within the address space, aligned, outputs with
// no two elements on one byte and disjoint from q and the KV storage; and
// it must have written nothing but the output elements described.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "ops_harness.h"
#include "pagedkv/pagedkv.h"

namespace pkv_fuzz {
namespace {

Counters g_counters;

[[noreturn]] void die(const char* what, const char* detail = "") {
  std::fprintf(stderr, "pkv_fuzz_tensors: %s %s (last error: %s)\n", what, detail,
               pkv_last_error_message());
  std::abort();
}

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | u8();
    return v;
  }
  uint32_t pick(uint32_t k) { return k ? u8() % k : 0; }
  bool done() const { return n == 0; }
};

size_t elem_size(uint32_t dtype) {
  return dtype == PKV_DTYPE_F32 || dtype == PKV_DTYPE_I32 ? 4 : dtype == PKV_DTYPE_I64 ? 8 : 2;
}

// A caller's buffer: exactly `bytes` bytes on the heap (ASan redzones on
// both sides), filled with a pattern so changes show.
struct Buffer {
  std::unique_ptr<uint8_t[]> mem;
  size_t bytes = 0;
  std::vector<uint8_t> before;
  void make(size_t n, uint8_t seed) {
    bytes = n;
    mem.reset(new uint8_t[n ? n : 1]);
    for (size_t i = 0; i < n; ++i) mem[i] = uint8_t(seed + i * 131);
    before.assign(mem.get(), mem.get() + n);
  }
};

// The descriptor a step would pass, as the harness understands it.
struct Desc {
  pkv_tensor t{};
  Buffer buf;
  bool real = false;             // buf backs exactly t's extent
  bool must_reject = false;      // overflowing extent, empty shape, negative stride
  bool aliased = false;          // points into another argument or the pool's storage
  bool skip = false;             // a huge representable extent: no call to make
  uintptr_t begin = 0, end = 0;  // harness-computed extent (real or aliased)
  bool callable() const { return !skip && (real || must_reject || aliased); }
};

const int64_t kOddStrides[] = {
    0, 1, 2, 3, -1, 7, 64, 1ll << 31, 1ll << 40, 1ll << 62, std::numeric_limits<int64_t>::max()};

// Strides the library uses: explicit ones, or dense row-major when all are 0.
void eff_strides(const pkv_tensor& t, int64_t* s, bool* ovf) {
  bool dense = true;
  for (int i = 0; i < t.ndim; ++i) dense = dense && t.strides[i] == 0;
  int64_t acc = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    s[i] = dense ? acc : t.strides[i];
    if (dense && __builtin_mul_overflow(acc, t.shape[i], &acc)) *ovf = true;
  }
}

// Builds a descriptor of the right kind (`shape`, dtype) and then mutates it
// as the input says; allocates the buffer its extent needs when that is
// small, and marks descriptors that cannot be backed.
void build(Reader& r, Desc& d, uint32_t dtype, int ndim, const int64_t* shape, uint8_t seed) {
  pkv_tensor& t = d.t;
  std::memset(&t, 0, sizeof t);
  t.dtype = dtype;
  t.device_type = PKV_DEVICE_CPU;
  t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) t.shape[i] = shape[i];
  const uint32_t mutations = r.pick(4);
  // Padded strides: a valid strided layout.
  if (r.pick(3) == 0) {
    int64_t acc = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      t.strides[i] = acc;
      acc = acc * t.shape[i] + (i < ndim - 1 ? r.pick(5) : 0);
    }
  }
  size_t misalign = 0;
  for (uint32_t m = 0; m < mutations; ++m) {
    switch (r.pick(9)) {
      case 0:
        t.strides[r.pick(uint32_t(ndim))] = kOddStrides[r.pick(11)];
        break;
      case 1:
        t.shape[r.pick(uint32_t(ndim))] += int64_t(r.pick(5)) - 2;
        break;
      case 2:
        t.byte_offset = r.pick(2) ? r.pick(16) : ~uint64_t(0) - r.pick(128);
        break;
      case 3:
        t.dtype = r.pick(7);
        break;
      case 4:
        t.ndim = int32_t(r.pick(8)) - 1;
        break;
      case 5:
        t.device_type = int32_t(r.pick(4));
        t.device_id = int32_t(r.pick(2));
        break;
      case 6:
        misalign = 1 + r.pick(3);
        break;
      case 7:
        t.shape[r.pick(uint32_t(ndim))] = int64_t(1) << (31 + r.pick(4));
        break;
      default:
        for (int i = 0; i < ndim; ++i) t.strides[i] = 0;
        break;
    }
  }
  // The extent, as the harness computes it (over the dims the library will
  // look at: at most 6, all shapes as given).
  const int nd = t.ndim >= 0 && t.ndim <= PKV_TENSOR_MAX_DIMS ? t.ndim : 0;
  pkv_tensor probe = t;
  probe.ndim = nd;
  int64_t s[PKV_TENSOR_MAX_DIMS];
  bool ovf = false, empty = false, negative = false;
  eff_strides(probe, s, &ovf);
  __int128 last = 0;
  for (int i = 0; i < nd; ++i) {
    if (t.shape[i] <= 0) empty = true;
    if (s[i] < 0) negative = true;
    last += __int128(t.shape[i] - 1) * s[i];
  }
  const size_t es = elem_size(t.dtype);
  const __int128 bytes = (last + 1) * __int128(es);
  if (empty || negative) {
    d.must_reject = true;  // the plan's shapes are positive; strides >= 0
    d.buf.make(64 + misalign, seed);
  } else if (ovf || bytes > __int128(std::numeric_limits<int64_t>::max()) ||
             __int128(t.byte_offset) + bytes > __int128(std::numeric_limits<int64_t>::max())) {
    d.must_reject = true;  // no buffer can back it
    d.buf.make(64 + misalign, seed);
  } else if (__int128(t.byte_offset) + bytes + misalign > (1 << 20)) {
    d.skip = true;  // representable but huge: passing it would be the caller's overflow
    return;
  } else {
    d.real = true;
    d.buf.make(size_t(t.byte_offset + uint64_t(bytes) + misalign), seed);
  }
  // Described bytes start at data + byte_offset; data is misaligned on
  // purpose when the input says so.
  t.data = d.buf.mem.get() + misalign;
  if (d.real) {
    d.begin = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
    d.end = d.begin + size_t(bytes);
    if (size_t(t.byte_offset) + misalign + size_t(bytes) > d.buf.bytes) die("harness: extent");
  }
}

// Marks every byte an accepted descriptor covers; an output may cover no
// byte twice. Returns the mask over the buffer.
std::vector<uint8_t> coverage(const Desc& d, bool output) {
  const pkv_tensor& t = d.t;
  std::vector<uint8_t> mask(d.buf.bytes, 0);
  int64_t s[PKV_TENSOR_MAX_DIMS];
  bool ovf = false;
  eff_strides(t, s, &ovf);
  const size_t es = elem_size(t.dtype);
  const uintptr_t base = reinterpret_cast<uintptr_t>(d.buf.mem.get());
  int64_t idx[PKV_TENSOR_MAX_DIMS] = {};
  for (;;) {
    int64_t off = 0;
    for (int i = 0; i < t.ndim; ++i) off += idx[i] * s[i];
    const size_t at = d.begin - base + size_t(off) * es;
    for (size_t b = 0; b < es; ++b) {
      if (at + b >= mask.size()) die("accepted a descriptor reaching past its buffer");
      if (output && mask[at + b]) die("accepted an output with overlapping elements");
      mask[at + b] = 1;
    }
    int i = t.ndim - 1;
    while (i >= 0 && ++idx[i] == t.shape[i]) idx[i--] = 0;
    if (i < 0) break;
  }
  return mask;
}

void expect_unchanged(const Buffer& b, const char* name) {
  if (b.bytes && std::memcmp(b.mem.get(), b.before.data(), b.bytes) != 0)
    die("an input was modified:", name);
}

// Bytes outside the output's elements keep their pattern.
void expect_only_elements_written(const Desc& d, const char* name) {
  const std::vector<uint8_t> mask = coverage(d, true);
  for (size_t i = 0; i < d.buf.bytes; ++i)
    if (!mask[i] && d.buf.mem[i] != d.buf.before[i])
      die("wrote outside the described output:", name);
}

bool overlaps(const Desc& a, uintptr_t b0, uintptr_t b1) { return a.begin < b1 && b0 < a.end; }

struct Env {
  pkv_pool* pool = nullptr;
  pkv_batch* batch = nullptr;
  pkv_pool_options o{};
  int64_t rows = 0;
  uintptr_t kv0 = 0, kv1 = 0;  // the pool's storage
  ~Env() {
    pkv_batch_destroy(batch);
    pkv_pool_destroy(pool);
  }
};

void check_status(pkv_status s) {
  if (s == PKV_OK) return;
  ++g_counters.failed_calls;
  if (s != PKV_E_INVALID_ARGUMENT && s != PKV_E_INVALID_STATE && s != PKV_E_UNSUPPORTED)
    die("unexpected status", pkv_status_string(s));
  const char* m = pkv_last_error_message();
  if (!m || !*m) die("an error without a message");
}

// Points d at the pool's own storage (an alias the library must refuse for
// outputs and K/V), keeping its extent.
void into_storage(Env& e, Desc& d) {
  if (!d.real) return;
  const uintptr_t shift = d.begin - reinterpret_cast<uintptr_t>(d.t.data);
  const uintptr_t len = d.end - d.begin;
  if (shift + len > e.kv1 - e.kv0) return;  // would not fit inside the storage
  d.t.data = reinterpret_cast<void*>(e.kv0);
  d.begin = e.kv0 + shift;
  d.end = d.begin + len;
  d.real = false;
  d.aliased = true;
}

void cache_write(Env& e, Reader& r) {
  const int64_t shape[3] = {e.rows, int64_t(e.o.num_kv_heads), int64_t(e.o.head_dim)};
  Desc k, v;
  build(r, k, e.o.dtype, 3, shape, 1);
  build(r, v, e.o.dtype, 3, shape, 2);
  if (r.pick(8) == 0) into_storage(e, k);
  if (!k.callable() || !v.callable()) return;
  const uint32_t layer = r.pick(e.o.num_layers + 1);
  const pkv_status s = pkv_cache_write(e.batch, layer, &k.t, &v.t, nullptr);
  ++g_counters.ops;
  check_status(s);
  if (s != PKV_OK) return;
  if (k.must_reject || v.must_reject) die("accepted an impossible descriptor (k or v)");
  // k may be read from another layer's storage, not from the one written.
  const uintptr_t plane2 = (e.kv1 - e.kv0) / e.o.num_layers;  // one layer's K and V
  if (k.aliased && overlaps(k, e.kv0 + layer * plane2, e.kv0 + (layer + 1) * plane2))
    die("accepted k inside the storage of the layer it writes");
  if (k.aliased) return;
  coverage(k, false);
  coverage(v, false);
  expect_unchanged(k.buf, "k");
  expect_unchanged(v.buf, "v");
  ++g_counters.attention_checked;
}

void attention(Env& e, Reader& r) {
  const int64_t heads = int64_t(e.o.num_kv_heads) * (1 + r.pick(2));
  const int64_t shape[3] = {e.rows, heads, int64_t(e.o.head_dim)};
  const int64_t lshape[2] = {e.rows, heads};
  Desc q, out, lse;
  build(r, q, e.o.dtype, 3, shape, 3);
  build(r, out, e.o.dtype, 3, shape, 4);
  const bool want_lse = r.pick(2);
  if (want_lse) build(r, lse, PKV_DTYPE_F32, 2, lshape, 5);
  const uint32_t alias = r.pick(6);
  if (alias == 1 && q.real && out.real) {  // out = q, described the same way
    out.t = q.t;
    out.begin = q.begin;
    out.end = q.end;
    out.real = false;
    out.aliased = true;
  } else if (alias == 2) {
    into_storage(e, out);
  }
  if (!q.callable() || !out.callable() || (want_lse && !lse.callable())) return;
  pkv_attention_params p;
  pkv_attention_params_init(&p);
  if (e.o.sliding_window) p.sliding_window = e.o.sliding_window;
  const pkv_status s =
      pkv_attention_forward(e.batch, 0, &q.t, &out.t, want_lse ? &lse.t : nullptr, &p, nullptr);
  ++g_counters.ops;
  check_status(s);
  if (s != PKV_OK) return;
  if (q.must_reject || out.must_reject || (want_lse && lse.must_reject))
    die("accepted an impossible descriptor (q, out or lse)");
  if (out.aliased) die("accepted out aliasing q or the pool's storage");
  if (overlaps(out, e.kv0, e.kv1)) die("accepted out inside the pool's storage");
  if (want_lse && (overlaps(lse, out.begin, out.end) || overlaps(lse, q.begin, q.end)))
    die("accepted lse overlapping out or q");
  if (overlaps(out, q.begin, q.end)) die("accepted out overlapping q");
  coverage(q, false);
  expect_unchanged(q.buf, "q");
  expect_only_elements_written(out, "out");
  if (want_lse) expect_only_elements_written(lse, "lse");
  ++g_counters.attention_checked;
}

void copy_blocks(Env& e, Reader& r) {
  const uint32_t n = r.pick(6);
  std::vector<int32_t> src(n), dst(n);
  for (uint32_t i = 0; i < n; ++i) {
    src[i] = int32_t(r.pick(uint32_t(e.o.num_blocks) + 2)) - 1;
    dst[i] = int32_t(r.pick(uint32_t(e.o.num_blocks) + 2)) - 1;
  }
  check_status(pkv_pool_copy_blocks(e.pool, src.data(), dst.data(), n, nullptr));
  ++g_counters.ops;
}

void swap_blocks(Env& e, Reader& r) {
  uint64_t bpb = 0;
  if (pkv_pool_bytes_per_block(e.pool, &bpb) != PKV_OK) die("bytes_per_block");
  const uint32_t n = 1 + r.pick(3);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = int32_t(r.pick(uint32_t(e.o.num_blocks) + 1));
  const uint64_t need = n * bpb;
  const uint64_t have = r.pick(4) == 0 ? need - 1 - r.pick(8) : need;
  Buffer host;
  host.make(size_t(need), 9);
  void* ptr = host.mem.get();
  const uint32_t mode = r.pick(8);
  if (mode == 0) ptr = reinterpret_cast<void*>(e.kv0);               // the pool's own storage
  if (mode == 1) ptr = reinterpret_cast<void*>(~uintptr_t(0) - 15);  // + need wraps
  const uint32_t dir = r.pick(3) == 0 ? PKV_SWAP_IN : PKV_SWAP_OUT;
  const pkv_status s = pkv_pool_swap_blocks(e.pool, ids.data(), n, ptr, have, dir, nullptr);
  ++g_counters.ops;
  check_status(s);
  if (s == PKV_OK && (mode == 0 || mode == 1)) die("accepted a swap buffer that overlaps or wraps");
  if (s == PKV_OK && dir == PKV_SWAP_IN) expect_unchanged(host, "host_buffer");
}

// Writes into the callers' copy of the plan arrays: the kernels must not
// care (they keep their own copy).
void tamper_plan(Env& e, Reader& r) {
  pkv_tensor t;
  if (pkv_batch_plan_tensor(e.batch, r.pick(6), &t) != PKV_OK) die("plan_tensor");
  if (t.shape[0] == 0) return;
  const int64_t i = int64_t(r.pick(uint32_t(t.shape[0])));
  const uint64_t v = r.u64();
  if (t.dtype == PKV_DTYPE_I64)
    static_cast<int64_t*>(t.data)[i] = int64_t(v);
  else
    static_cast<int32_t*>(t.data)[i] = int32_t(v);
  ++g_counters.ops;
}

}  // namespace

void run_one(const uint8_t* data, size_t size) {
  ++g_counters.inputs;
  Reader r{data, size};
  Env e;
  pkv_pool_options_init(&e.o);
  e.o.block_size = 4u << r.pick(3);
  e.o.num_blocks = 8 + r.pick(24);
  e.o.num_layers = 1 + r.pick(2);
  e.o.num_kv_heads = 1 + r.pick(2);
  e.o.head_dim = 8u << r.pick(2);
  e.o.dtype = r.pick(3) == 0 ? PKV_DTYPE_F16 : PKV_DTYPE_F32;
  e.o.num_threads = 1;
  if (pkv_pool_create(&e.o, &e.pool) != PKV_OK) die("pool_create");
  pkv_tensor kv;
  if (pkv_pool_kv_tensor(e.pool, 0, PKV_KV_KEY, &kv) != PKV_OK) die("kv_tensor");
  uint64_t bpb = 0;
  pkv_pool_bytes_per_block(e.pool, &bpb);
  e.kv0 = reinterpret_cast<uintptr_t>(kv.data);
  e.kv1 = e.kv0 + size_t(bpb) * e.o.num_blocks;  // every plane of every block
  const uint32_t nseq = 1 + r.pick(3);
  std::vector<pkv_seq_id> seqs(nseq);
  std::vector<uint32_t> q(nseq);
  for (uint32_t i = 0; i < nseq; ++i) {
    if (pkv_seq_create(e.pool, nullptr, &seqs[i]) != PKV_OK) die("seq_create");
    std::vector<int32_t> tokens(1 + r.pick(12));
    for (size_t j = 0; j < tokens.size(); ++j) tokens[j] = int32_t(j + 17 * i);
    if (pkv_seq_append(e.pool, seqs[i], tokens.data(), tokens.size(), 0) != PKV_OK) return;
    q[i] = 1 + r.pick(uint32_t(tokens.size()));
    e.rows += q[i];
  }
  if (pkv_batch_prepare(e.pool, seqs.data(), q.data(), nseq, nullptr, &e.batch) != PKV_OK)
    die("prepare");
  for (int step = 0; step < 24 && !r.done(); ++step) {
    switch (r.pick(6)) {
      case 0:
      case 1:
        cache_write(e, r);
        break;
      case 2:
      case 3:
        attention(e, r);
        break;
      case 4:
        r.pick(2) ? copy_blocks(e, r) : swap_blocks(e, r);
        break;
      default:
        tamper_plan(e, r);
        break;
    }
  }
  if (pkv_pool_validate(e.pool) != PKV_OK) die("validate");
  ++g_counters.validates;
}

const Counters& counters() { return g_counters; }

}  // namespace pkv_fuzz
