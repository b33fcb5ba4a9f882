#include "model_runner.h"

#include <chrono>
#include <memory>

#include "kv_values.h"

namespace sim {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct CheckRow {
  const Request* request;
  uint64_t pos;
  uint64_t row;
  uint32_t layer;
};

}  // namespace

ModelRunner::ModelRunner(pkv_pool* pool, const Options& opts, uint32_t dtype, int32_t device_type)
    : pool_(pool),
      opts_(opts),
      dtype_(dtype),
      elem_(pkv_dtype_size(dtype)),
      device_type_(device_type),
      q_state_(mix64(opts.seed ^ 0xA77E47104ull)) {
  const size_t rows = opts.step_tokens;
  q_.resize(rows * opts.q_heads * opts.head_dim * elem_);
  k_.resize(rows * opts.kv_heads * opts.head_dim * elem_);
  v_.resize(k_.size());
  out_.resize(q_.size());
  lse_.resize(rows * opts.q_heads);
  if (device_type == PKV_DEVICE_CUDA) {
    dq_.allocate(device_type, opts.device_id, q_.size());
    dk_.allocate(device_type, opts.device_id, k_.size());
    dv_.allocate(device_type, opts.device_id, v_.size());
    dout_.allocate(device_type, opts.device_id, out_.size());
    dlse_.allocate(device_type, opts.device_id, lse_.size() * sizeof(float));
  }
}

pkv_tensor ModelRunner::tensor(void* data, uint32_t dtype, int64_t rows, int64_t heads,
                               int64_t dim) const {
  pkv_tensor t;
  const int64_t shape[3] = {rows, heads, dim};
  check_status(pkv_tensor_init(data, dtype, device_type_,
                               device_type_ == PKV_DEVICE_CUDA ? opts_.device_id : 0,
                               dim > 0 ? 3 : 2, shape, &t),
               "pkv_tensor_init");
  return t;
}

void ModelRunner::run_step(const std::vector<Chunk>& chunks, uint32_t check_rows, Rng* rng,
                           AttentionCheck* check, StepTimes* times) {
  using clock = std::chrono::steady_clock;
  const uint32_t hq = opts_.q_heads, hk = opts_.kv_heads, dim = opts_.head_dim;
  const bool cuda = device_type_ == PKV_DEVICE_CUDA;

  auto t0 = clock::now();
  std::vector<pkv_seq_id> seqs;
  std::vector<uint32_t> counts;
  std::vector<uint64_t> first_row;
  uint64_t rows = 0;
  for (const Chunk& c : chunks) {
    seqs.push_back(c.request->seq);
    counts.push_back(c.count);
    first_row.push_back(rows);
    rows += c.count;
  }
  pkv_batch* raw = nullptr;
  check_status(
      pkv_batch_prepare(pool_, seqs.data(), counts.data(), uint32_t(seqs.size()), nullptr, &raw),
      "pkv_batch_prepare");
  std::unique_ptr<pkv_batch, void (*)(pkv_batch*)> batch_owner(raw, pkv_batch_destroy);
  pkv_batch* batch = raw;
  times->prepare += seconds_since(t0);

  // Rows to check this step: a random chunk each (so decode rows, which are
  // most of the chunks, are well represented), a random position in it and
  // a random layer.
  std::vector<CheckRow> to_check;
  for (uint32_t i = 0; i < check_rows && !chunks.empty(); ++i) {
    const size_t ci = rng->below(chunks.size());
    const uint64_t off = rng->below(chunks[ci].count);
    to_check.push_back({chunks[ci].request, chunks[ci].start + off, first_row[ci] + off,
                        uint32_t(rng->below(opts_.layers))});
  }

  void* q = cuda ? dq_.data() : q_.data();
  void* k = cuda ? dk_.data() : k_.data();
  void* v = cuda ? dv_.data() : v_.data();
  void* out = cuda ? dout_.data() : out_.data();
  float* lse = cuda ? static_cast<float*>(dlse_.data()) : lse_.data();
  const pkv_tensor tq = tensor(q, dtype_, int64_t(rows), hq, dim);
  const pkv_tensor tk = tensor(k, dtype_, int64_t(rows), hk, dim);
  const pkv_tensor tv = tensor(v, dtype_, int64_t(rows), hk, dim);
  const pkv_tensor tout = tensor(out, dtype_, int64_t(rows), hq, dim);
  const pkv_tensor tlse = tensor(lse, PKV_DTYPE_F32, int64_t(rows), hq, 0);

  std::vector<float> head(dim), q_row(size_t(hq) * dim), out_row(size_t(hq) * dim), lse_row(hq);
  for (uint32_t layer = 0; layer < opts_.layers; ++layer) {
    // The "model": K/V of each new position from its context hash, random
    // queries.
    t0 = clock::now();
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const Chunk& c = chunks[ci];
      for (uint32_t i = 0; i < c.count; ++i) {
        const uint64_t ctx = c.request->context_hash[c.start + i];
        const uint64_t row = first_row[ci] + i;
        for (uint32_t h = 0; h < hk; ++h) {
          const uint64_t base = (row * hk + h) * dim;
          kv_head_values(ctx, layer, 0, h, dim, head.data());
          for (uint32_t d = 0; d < dim; ++d) store_element(k_.data(), dtype_, base + d, head[d]);
          kv_head_values(ctx, layer, 1, h, dim, head.data());
          for (uint32_t d = 0; d < dim; ++d) store_element(v_.data(), dtype_, base + d, head[d]);
        }
      }
    }
    random_queries(&q_state_, q_.data(), dtype_, 0, rows * hq * dim);
    if (cuda) {
      dq_.upload(q_.data(), 0, rows * hq * dim * elem_);
      dk_.upload(k_.data(), 0, rows * hk * dim * elem_);
      dv_.upload(v_.data(), 0, rows * hk * dim * elem_);
    }
    times->host += seconds_since(t0);

    t0 = clock::now();
    check_status(pkv_cache_write(batch, layer, &tk, &tv, nullptr), "pkv_cache_write");
    device_synchronize(device_type_);
    times->write += seconds_since(t0);

    t0 = clock::now();
    pkv_status s = pkv_attention_forward(batch, layer, &tq, &tout, use_lse_ ? &tlse : nullptr,
                                         nullptr, nullptr);
    if (s == PKV_E_UNSUPPORTED && use_lse_) {
      // A build without LSE output: check the outputs alone.
      use_lse_ = false;
      s = pkv_attention_forward(batch, layer, &tq, &tout, nullptr, nullptr, nullptr);
    }
    check_status(s, "pkv_attention_forward");
    device_synchronize(device_type_);
    times->attention += seconds_since(t0);

    t0 = clock::now();
    for (const CheckRow& cr : to_check) {
      if (cr.layer != layer) continue;
      const size_t row_elems = size_t(hq) * dim;
      if (cuda) {
        dout_.download(out_.data() + cr.row * row_elems * elem_, cr.row * row_elems * elem_,
                       row_elems * elem_);
        if (use_lse_)
          dlse_.download(lse_.data() + cr.row * hq, cr.row * hq * sizeof(float),
                         hq * sizeof(float));
      }
      for (size_t e = 0; e < row_elems; ++e) {
        q_row[e] = load_element(q_.data(), dtype_, cr.row * row_elems + e);
        out_row[e] = load_element(out_.data(), dtype_, cr.row * row_elems + e);
      }
      check->check_row(*cr.request, cr.pos, layer, q_row.data(), out_row.data(),
                       use_lse_ ? lse_.data() + cr.row * hq : nullptr);
    }
    times->check += seconds_since(t0);
  }
  t0 = clock::now();
  batch_owner.reset();
  times->prepare += seconds_since(t0);
}

}  // namespace sim
