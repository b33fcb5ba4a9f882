#include "tier/tier_level.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "backend.h"
#include "error.h"

namespace pagedkv {

namespace {

uint64_t random_seed() {
  uint64_t s = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&s), sizeof s) != 1) {
    std::random_device rd;
    s = (uint64_t(rd()) << 32) ^ rd();
  }
  return s;
}

}  // namespace

size_t TierLevel::KeyedHasher::operator()(const BlockHash& h) const noexcept {
  return size_t(XXH3_64bits_withSeed(h.bytes.data(), h.size, seed));
}

TierLevel::TierLevel(Medium m, uint64_t slots, size_t slot_bytes)
    : medium_(m),
      slot_bytes_(slot_bytes),
      state_(slots, State::kFree),
      hash_(slots),
      sum_(slots, 0),
      lora_(slots, 0),
      pins_(slots, 0),
      prev_(slots, -1),
      next_(slots, -1),
      index_(0, KeyedHasher{random_seed()}) {
  index_.reserve(slots);
  free_.reserve(slots);
  for (uint64_t i = slots; i-- > 0;) free_.push_back(int32_t(i));  // slot 0 first
}

std::unique_ptr<TierLevel> TierLevel::host(uint64_t slots, size_t slot_bytes) {
  std::unique_ptr<TierLevel> t(new TierLevel(Medium::kHost, slots, slot_bytes));
  void* p = nullptr;
  // Page-aligned: whole blocks are memcpy'd in and out.
  if (posix_memalign(&p, 4096, slots * slot_bytes) != 0)
    fail(Errc::kOutOfMemory, "host_bytes: cannot allocate " + std::to_string(slots * slot_bytes) +
                                 " bytes of host tier memory");
  t->mem_ = static_cast<char*>(p);
  // Faulted in now, not page by page on the copy thread's first offloads.
  std::memset(p, 0, slots * slot_bytes);
  return t;
}

std::unique_ptr<TierLevel> TierLevel::host_pinned(uint64_t slots, size_t slot_bytes,
                                                  std::shared_ptr<Backend> backend) {
  std::unique_ptr<TierLevel> t(new TierLevel(Medium::kHost, slots, slot_bytes));
  try {
    t->mem_ = static_cast<char*>(backend->host_alloc_pinned(slots * slot_bytes));
  } catch (const Error& e) {
    fail(Errc::kOutOfMemory, "host_bytes: cannot allocate " + std::to_string(slots * slot_bytes) +
                                 " bytes of pinned host tier memory (" + e.what() + ")");
  }
  // Page-locking faulted every page in already: no memset pass.
  t->pinned_by_ = std::move(backend);
  return t;
}

std::unique_ptr<TierLevel> TierLevel::file(const std::string& dir, uint64_t slots,
                                           size_t slot_bytes) {
  std::unique_ptr<TierLevel> t(new TierLevel(Medium::kFile, slots, slot_bytes));
  std::string path = dir + "/pagedkv-tier-XXXXXX";
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  const int fd = mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0)
    fail(Errc::kInvalidArgument,
         "file_dir \"" + dir + "\": cannot create a file there (" + std::strerror(errno) + ")");
  unlink(buf.data());  // the file lives as long as the descriptor
  t->fd_ = fd;
  if (ftruncate(fd, off_t(slots * slot_bytes)) != 0)
    fail(Errc::kInvalidArgument, "file_bytes: cannot size the tier file in \"" + dir + "\" to " +
                                     std::to_string(slots * slot_bytes) + " bytes (" +
                                     std::strerror(errno) + ")");
  // Its blocks are allocated now, not by each offload's pwritev into a hole
  // (measured on ext4: writes into a sparse region ran at about 0.6 of
  // writes into an allocated one), and a full disk shows here, not as I/O
  // errors later. A file system without fallocate keeps the sparse file.
  if (fallocate(fd, 0, 0, off_t(slots * slot_bytes)) != 0 && errno != EOPNOTSUPP && errno != ENOSYS)
    fail(Errc::kInvalidArgument,
         "file_bytes: cannot allocate " + std::to_string(slots * slot_bytes) +
             " bytes for the tier file in \"" + dir + "\" (" + std::strerror(errno) + ")");
  return t;
}

TierLevel::~TierLevel() {
  if (fd_ >= 0) close(fd_);
  if (pinned_by_)
    pinned_by_->host_free_pinned(mem_);
  else
    std::free(mem_);
}

int32_t TierLevel::find(const BlockHash& h) const {
  auto it = index_.find(h);
  return it == index_.end() ? -1 : it->second;
}

int32_t TierLevel::take_free() {
  if (free_.empty()) return -1;
  const int32_t s = free_.back();
  free_.pop_back();
  state_[s] = State::kBusy;
  return s;
}

int32_t TierLevel::lru_victim() const {
  for (int32_t s = lru_head_; s >= 0; s = next_[s])
    if (pins_[s] == 0) return s;
  return -1;
}

void TierLevel::lru_unlink(int32_t s) {
  const int32_t p = prev_[s], n = next_[s];
  (p >= 0 ? next_[p] : lru_head_) = n;
  (n >= 0 ? prev_[n] : lru_tail_) = p;
  prev_[s] = next_[s] = -1;
}

void TierLevel::lru_push_back(int32_t s) {
  prev_[s] = lru_tail_;
  next_[s] = -1;
  (lru_tail_ >= 0 ? next_[lru_tail_] : lru_head_) = s;
  lru_tail_ = s;
}

void TierLevel::unpublish(int32_t s) {
  index_.erase(hash_[s]);
  lru_unlink(s);
  hash_[s] = BlockHash{};
  state_[s] = State::kBusy;
}

void TierLevel::release(int32_t s) {
  state_[s] = State::kFree;
  pins_[s] = 0;
  free_.push_back(s);  // capacity reserved for every slot: no allocation
}

void TierLevel::publish(int32_t s, const BlockHash& h, uint64_t checksum, uint64_t lora) {
  hash_[s] = h;
  sum_[s] = checksum;
  lora_[s] = lora;
  state_[s] = State::kReady;
  index_.emplace(h, s);  // reserved for every slot: no rehash
  lru_push_back(s);
}

void TierLevel::touch(int32_t s) {
  lru_unlink(s);
  lru_push_back(s);
}

void TierLevel::clear() {
  index_.clear();
  free_.clear();
  for (size_t i = state_.size(); i-- > 0;) {
    state_[i] = State::kFree;
    hash_[i] = BlockHash{};
    pins_[i] = 0;
    prev_[i] = next_[i] = -1;
    free_.push_back(int32_t(i));
  }
  lru_head_ = lru_tail_ = -1;
}

bool TierLevel::read(int32_t slot, size_t at, const struct iovec* iov, int n) const {
  if (fail_io_) return false;
  size_t len = 0;
  for (int i = 0; i < n; ++i) len += iov[i].iov_len;
  if (at + len > slot_bytes_) return false;
  return preadv(fd_, iov, n, off_t(size_t(slot) * slot_bytes_ + at)) == ssize_t(len);
}

bool TierLevel::write(int32_t slot, size_t at, const struct iovec* iov, int n) const {
  if (fail_io_) return false;
  size_t len = 0;
  for (int i = 0; i < n; ++i) len += iov[i].iov_len;
  if (at + len > slot_bytes_) return false;
  return pwritev(fd_, iov, n, off_t(size_t(slot) * slot_bytes_ + at)) == ssize_t(len);
}

std::string TierLevel::check() const {
  const char* name = medium_ == Medium::kHost ? "host tier" : "file tier";
  size_t ready = 0, linked = 0;
  for (size_t s = 0; s < state_.size(); ++s) {
    if (state_[s] != State::kReady) continue;
    ++ready;
    auto it = index_.find(hash_[s]);
    if (it == index_.end() || it->second != int32_t(s))
      return std::string(name) + ": ready slot " + std::to_string(s) + " is not indexed";
  }
  for (int32_t s = lru_head_; s >= 0; s = next_[s]) {
    if (state_[s] != State::kReady)
      return std::string(name) + ": slot " + std::to_string(s) + " is in the LRU but not ready";
    if (++linked > ready) return std::string(name) + ": the LRU list has a cycle";
  }
  if (ready != index_.size() || linked != ready)
    return std::string(name) + ": the index, the LRU and the ready slots disagree";
  return "";
}

}  // namespace pagedkv
