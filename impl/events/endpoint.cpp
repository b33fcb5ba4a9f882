#include <cstdint>
#include <cstring>
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
        port.size() > 5)
      fail(Errc::kInvalidArgument,
           "endpoint '" + e + "' has no numeric port to offset by the data-parallel rank");
    const uint64_t offset = uint64_t(std::stoul(port)) + rank;
    if (offset > 65535)
      fail(Errc::kInvalidArgument, "endpoint '" + e + "': its port " + port +
                                       " + data_parallel_rank " + std::to_string(rank) + " = " +
                                       std::to_string(offset) + " exceeds 65535");
    return e.substr(0, colon + 1) + std::to_string(offset);
  }
  fail(Errc::kInvalidArgument, "endpoint '" + e +
                                   "' must be tcp:// or inproc:// when data_parallel_rank > 0 "
                                   "(its port or name is offset by the rank, as vLLM does)");
}

void check_tcp_port(const std::string& e) {
  if (e.rfind("tcp://", 0) != 0) return;
  const size_t colon = e.rfind(':');
  const std::string port = colon < 6 ? "" : e.substr(colon + 1);
  if (port == "*") return;
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535)
    fail(Errc::kInvalidArgument,
         "endpoint '" + e + "': its port must be * or a number from 0 to 65535");
}

void check_transport(const std::string& e, const char* what) {
  for (const char* t : {"pgm://", "epgm://", "norm://"})
    if (e.rfind(t, 0) == 0)
      fail(Errc::kInvalidArgument,
           std::string(what) + " '" + e + "': the " + std::string(t, std::strlen(t) - 3) +
               " transport is not supported (libzmq aborts the process when a NORM session "
               "fails to start, and OpenPGM writes to stderr); use tcp://, ipc://, inproc:// "
               "or ws://");
}

}  // namespace pagedkv::events
