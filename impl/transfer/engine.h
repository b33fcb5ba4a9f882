// Moving a sequence's K/V from one pool to another, possibly in another
// process or on another machine (pkv_transfer_*, docs/scale-out-transfer.md).
// The exporter pins the sequence's blocks and describes them; the importer
// allocates blocks, pulls the bytes with one-sided reads and attaches them
// as a written sequence. The UCX implementation is ucx_engine.cpp; a build
// without UCX links engine_stub.cpp, whose create() says so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "error.h"
#include "kv_pool.h"

namespace pagedkv {

struct TransferOptions {
  uint32_t timeout_ms = 30000;  // a transfer not done by then fails; 0 = never
  std::string transports;       // UCX_TLS; "" = UCX's default / environment
  uint32_t export_ttl_ms = 0;   // 0 = exports live until released
};

enum class TransferState : uint32_t { kRunning = 0, kDone = 1, kFailed = 2, kCancelled = 3 };

class Transfer {
 public:
  struct Status {
    TransferState state = TransferState::kRunning;
    Errc error = Errc::kInternal;  // meaningful when kFailed
    std::string message;           // idem
    SeqId seq = 0;                 // the new sequence when kDone
    uint64_t bytes = 0;            // K/V bytes this transfer reads
  };
  virtual ~Transfer() = default;
  // Drives the transport, never blocks; attaches the sequence on success.
  virtual Status poll() = 0;
  // Stops the reads and gives the blocks back; Error(kInvalidState) once done.
  virtual void cancel() = 0;
  virtual uint64_t bytes() const = 0;  // K/V bytes it reads; fixed at start
};

class TransferEngine {
 public:
  // Error(kUnsupported) in a build without UCX.
  static std::shared_ptr<TransferEngine> create(const TransferOptions& opts);
  virtual ~TransferEngine() = default;

  virtual uint64_t export_seq(const std::shared_ptr<Pool>& pool, SeqId seq) = 0;
  virtual std::vector<uint8_t> descriptor(uint64_t export_id) = 0;
  virtual void release(uint64_t export_id) = 0;
  virtual uint64_t num_exports() = 0;
  // Serves peers' reads where the transport needs the target's help (TCP)
  // and expires exports past their TTL.
  virtual void progress() = 0;
  virtual std::shared_ptr<Transfer> import_seq(const std::shared_ptr<Pool>& pool,
                                               const SeqOptions& opts, const uint8_t* desc,
                                               uint64_t size) = 0;
  // Releases every export; later exports and imports fail. Transfers in
  // flight keep the engine alive until they end.
  virtual void close() = 0;
};

}  // namespace pagedkv
