#include <string>

#include "error.h"
#include "events/publisher.h"

namespace pagedkv::events {

std::string offset_endpoint(const std::string& e, uint32_t rank) {
  if (e.empty() || rank == 0) return e;
  if (e.find("inproc") != std::string::npos) return e + "_dp" + std::to_string(rank);
  if (e.find("tcp") != std::string::npos) {
    const size_t colon = e.rfind(':');
    const std::string port = colon == std::string::npos ? "" : e.substr(colon + 1);
    if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
        port.size() > 5 || std::stoul(port) + rank > 65535)
      fail(Errc::kInvalidArgument,
           "endpoint '" + e + "' has no numeric port to offset by the data-parallel rank");
    return e.substr(0, colon + 1) + std::to_string(std::stoul(port) + rank);
  }
  fail(Errc::kInvalidArgument, "endpoint '" + e +
                                   "' must be tcp:// or inproc:// when data_parallel_rank > 0 "
                                   "(its port or name is offset by the rank, as vLLM does)");
}

}  // namespace pagedkv::events
