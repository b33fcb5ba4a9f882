// The pool's side of moving a sequence's K/V to another pool
// (impl/ucx/): pinning what is exported, and attaching what is imported
// as written blocks (DESIGN.md §9).
#include "kv_pool.h"
#include "seq_util.h"

namespace pagedkv {

Pool::ExportSnapshot Pool::export_pin(SeqId id) {
  if (!has_storage())
    fail(Errc::kInvalidState, "the pool has no KV storage (num_layers 0): nothing to export");
  if (opts_.is_mla())
    fail(Errc::kUnsupported,
         "pool is an MLA pool (kv_layout PKV_KV_LAYOUT_MLA): its one latent plane per layer does "
         "not transfer (yet); descriptors describe K and V planes");
  // A fork holds a reference on every block: eviction cannot reuse them and
  // a later append of the owner into a shared tail copies it first. Hidden:
  // no caller can free it under a peer's reads (SeqTable::InternalScope).
  const SeqId pin = fork(id, true);
  SeqTable::InternalScope scope;
  std::unique_lock<OpMutex> lock(mu_);
  ExportSnapshot x;
  try {
    const Sequence& s = seq_or_throw(pin);
    if (s.num_null > 0)
      fail(Errc::kUnsupported, seq_name(id) +
                                   " has blocks released by the sliding window; only whole "
                                   "sequences can be exported");
    const uint64_t n = computed_tokens(s, s.num_committed);
    if (n == 0)
      fail(Errc::kInvalidState,
           seq_name(id) + " has no computed tokens (no committed step wrote its K/V)");
    const uint64_t bs = opts_.block_size;
    x.pin = pin;
    x.tokens.assign(s.tokens.begin(), s.tokens.begin() + n);
    x.blocks.assign(s.blocks.begin(), s.blocks.begin() + (n + bs - 1) / bs);
    x.hashes.assign(s.hashes.begin(),
                    s.hashes.begin() + std::min<uint64_t>(s.hashes.size(), n / bs));
    x.lora_id = s.ctx.lora_id;
    // A copy-on-write copy still pending may be what fills written slots
    // of an exported block (a fork child's copied tail, a partial hit's
    // block; they count as written at once): it runs, and completes,
    // before the peer reads them. Queued offloads read first what the
    // copies overwrite.
    if (!blocks_.pending_copies().empty()) {
      void* const stream = tiers_ ? tiers_->source_stream() : nullptr;
      if (tiers_) settle_tiers_slow(stream);
      backend_->synchronize_device();  // CUDA: what the copies read was written on any stream
      run_pending_copies(stream);
      backend_->synchronize(stream);
    }
  } catch (...) {
    lock.unlock();
    free(pin);
    throw;
  }
  return x;
}

SeqId Pool::import_begin(const SeqOptions& o, const int32_t* tokens, uint64_t n) {
  if (!has_storage())
    fail(Errc::kInvalidState, "the pool has no KV storage (num_layers 0): nothing to import into");
  // Hidden until import_commit hands it to the caller: nobody else frees
  // or appends to the blocks the import writes.
  const SeqId id = seq_create(o, true);
  SeqTable::InternalScope scope;
  try {
    append(id, tokens, n, 0);
    // The fresh blocks may have been evicted from the prefix cache by this
    // append, their offloads only queued: the copy thread still reads them.
    // The import writes them (outside every lock, on the transport's
    // progress), so it waits first, as every writer of the storage does
    // (tiers.h); on CUDA until the copies completed on the device.
    std::lock_guard<OpMutex> lock(mu_);
    check_open();
    // Copy-on-write copies still pending may read or write the blocks the
    // append just took (freed since the copies were recorded): they run,
    // and complete, before the import writes those blocks.
    const bool copies = !blocks_.pending_copies().empty();
    void* const stream = tiers_ ? tiers_->source_stream() : nullptr;
    if (tiers_) {
      settle_tiers_slow(stream);
      tiers_->wait_idle();
    }
    if (copies) {
      backend_->synchronize_device();  // CUDA: what the copies read was written on any stream
      run_pending_copies(stream);
      backend_->synchronize(stream);
    }
  } catch (...) {
    try {
      free(id);
    } catch (...) {  // the pool was destroyed: the sequence went with it
    }
    throw;
  }
  return id;
}

void Pool::import_commit(SeqId id) {
  SeqTable::InternalScope scope;
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  Sequence& s = seq_or_throw(id);
  const uint64_t bs = opts_.block_size, n = s.tokens.size();
  std::vector<WrittenRange> rs;
  rs.reserve(s.blocks.size());
  for (size_t j = 0; j * bs < n; ++j)
    rs.push_back({s.blocks[j], 0, uint32_t(std::min<uint64_t>(bs, n - j * bs))});
  apply_written(rs);  // may throw before any change
  s.num_committed = n;
  seqs_.set_hidden(id, false);  // the caller's now
}

Pool::ArenaRef Pool::arena_ref() const {
  OpMutex::ConstGuard lock(mu_);
  check_open();
  return {arena_, arena_hold_};
}

std::vector<int32_t> Pool::block_table_copy(SeqId id) const {
  SeqTable::InternalScope scope;
  OpMutex::ConstGuard lock(mu_);
  return seq_or_throw(id).blocks;
}

}  // namespace pagedkv
