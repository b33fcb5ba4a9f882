// TransferEngine over UCX (UCP): one context and one worker per engine,
// every UCX call serialised by the engine's mutex (worker in single-thread
// mode). Exports register a pool's whole arena once (ucp_mem_map) and ship
// its packed remote key; imports share one endpoint per exporting worker
// (UcxEngine::Conn) and pull each run of consecutive blocks of each K/V
// plane with one ucp_get_nbx.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <sys/mman.h>
#include <unistd.h>

#include "transfer/descriptor.h"
#include "transfer/engine.h"
#include "transfer/layout_check.h"
#include "transfer/ucx_api.h"

// Every UCX call goes through the run-time loaded API (transfer/ucx_api.h).
#define ucs_status_string(...) (::pagedkv::ucxdl::api().ucs_status_string(__VA_ARGS__))
#define ucp_request_free(...) (::pagedkv::ucxdl::api().ucp_request_free(__VA_ARGS__))
#define ucp_request_check_status(...) \
  (::pagedkv::ucxdl::api().ucp_request_check_status(__VA_ARGS__))
#define ucp_worker_progress(...) (::pagedkv::ucxdl::api().ucp_worker_progress(__VA_ARGS__))
#define ucp_mem_unmap(...) (::pagedkv::ucxdl::api().ucp_mem_unmap(__VA_ARGS__))
#define ucp_ep_create(...) (::pagedkv::ucxdl::api().ucp_ep_create(__VA_ARGS__))
#define ucp_config_release(...) (::pagedkv::ucxdl::api().ucp_config_release(__VA_ARGS__))
#define ucp_worker_release_address(...) \
  (::pagedkv::ucxdl::api().ucp_worker_release_address(__VA_ARGS__))
#define ucp_worker_get_address(...) (::pagedkv::ucxdl::api().ucp_worker_get_address(__VA_ARGS__))
#define ucp_worker_destroy(...) (::pagedkv::ucxdl::api().ucp_worker_destroy(__VA_ARGS__))
#define ucp_worker_create(...) (::pagedkv::ucxdl::api().ucp_worker_create(__VA_ARGS__))
#define ucp_rkey_pack(...) (::pagedkv::ucxdl::api().ucp_rkey_pack(__VA_ARGS__))
#define ucp_rkey_destroy(...) (::pagedkv::ucxdl::api().ucp_rkey_destroy(__VA_ARGS__))
#define ucp_rkey_buffer_release(...) (::pagedkv::ucxdl::api().ucp_rkey_buffer_release(__VA_ARGS__))
#define ucp_mem_map(...) (::pagedkv::ucxdl::api().ucp_mem_map(__VA_ARGS__))
#define ucp_get_nbx(...) (::pagedkv::ucxdl::api().ucp_get_nbx(__VA_ARGS__))
#define ucp_ep_rkey_unpack(...) (::pagedkv::ucxdl::api().ucp_ep_rkey_unpack(__VA_ARGS__))
#define ucp_ep_flush_nbx(...) (::pagedkv::ucxdl::api().ucp_ep_flush_nbx(__VA_ARGS__))
#define ucp_worker_flush_nbx(...) (::pagedkv::ucxdl::api().ucp_worker_flush_nbx(__VA_ARGS__))
#define ucp_ep_close_nbx(...) (::pagedkv::ucxdl::api().ucp_ep_close_nbx(__VA_ARGS__))
#define ucp_config_read(...) (::pagedkv::ucxdl::api().ucp_config_read(__VA_ARGS__))
#define ucp_config_modify(...) (::pagedkv::ucxdl::api().ucp_config_modify(__VA_ARGS__))
#define ucp_cleanup(...) (::pagedkv::ucxdl::api().ucp_cleanup(__VA_ARGS__))
#define ucp_init(params, config, context) \
  (::pagedkv::ucxdl::api().ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context))

namespace pagedkv {
namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

[[noreturn]] void fail_ucx(Errc code, const std::string& what, ucs_status_t st) {
  fail(code, what + ": " + ucs_status_string(st));
}

ucs_memory_type_t memory_type(const Pool& p) {
  return p.options().device_type == kDeviceCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
}

// Waits for a UCX request issued on worker (nullptr or an error pointer
// are already final). Gives up after limit_ns; returns its final status.
ucs_status_t wait_request(ucp_worker_h worker, ucs_status_ptr_t req, uint64_t limit_ns) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  const uint64_t end = now_ns() + limit_ns;
  ucs_status_t st;
  while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && now_ns() < end)
    ucp_worker_progress(worker);
  if (st != UCS_INPROGRESS) ucp_request_free(req);
  return st;
}

class UcxEngine;

// The importing engine's endpoint to one exporting worker, shared by every
// import from it. One endpoint per import left a TCP connection open on
// both engines after each import until they were destroyed (UCX 1.13: a
// force-closed endpoint's TCP lane keeps its socket for receiving, and the
// exporter's endpoint, made by the wire-up, is never closed); one per peer
// bounds them by the number of peers. A Conn is closed (force: its peer
// may be gone or idle) when its peer fails, when an import aborted with
// reads still queued on it (only closing it fails them), or when it never
// completed its wire-up, each once no transfer uses it any more; else it
// stays cached for the next import until the engine is destroyed (or more
// than kMaxIdleConns are idle).
struct Conn {
  std::string address;  // the exporter's worker address
  ucp_ep_h ep = nullptr;
  void* flush = nullptr;  // the wire-up flush, while it runs
  bool wired = false;     // that flush completed: reads may be posted
  bool evicted = false;   // no new imports; closed once users is 0
  ucs_status_t error = UCS_OK;
  uint32_t users = 0;  // transfers holding it
  uint64_t last_used_ns = 0;
  // Aborted transfers' reads still queued here and the sequences they may
  // still write: freed once those reads ended (at the latest when the
  // endpoint is closed, which fails them).
  struct Orphan {
    std::shared_ptr<Pool> pool;
    SeqId seq = 0;
    std::vector<void*> reqs;
  };
  std::vector<Orphan> orphans;
  static void on_error(void* arg, ucp_ep_h, ucs_status_t st) {
    Conn* c = static_cast<Conn*>(arg);
    c->error = st;
    c->evicted = true;
  }
};
constexpr size_t kMaxIdleConns = 64;

class UcxTransfer final : public Transfer {
 public:
  UcxTransfer(std::shared_ptr<UcxEngine> eng, std::shared_ptr<Pool> pool)
      : eng_(std::move(eng)), pool_(std::move(pool)) {}
  ~UcxTransfer() override;
  Status poll() override;
  void cancel() override;
  uint64_t bytes() const override { return st_.bytes; }

  // Posts the reads (engine mutex held); throws, having undone everything.
  void start(const SeqOptions& o, const TransferDescriptor& d);

 private:
  friend class UcxEngine;
  // Ends a transfer that did not complete: gives its reads still queued to
  // its endpoint, which is closed (failing them) once no other transfer
  // uses it; the sequence is freed once no read can land any more, right
  // away when this transfer was the endpoint's only user. Engine mutex held.
  void abort_locked(TransferState state, Errc code, const std::string& msg) noexcept;
  void poll_locked();
  // Posts reads_ (once the endpoint is wired up); throws, having aborted.
  void post_reads();

  std::shared_ptr<UcxEngine> eng_;
  std::shared_ptr<Pool> pool_;
  Pool::ArenaRef local_;
  struct Conn* conn_ = nullptr;  // the engine's endpoint to the exporter, one use held
  ucp_rkey_h rkey_ = nullptr;
  std::vector<void*> reqs_;
  // Reads are posted only once a flush of the new endpoint completed (its
  // wire-up with the exporter is done, Conn::wired): before that, a dead
  // exporter would leave them queued forever on transports without
  // peer-failure detection.
  bool posted_ = false;
  struct Read {
    char* local;
    uint64_t remote;
    size_t len;
  };
  std::vector<Read> reads_;
  ucp_request_param_t read_param_{};
  uint64_t deadline_ns_ = 0;
  SeqId seq_ = 0;
  Status st_;
};

class UcxEngine final : public TransferEngine, public std::enable_shared_from_this<UcxEngine> {
 public:
  explicit UcxEngine(const TransferOptions& o) : opts_(o) {}
  ~UcxEngine() override;
  void init();

  uint64_t export_seq(const std::shared_ptr<Pool>& pool, SeqId seq) override;
  std::vector<uint8_t> descriptor(uint64_t id) override;
  void release(uint64_t id) override;
  uint64_t num_exports() override {
    std::lock_guard<std::mutex> lock(mu_);
    return exports_.size();
  }
  void progress() override {
    std::lock_guard<std::mutex> lock(mu_);
    progress_locked();
  }
  std::shared_ptr<Transfer> import_seq(const std::shared_ptr<Pool>& pool, const SeqOptions& o,
                                       const uint8_t* desc, uint64_t size) override;
  void close() override;

 private:
  friend class UcxTransfer;
  struct Registration {
    std::weak_ptr<Pool> pool;
    std::shared_ptr<void> hold;  // the arena stays mapped memory until unmapped
    void* base = nullptr;
    uint64_t bytes = 0;
    bool host = true;  // UCS_MEMORY_TYPE_HOST
    ucp_mem_h memh = nullptr;
    std::string rkey;
  };
  struct Export {
    std::shared_ptr<Pool> pool;
    SeqId pin = 0;
    std::vector<uint8_t> desc;
    uint64_t expires_ns = 0;  // 0 = never
  };
  void progress_locked() {
    while (ucp_worker_progress(worker_) != 0) {
    }
    while (ucp_worker_progress(iworker_) != 0) {
    }
    sweep_conns_locked();
    expire_locked();
    sweep_registrations_locked();  // pools destroyed since (their arenas go)
  }
  void expire_locked();
  void drop_export(Export& x) noexcept;
  // Unmaps the registrations of pools that are gone, letting their arenas
  // go. Called whenever an export is dropped (its reference may have been
  // the pool's last) and before a new registration.
  void sweep_registrations_locked() noexcept;
  // Keeps an unmapped registration's host arena reserved (see retired_);
  // release_retired_locked gives back the pages of those no one else holds.
  void retire_locked(Registration& r) noexcept;
  void release_retired_locked() noexcept;
  Registration& registration(const std::shared_ptr<Pool>& pool, const Pool::ArenaRef& a);
  void check_open() const {
    if (closed_) fail(Errc::kInvalidState, "the transfer engine was destroyed");
  }
  // A use of the endpoint to the worker at address (cached or new, its
  // wire-up flush started); throws if it cannot be created.
  Conn* connect_locked(const std::string& address);
  // Notes the end of c's wire-up flush.
  void check_wired_locked(Conn& c) noexcept;
  // Drops one use of c; closes it when that was the last of an evicted
  // or never wired endpoint.
  void unuse_locked(Conn* c) noexcept;
  // Frees the orphans whose reads ended and closes the evicted endpoints
  // no transfer uses (idle ones whose peer failed).
  void sweep_conns_locked() noexcept;
  // Force-closes c (taken out of conns_), fails its orphans' reads and
  // frees their sequences (quarantined if a read never ends).
  void close_conn_locked(std::unique_ptr<Conn> c) noexcept;
  void close_idle_conns_locked() noexcept;

  TransferOptions opts_;
  std::mutex mu_;
  ucp_context_h ctx_ = nullptr;
  // Two workers: worker_ serves exports (its address goes in descriptors);
  // iworker_ makes this engine's endpoints to exporters (imports). With one
  // worker for both, two engines importing from each other shared their
  // TCP connections between the two directions (UCX matches a peer's
  // wire-up to the endpoint towards it): force-closing an import's endpoint
  // (a cancel with reads in flight, an import ended mid-wire-up) failed
  // the peer's imports from this engine or made UCX 1.13 abort the process
  // (wireup_ep.c:241, ucp_ep.inl:215, ucp_request.c:684).
  ucp_worker_h worker_ = nullptr;
  ucp_worker_h iworker_ = nullptr;
  std::string address_;
  std::vector<Registration> regs_;
  std::unordered_map<uint64_t, Export> exports_;
  std::vector<std::unique_ptr<Conn>> conns_;  // this engine's endpoints, one per exporter
  uint64_t next_export_ = 1;
  bool closed_ = false;
  // A descriptor carried this worker's address out: peers may connect to
  // it, and it may owe them wire-up replies (see ~UcxEngine).
  bool exported_ = false;
  // Sequences of transfers whose reads never ended after their endpoint
  // closed: their blocks could still be written, so they are freed only
  // once the worker is gone (~UcxEngine).
  std::vector<std::pair<std::shared_ptr<Pool>, SeqId>> quarantine_;
  // Host arenas of pools that are gone, unmapped from UCX but kept
  // reserved until the worker is destroyed: a peer still reading a
  // released or expired export (its descriptor holds the arena's address)
  // is served from this worker's progress over TCP, which reads the
  // address without checking the unmapped key. Freeing the arena made that
  // read a segfault of the exporting process; it now reads zero pages (the
  // pages are given back with MADV_DONTNEED when no one else holds them).
  // A plan or tier may still hold an arena when it is retired: its pages
  // go back at a later sweep, once the engine's is the last reference.
  struct Retired {
    std::shared_ptr<void> hold;
    void* base = nullptr;
    uint64_t bytes = 0;
    bool released = false;  // pages given back
  };
  std::vector<Retired> retired_;
};

void UcxEngine::init() {
  // The library never prints: UCX logs only fatal errors unless the user
  // asked for more (UCX_LOG_LEVEL).
  if (!std::getenv("UCX_LOG_LEVEL"))
    ucxdl::api().global_opts->log_component.log_level = UCS_LOG_LEVEL_FATAL;
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) fail_ucx(Errc::kInvalidState, "UCX configuration could not be read", st);
  if (!opts_.transports.empty()) {
    st = ucp_config_modify(cfg, "TLS", opts_.transports.c_str());
    if (st != UCS_OK) {
      ucp_config_release(cfg);
      fail_ucx(Errc::kInvalidArgument, "options->transports \"" + opts_.transports + "\"", st);
    }
  }
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_RMA;
  st = ucp_init(&p, cfg, &ctx_);
  ucp_config_release(cfg);
  // Transports the caller named of which UCX has none here (a typo, another
  // machine's): the caller's option, not a missing UCX.
  if (st == UCS_ERR_NO_DEVICE && !opts_.transports.empty())
    fail_ucx(Errc::kInvalidArgument,
             "options->transports \"" + opts_.transports +
                 "\" names no transport UCX can use here (ucp_init)",
             st);
  if (st != UCS_OK) fail_ucx(Errc::kUnsupported, "UCX could not be initialised (ucp_init)", st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // serialised by mu_
  st = ucp_worker_create(ctx_, &wp, &worker_);
  if (st != UCS_OK) fail_ucx(Errc::kUnsupported, "UCX worker could not be created", st);
  st = ucp_worker_create(ctx_, &wp, &iworker_);
  if (st != UCS_OK) fail_ucx(Errc::kUnsupported, "UCX worker could not be created", st);
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) fail_ucx(Errc::kUnsupported, "UCX worker has no address", st);
  address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(worker_, addr);
}

// UCX state that ~UcxEngine did not dare destroy (see there): reachable
// from here for the life of the process, so that leak checkers do not
// report it, never touched again.
struct Abandoned {
  ucp_context_h ctx;
  ucp_worker_h worker;
};
std::mutex abandoned_mu;
std::vector<Abandoned>* const abandoned = new std::vector<Abandoned>;

UcxEngine::~UcxEngine() {
  // Every transfer held the engine: every endpoint left is idle.
  close_idle_conns_locked();
  for (auto& [id, x] : exports_) drop_export(x);
  for (Registration& r : regs_) ucp_mem_unmap(ctx_, r.memh);
  // A peer that connected (its import sent this worker a wire-up request)
  // and then stopped progressing or went away before this worker's reply
  // left leaves that reply queued: the request made this worker create an
  // endpoint whose TCP lane opens its own connection to the peer's
  // interface, and the reply waits in that lane's pending queue until the
  // peer's worker accepts and acknowledges the connection (UCX 1.13,
  // uct_tcp_ep in CONNECTING/WAITING_ACK). ucp_worker_destroy purges every
  // lane's pending queue through ucp_ep_err_pending_purge, whose
  // ucp_request_send_state_ff asserts (ucp_request.c:684, "got REP
  // message": only EP_REMOVED, EP_CHECK and ACK may be purged there) and
  // aborts the process. A flush first lets the reply leave. It completes
  // only once no TCP lane is connecting any more (a connecting lane counts
  // as outstanding on its interface, uct_tcp_iface_flush) and every
  // endpoint's pending queue has drained, so a completed flush leaves no
  // queued reply, and nothing progresses the worker between the flush and
  // ucp_worker_destroy. A flush still running after 1 s (a peer that is
  // alive but does not progress, or a dead shared-memory peer) means the
  // reply may still be queued if the worker ever replied, that is if it
  // exported (only a descriptor carries its address to peers; an importer
  // sends requests and acknowledgements, which the purge accepts). Such a
  // worker and its context are then never destroyed nor progressed again
  // (their memory and sockets stay held for the life of the process): a
  // leak in that rare case is better than an abort, and a worker never
  // progressed again serves no read and writes no received byte. The
  // importing worker (iworker_) goes first, as an importer-only worker
  // always did (a flush towards a dead shared-memory exporter never ends):
  // its endpoints are closed (every transfer ended), and once it is gone no
  // read can land in the quarantined sequences.
  if (iworker_) {
    ucp_request_param_t fp{};
    const ucs_status_ptr_t f = ucp_worker_flush_nbx(iworker_, &fp);
    if (wait_request(iworker_, f, 1'000'000'000ull) == UCS_INPROGRESS) ucp_request_free(f);
    ucp_worker_destroy(iworker_);
    iworker_ = nullptr;
  }
  for (auto& [pool, seq] : quarantine_) {
    try {
      pool->free_internal(seq);
    } catch (...) {  // the pool was destroyed: the sequence went with it
    }
  }
  quarantine_.clear();
  bool abandon = false;
  if (worker_) {
    ucp_request_param_t fp{};
    const ucs_status_ptr_t f = ucp_worker_flush_nbx(worker_, &fp);
    if (wait_request(worker_, f, 1'000'000'000ull) == UCS_INPROGRESS) {
      ucp_request_free(f);
      abandon = exported_;
    }
  }
  if (abandon) {
    try {
      std::lock_guard<std::mutex> lock(abandoned_mu);
      abandoned->push_back({ctx_, worker_});
    } catch (...) {  // no room to record it: still never destroyed
    }
    worker_ = nullptr;
    ctx_ = nullptr;
  }
  if (worker_) ucp_worker_destroy(worker_);
  if (ctx_) ucp_cleanup(ctx_);
  retired_.clear();  // no worker serves reads of them any more
}

void UcxEngine::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  for (auto& [id, x] : exports_) drop_export(x);
  exports_.clear();
  sweep_registrations_locked();
  close_idle_conns_locked();
}

Conn* UcxEngine::connect_locked(const std::string& address) {
  sweep_conns_locked();
  for (const auto& c : conns_) {
    if (c->evicted || c->address != address) continue;
    ++c->users;
    c->last_used_ns = now_ns();
    return c.get();
  }
  // Too many idle endpoints (peers that went quietly, e.g. over shared
  // memory, which detects no failure): the least recently used goes.
  size_t idle = 0;
  for (const auto& c : conns_) idle += c->users == 0;
  if (idle >= kMaxIdleConns) {
    auto lru = conns_.end();
    for (auto it = conns_.begin(); it != conns_.end(); ++it)
      if ((*it)->users == 0 && (lru == conns_.end() || (*it)->last_used_ns < (*lru)->last_used_ns))
        lru = it;
    std::unique_ptr<Conn> old = std::move(*lru);
    conns_.erase(lru);
    close_conn_locked(std::move(old));
  }
  auto c = std::make_unique<Conn>();
  c->address = address;
  conns_.reserve(conns_.size() + 1);  // the push below cannot throw
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(c->address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // a dead peer fails the reads, never hangs them
  ep.err_handler.cb = &Conn::on_error;
  ep.err_handler.arg = c.get();
  ucs_status_t st = ucp_ep_create(iworker_, &ep, &c->ep);
  if (st != UCS_OK) {
    // UCX 1.13's shared-memory transports have no peer-failure detection:
    // there a dead exporter fails the reads themselves (cma) or leaves its
    // pinned memory readable (posix/sysv mappings outlive it).
    ep.field_mask &= ~uint64_t(UCP_EP_PARAM_FIELD_ERR_HANDLER);
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(iworker_, &ep, &c->ep);
  }
  if (st != UCS_OK)
    fail_ucx(Errc::kInvalidState, "the exporter cannot be reached (ucp_ep_create)", st);
  ucp_request_param_t fp{};
  const ucs_status_ptr_t r = ucp_ep_flush_nbx(c->ep, &fp);
  if (UCS_PTR_IS_ERR(r)) {
    const ucs_status_t fst = UCS_PTR_STATUS(r);
    close_conn_locked(std::move(c));
    fail_ucx(Errc::kInvalidState, "the exporter cannot be reached (ucp_ep_flush_nbx)", fst);
  }
  c->flush = r;
  c->wired = r == nullptr;
  c->users = 1;
  c->last_used_ns = now_ns();
  conns_.push_back(std::move(c));
  return conns_.back().get();
}

void UcxEngine::check_wired_locked(Conn& c) noexcept {
  if (!c.flush) return;
  const ucs_status_t f = ucp_request_check_status(c.flush);
  if (f == UCS_INPROGRESS) return;
  ucp_request_free(c.flush);
  c.flush = nullptr;
  if (f == UCS_OK) {
    c.wired = true;
  } else {
    if (c.error == UCS_OK) c.error = f;
    c.evicted = true;
  }
}

void UcxEngine::unuse_locked(Conn* c) noexcept {
  if (--c->users != 0) return;
  c->last_used_ns = now_ns();
  check_wired_locked(*c);
  if (c->wired && !c->evicted) return;  // cached for the next import from this peer
  for (auto it = conns_.begin(); it != conns_.end(); ++it) {
    if (it->get() != c) continue;
    std::unique_ptr<Conn> own = std::move(*it);
    conns_.erase(it);
    close_conn_locked(std::move(own));
    return;
  }
}

void UcxEngine::sweep_conns_locked() noexcept {
  for (auto& c : conns_) {
    for (size_t i = 0; i < c->orphans.size();) {
      Conn::Orphan& o = c->orphans[i];
      while (!o.reqs.empty() && ucp_request_check_status(o.reqs.back()) != UCS_INPROGRESS) {
        ucp_request_free(o.reqs.back());
        o.reqs.pop_back();
      }
      if (!o.reqs.empty()) {
        ++i;
        continue;
      }
      try {
        o.pool->free_internal(o.seq);
      } catch (...) {  // the pool was destroyed: the sequence went with it
      }
      c->orphans[i] = std::move(c->orphans.back());
      c->orphans.pop_back();
    }
  }
  for (size_t i = 0; i < conns_.size();) {
    if (conns_[i]->users == 0 && conns_[i]->evicted) {
      std::unique_ptr<Conn> own = std::move(conns_[i]);
      conns_.erase(conns_.begin() + ptrdiff_t(i));
      close_conn_locked(std::move(own));
      i = 0;  // closing progressed the worker: look again
    } else {
      ++i;
    }
  }
}

void UcxEngine::close_idle_conns_locked() noexcept {
  for (size_t i = 0; i < conns_.size();) {
    if (conns_[i]->users == 0) {
      std::unique_ptr<Conn> own = std::move(conns_[i]);
      conns_.erase(conns_.begin() + ptrdiff_t(i));
      close_conn_locked(std::move(own));
      i = 0;
    } else {
      ++i;
    }
  }
}

void UcxEngine::close_conn_locked(std::unique_ptr<Conn> c) noexcept {
  bool closed = true;
  if (c->ep) {
    // Force: a graceful close would wait for a peer that may be gone or
    // idle, and the reads still queued on it are to be failed.
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    closed =
        wait_request(iworker_, ucp_ep_close_nbx(c->ep, &cp), 10'000'000'000ull) != UCS_INPROGRESS;
    c->ep = nullptr;
  }
  if (c->flush) {  // writes nothing: UCX releases it when it ends
    ucp_request_free(c->flush);
    c->flush = nullptr;
  }
  // Reads still queued complete (with an error) once the endpoint is
  // force-closed; until they have, they may still write into their blocks.
  const uint64_t end = now_ns() + 2'000'000'000ull;
  for (Conn::Orphan& o : c->orphans) {
    bool stuck = false;
    for (void* r : o.reqs) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS && now_ns() < end)
        ucp_worker_progress(iworker_);
      if (ucp_request_check_status(r) == UCS_INPROGRESS) stuck = true;
      ucp_request_free(r);
    }
    o.reqs.clear();
    if (stuck) {
      try {
        quarantine_.emplace_back(std::move(o.pool), o.seq);
      } catch (...) {  // out of memory: the blocks stay held, never freed under a read
      }
      continue;
    }
    try {
      o.pool->free_internal(o.seq);
    } catch (...) {  // the pool was destroyed: the sequence went with it
    }
  }
  c->orphans.clear();
  // A close that never ended may still call the error handler with c.
  if (!closed) c.release();
}

void UcxEngine::drop_export(Export& x) noexcept {
  try {
    x.pool->free_internal(x.pin);
  } catch (...) {  // the pool was destroyed: its sequences, the pin included, went with it
  }
}

void UcxEngine::expire_locked() {
  if (opts_.export_ttl_ms == 0) return;
  const uint64_t now = now_ns();
  bool dropped = false;
  for (auto it = exports_.begin(); it != exports_.end();) {
    if (it->second.expires_ns <= now) {
      drop_export(it->second);
      it = exports_.erase(it);
      dropped = true;
    } else {
      ++it;
    }
  }
  if (dropped) sweep_registrations_locked();
}

void UcxEngine::sweep_registrations_locked() noexcept {
  // Mappings of pools that are gone are dropped here (their memory stayed
  // alive through hold until now, for exports that still named it).
  for (auto it = regs_.begin(); it != regs_.end();) {
    if (it->pool.expired()) {
      ucp_mem_unmap(ctx_, it->memh);
      retire_locked(*it);
      it = regs_.erase(it);
    } else {
      ++it;
    }
  }
  release_retired_locked();
}

void UcxEngine::retire_locked(Registration& r) noexcept {
  if (!r.host || !r.hold) return;  // device memory: UCX's cuda transports check their handles
  try {
    retired_.push_back({std::move(r.hold), r.base, r.bytes, false});
  } catch (...) {  // no room to keep it: it goes, as before
  }
}

void UcxEngine::release_retired_locked() noexcept {
  for (Retired& r : retired_) {
    if (r.released || r.hold.use_count() != 1) continue;
    // The last holder (no plan or tier still uses the arena): its pages go
    // back to the system, its addresses stay. Later reads see zero pages.
    const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
    const uint64_t b = reinterpret_cast<uintptr_t>(r.base);
    const uint64_t lo = (b + page - 1) / page * page, hi = (b + r.bytes) / page * page;
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    r.released = true;
  }
}

UcxEngine::Registration& UcxEngine::registration(const std::shared_ptr<Pool>& pool,
                                                 const Pool::ArenaRef& a) {
  sweep_registrations_locked();
  for (Registration& r : regs_)
    if (r.pool.lock() == pool && r.base == a.arena.base) return r;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  mp.address = a.arena.base;
  mp.length = a.arena.bytes();
  mp.memory_type = memory_type(*pool);  // CUDA pools: UCX's cuda transports (untested here)
  Registration r;
  ucs_status_t st = ucp_mem_map(ctx_, &mp, &r.memh);
  if (st != UCS_OK) fail_ucx(Errc::kOutOfMemory, "the pool's KV arena could not be registered", st);
  void* blob = nullptr;
  size_t len = 0;
  st = ucp_rkey_pack(ctx_, r.memh, &blob, &len);
  if (st != UCS_OK) {
    ucp_mem_unmap(ctx_, r.memh);
    fail_ucx(Errc::kInvalidState, "the remote key of the pool's arena could not be packed", st);
  }
  r.rkey.assign(static_cast<const char*>(blob), len);
  ucp_rkey_buffer_release(blob);
  r.pool = pool;
  r.hold = a.hold;
  r.base = a.arena.base;
  r.bytes = a.arena.bytes();
  r.host = mp.memory_type == UCS_MEMORY_TYPE_HOST;
  regs_.push_back(std::move(r));
  return regs_.back();
}

uint64_t UcxEngine::export_seq(const std::shared_ptr<Pool>& pool, SeqId seq) {
  std::lock_guard<std::mutex> lock(mu_);
  check_open();
  expire_locked();
  Pool::ExportSnapshot s = pool->export_pin(seq);
  Export x;
  x.pool = pool;
  x.pin = s.pin;
  try {
    const Pool::ArenaRef a = pool->arena_ref();
    const Registration& r = registration(pool, a);
    TransferDescriptor d;
    describe_layout(*pool, &d);
    d.remote_base = uint64_t(reinterpret_cast<uintptr_t>(a.arena.base));
    d.plane_bytes = a.arena.layout.layer_bytes();
    d.block_bytes = a.arena.layout.block_bytes();
    d.arena_blocks = uint64_t(a.arena.layout.num_blocks);
    d.export_id = next_export_;
    d.lora_id = s.lora_id;
    d.tokens = std::move(s.tokens);
    d.blocks = std::move(s.blocks);
    d.hashes = std::move(s.hashes);
    d.worker_address = address_;
    d.rkey = r.rkey;
    x.desc = d.encode();
    x.expires_ns = opts_.export_ttl_ms ? now_ns() + uint64_t(opts_.export_ttl_ms) * 1000000 : 0;
    exports_.emplace(next_export_, std::move(x));
    exported_ = true;
  } catch (...) {
    drop_export(x);
    throw;
  }
  return next_export_++;
}

std::vector<uint8_t> UcxEngine::descriptor(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = exports_.find(id);
  if (it == exports_.end())
    fail(Errc::kNotFound, "export " + std::to_string(id) + " is unknown, released or expired");
  return it->second.desc;
}

void UcxEngine::release(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = exports_.find(id);
  if (it == exports_.end())
    fail(Errc::kNotFound, "export " + std::to_string(id) + " is unknown, released or expired");
  drop_export(it->second);
  exports_.erase(it);
  sweep_registrations_locked();
}

std::shared_ptr<Transfer> UcxEngine::import_seq(const std::shared_ptr<Pool>& pool,
                                                const SeqOptions& o, const uint8_t* desc,
                                                uint64_t size) {
  const TransferDescriptor d = TransferDescriptor::decode(desc, size);
  check_importable(d, *pool);
  // The exporter's K/V were computed with its LoRA adapter. Imported into a
  // sequence without one, its full blocks would be cached under the base
  // model's hashes and hit base-model prompts. (An adapter named on either
  // side cannot be compared: the descriptor carries only the id.)
  if (d.lora_id != 0 && o.lora_id == 0 && o.lora_name.empty())
    fail(Errc::kInvalidArgument,
         "opts->lora_id: the exported sequence's K/V were computed with LoRA adapter " +
             std::to_string(d.lora_id) +
             "; import it with that adapter's opts->lora_id (or opts->lora_name), not as the "
             "base model's");
  std::lock_guard<std::mutex> lock(mu_);
  check_open();
  auto t = std::make_shared<UcxTransfer>(shared_from_this(), pool);
  try {
    t->start(o, d);
  } catch (...) {
    t->st_.state = TransferState::kFailed;  // start undid everything
    throw;
  }
  return t;
}

void UcxTransfer::start(const SeqOptions& o, const TransferDescriptor& d) {
  UcxEngine& e = *eng_;
  local_ = pool_->arena_ref();
  conn_ = e.connect_locked(d.worker_address);
  ucs_status_t st = ucp_ep_rkey_unpack(conn_->ep, d.rkey.data(), &rkey_);
  if (st != UCS_OK) {
    rkey_ = nullptr;
    abort_locked(TransferState::kFailed, Errc::kInvalidArgument, "");
    fail_ucx(Errc::kInvalidArgument, "descriptor: the remote key cannot be unpacked", st);
  }
  try {
    seq_ = pool_->import_begin(o, d.tokens.data(), d.tokens.size());
  } catch (...) {
    abort_locked(TransferState::kFailed, Errc::kInvalidArgument, "");
    throw;
  }
  // From here a failure (out of memory) frees the sequence too: it is
  // hidden, so nobody else ever could (the caller's import_seq marks the
  // transfer failed, "start undid everything").
  try {
    const std::vector<int32_t> mine = pool_->block_table_copy(seq_);
    if (memory_type(*pool_) != UCS_MEMORY_TYPE_HOST) {
      read_param_.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
      read_param_.memory_type = memory_type(*pool_);
    }
    const size_t bb = d.block_bytes, nb = d.blocks.size();
    st_.bytes = 2 * uint64_t(d.num_layers) * nb * bb;
    deadline_ns_ = e.opts_.timeout_ms ? now_ns() + uint64_t(e.opts_.timeout_ms) * 1000000 : 0;
    for (uint32_t l = 0; l < d.num_layers; ++l) {
      for (int w = 0; w < 2; ++w) {
        char* plane = static_cast<char*>(local_.arena.plane(int32_t(l), w));
        const uint64_t rplane = d.remote_base + (2 * uint64_t(l) + w) * d.plane_bytes;
        for (size_t j = 0; j < nb;) {
          size_t k = j + 1;  // a run of blocks consecutive on both sides: one read
          while (k < nb && d.blocks[k] == d.blocks[k - 1] + 1 && mine[k] == mine[k - 1] + 1) ++k;
          reads_.push_back(
              {plane + size_t(mine[j]) * bb, rplane + uint64_t(d.blocks[j]) * bb, (k - j) * bb});
          j = k;
        }
      }
    }
  } catch (...) {
    reads_.clear();
    abort_locked(TransferState::kFailed, Errc::kOutOfMemory, "");
    throw;
  }
  e.check_wired_locked(*conn_);
  if (conn_->wired && conn_->error == UCS_OK) post_reads();
}

void UcxTransfer::post_reads() {
  posted_ = true;
  for (const Read& rd : reads_) {
    ucs_status_ptr_t r = ucp_get_nbx(conn_->ep, rd.local, rd.len, rd.remote, rkey_, &read_param_);
    if (UCS_PTR_IS_ERR(r)) {
      const std::string m = std::string("a read from the exporter could not be posted: ") +
                            ucs_status_string(UCS_PTR_STATUS(r));
      abort_locked(TransferState::kFailed, Errc::kInvalidState, m);
      fail(Errc::kInvalidState, m);
    }
    if (r != nullptr) reqs_.push_back(r);
  }
  reads_.clear();
}

UcxTransfer::~UcxTransfer() {
  // The last owner: nobody else reads st_. A start() that threw left it
  // failed, and its caller still holds the engine's mutex.
  if (st_.state != TransferState::kRunning) return;
  std::lock_guard<std::mutex> lock(eng_->mu_);
  abort_locked(TransferState::kCancelled, Errc::kInvalidState, "cancelled");
}

void UcxTransfer::abort_locked(TransferState state, Errc code, const std::string& msg) noexcept {
  if (rkey_) {
    ucp_rkey_destroy(rkey_);
    rkey_ = nullptr;
  }
  for (size_t i = 0; i < reqs_.size();) {
    if (ucp_request_check_status(reqs_[i]) == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    ucp_request_free(reqs_[i]);
    reqs_[i] = reqs_.back();
    reqs_.pop_back();
  }
  if (conn_) {
    if (!reqs_.empty()) {
      // Reads still queued: only closing the endpoint fails them, so no
      // new import takes it; the sequence goes with the reads, freed once
      // they ended (right away if no other transfer uses the endpoint).
      conn_->evicted = true;
      try {
        conn_->orphans.push_back({pool_, seq_, std::move(reqs_)});
      } catch (...) {  // out of memory: the blocks stay held, never freed under a read
      }
      reqs_.clear();
      seq_ = 0;
    }
    eng_->unuse_locked(conn_);
    conn_ = nullptr;
  }
  if (seq_) {
    try {
      pool_->free_internal(seq_);
    } catch (...) {  // the pool was destroyed: the sequence went with it
    }
    seq_ = 0;
  }
  st_.state = state;
  st_.error = code;
  st_.message = msg;
}

void UcxTransfer::poll_locked() {
  if (st_.state != TransferState::kRunning) return;
  // The engine's own exports too: an import of them (or a peer's import
  // over TCP, served from this engine's progress) needs it.
  for (int i = 0; i < 64 && ucp_worker_progress(eng_->iworker_) != 0; ++i) {
  }
  for (int i = 0; i < 64 && ucp_worker_progress(eng_->worker_) != 0; ++i) {
  }
  if (!posted_) {
    Conn& c = *conn_;
    eng_->check_wired_locked(c);
    if (!c.wired && c.error == UCS_OK) {
      if (deadline_ns_ && now_ns() > deadline_ns_)
        abort_locked(TransferState::kFailed, Errc::kInvalidState,
                     "timed out after " + std::to_string(eng_->opts_.timeout_ms) +
                         " ms (options->timeout_ms) connecting to the exporter");
      return;
    }
    if (c.error != UCS_OK) {
      abort_locked(TransferState::kFailed, Errc::kInvalidState,
                   std::string("the exporter cannot be reached (peer gone?): ") +
                       ucs_status_string(c.error));
      return;
    }
    try {
      post_reads();
    } catch (const Error&) {
      return;  // aborted, state failed
    }
  }
  ucs_status_t bad = conn_->error;
  for (size_t i = 0; i < reqs_.size();) {
    const ucs_status_t s = ucp_request_check_status(reqs_[i]);
    if (s == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    if (s != UCS_OK && bad == UCS_OK) bad = s;
    ucp_request_free(reqs_[i]);
    reqs_[i] = reqs_.back();
    reqs_.pop_back();
  }
  if (bad != UCS_OK) {
    abort_locked(TransferState::kFailed, Errc::kInvalidState,
                 std::string("reading from the exporter failed (peer gone or unreachable?): ") +
                     ucs_status_string(bad));
    return;
  }
  if (!reqs_.empty()) {
    if (deadline_ns_ && now_ns() > deadline_ns_)
      abort_locked(TransferState::kFailed, Errc::kInvalidState,
                   "timed out after " + std::to_string(eng_->opts_.timeout_ms) +
                       " ms (options->timeout_ms) with reads outstanding");
    return;
  }
  ucp_rkey_destroy(rkey_);  // every read landed
  rkey_ = nullptr;
  eng_->unuse_locked(conn_);  // cached for the next import from this exporter
  conn_ = nullptr;
  try {
    pool_->import_commit(seq_);
  } catch (const Error& e) {
    abort_locked(TransferState::kFailed, e.code(), e.what());
    return;
  } catch (...) {
    abort_locked(TransferState::kFailed, Errc::kOutOfMemory, "out of host memory");
    return;
  }
  st_.seq = seq_;
  seq_ = 0;  // the caller's now
  st_.state = TransferState::kDone;
}

Transfer::Status UcxTransfer::poll() {
  std::lock_guard<std::mutex> lock(eng_->mu_);
  poll_locked();
  eng_->sweep_conns_locked();
  eng_->expire_locked();
  return st_;
}

void UcxTransfer::cancel() {
  std::lock_guard<std::mutex> lock(eng_->mu_);
  if (st_.state == TransferState::kDone)
    fail(Errc::kInvalidState, "the transfer is complete; free its sequence instead");
  if (st_.state == TransferState::kRunning)
    abort_locked(TransferState::kCancelled, Errc::kInvalidState, "cancelled");
}

}  // namespace

std::shared_ptr<TransferEngine> TransferEngine::create(const TransferOptions& opts) {
  std::string why;
  if (!ucxdl::load(&why)) fail(Errc::kUnsupported, why);
  auto e = std::make_shared<UcxEngine>(opts);
  e->init();
  return e;
}

}  // namespace pagedkv
