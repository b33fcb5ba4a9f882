#include "prefix_cache.h"

#include <openssl/rand.h>
// Inlined (static copies in this file): key_of runs for every insert and
// lookup, and the library's call spends more on its length dispatch than a
// 16- or 32-byte digest needs.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <random>

namespace pagedkv {

namespace {

constexpr size_t kSecretSize = 192;  // >= XXH3_SECRET_SIZE_MIN (136)

std::vector<uint8_t> random_secret() {
  std::vector<uint8_t> s(kSecretSize);
  if (RAND_bytes(s.data(), int(s.size())) != 1) {
    std::random_device rd;  // OpenSSL's generator is unavailable: the OS's
    for (uint8_t& b : s) b = uint8_t(rd());
  }
  return s;
}

}  // namespace

PrefixCache::PrefixCache(const BlockHash* hashes, int32_t num_blocks)
    : hashes_(hashes),
      secret_(random_secret()),
      dup_next_(num_blocks, -1),
      dup_prev_(num_blocks, -1),
      dup_tail_(num_blocks, -1) {
  size_t cap = 16;
  while (cap < size_t(num_blocks) * 2) cap <<= 1;
  static_assert(sizeof(Slot) == 8, "two slots per 16 bytes");
  slots_.assign(cap, Slot{-1, 0});
  mask_ = cap - 1;
}

uint32_t PrefixCache::key_of(const BlockHash& h) const {
  return uint32_t(XXH3_64bits_withSecret(h.bytes.data(), h.size, secret_.data(), secret_.size()));
}

size_t PrefixCache::max_displacement() const {
  size_t worst = 0;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].block >= 0) worst = std::max(worst, (i - slots_[i].key) & mask_);
  return worst;
}

size_t PrefixCache::slot_of(const BlockHash& h) const {
  const BlockHash* const hs = hashes_;
  const uint32_t k = key_of(h);
  for (size_t i = k & mask_;; i = (i + 1) & mask_) {
    const Slot s = slots_[i];
    if (s.block < 0) return npos;
    if (s.key == k && hs[s.block] == h) return i;
  }
}

int32_t PrefixCache::find(const BlockHash& h) const {
  size_t i = slot_of(h);
  return i == npos ? -1 : slots_[i].block;
}

void PrefixCache::insert(int32_t block) {
  const BlockHash* const hs = hashes_;
  const BlockHash& h = hs[block];
  const uint32_t k = key_of(h);
  size_t i = k & mask_;
  for (;; i = (i + 1) & mask_) {
    const int32_t b = slots_[i].block;
    if (b < 0) break;
    if (slots_[i].key == k && hs[b] == h) {
      // Same content already mapped: join its chain at the tail, so that the
      // chain stays in caching order and a lookup (the head, then the next
      // on erase) gives the oldest block, as vLLM does. Which one a hit
      // takes decides block ids and the free queue's order.
      const int32_t t = dup_tail_[b] >= 0 ? dup_tail_[b] : b;
      dup_prev_[block] = t;
      dup_next_[block] = -1;
      dup_next_[t] = block;
      dup_tail_[b] = block;
      ++num_entries_;
      return;
    }
  }
  slots_[i] = {block, k};
  dup_prev_[block] = dup_next_[block] = -1;
  dup_tail_[block] = -1;
  ++num_entries_;
}

void PrefixCache::erase(int32_t block) {
  --num_entries_;
  int32_t p = dup_prev_[block], n = dup_next_[block];
  dup_prev_[block] = dup_next_[block] = -1;
  if (p >= 0) {  // not the chain head: unlink only
    dup_next_[p] = n;
    if (n >= 0) {
      dup_prev_[n] = p;
    } else {  // it was the tail: the head's tail moves back
      const int32_t head = slots_[slot_of(hashes_[block])].block;
      dup_tail_[head] = p == head ? -1 : p;
    }
    return;
  }
  size_t i = slot_of(hashes_[block]);
  const int32_t tail = dup_tail_[block];
  dup_tail_[block] = -1;
  if (n >= 0) {  // promote the next block of the chain to head
    dup_prev_[n] = -1;
    dup_tail_[n] = tail == n ? -1 : tail;
    slots_[i].block = n;  // the same hash: the same key
    return;
  }
  // Backward-shift deletion keeps every probe run gap-free.
  size_t hole = i;
  for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
    const Slot s = slots_[j];
    if (s.block < 0) break;
    const size_t home = s.key & mask_;
    // s may move into the hole if its home is not cyclically in (hole, j].
    bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!stays) {
      slots_[hole] = s;
      hole = j;
    }
  }
  slots_[hole] = {-1, 0};
}

void PrefixCache::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{-1, 0});
  std::fill(dup_next_.begin(), dup_next_.end(), -1);
  std::fill(dup_prev_.begin(), dup_prev_.end(), -1);
  std::fill(dup_tail_.begin(), dup_tail_.end(), -1);
  num_entries_ = 0;
}

bool PrefixCache::contains(int32_t block) const {
  if (block < 0 || size_t(block) >= dup_next_.size()) return false;
  const BlockHash& h = hashes_[block];
  if (h.empty()) return false;
  size_t i = slot_of(h);
  if (i == npos) return false;
  for (int32_t b = slots_[i].block; b >= 0; b = dup_next_[b])
    if (b == block) return true;
  return false;
}

const char* PrefixCache::check() const {
  const BlockHash* const hs = hashes_;
  int32_t count = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const int32_t head = slots_[i].block;
    if (head < 0) continue;
    if (size_t(head) >= dup_next_.size()) return "prefix cache: a slot names a block out of range";
    if (hs[head].empty()) return "prefix cache: a mapped block holds no hash";
    if (slots_[i].key != key_of(hs[head])) return "prefix cache: a slot's key is not its hash's";
    if (dup_prev_[head] != -1) return "prefix cache: a chain head has a prev link";
    if (slot_of(hs[head]) != i) return "prefix cache: a hash is mapped in two slots or unreachable";
    int32_t prev = -1;
    for (int32_t b = head; b >= 0; b = dup_next_[b]) {
      if (hs[b] != hs[head]) return "prefix cache: a block is mapped under a hash it does not hold";
      if (dup_prev_[b] != prev) return "prefix cache: a duplicate chain's links disagree";
      if (++count > num_entries_) return "prefix cache: more mapped blocks than its count";
      prev = b;
    }
    if (dup_tail_[head] != (prev == head ? -1 : prev))
      return "prefix cache: a chain head does not name its last block";
  }
  if (count != num_entries_) return "prefix cache: fewer mapped blocks than its count";
  return "";
}

}  // namespace pagedkv
