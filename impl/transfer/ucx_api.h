// UCX loaded at run time. libpagedkv does not link libucp: libucs installs
// crash-signal handlers (SIGSEGV, SIGBUS, ...) from its constructor, and a
// library must not change how every host process handles signals just by
// being loaded (Go's runtime relies on its own SIGSEGV handler). The
// transfer engine dlopens libucp on first use instead, with UCX's error
// handling off unless the user configured it (UCX_HANDLE_ERRORS).
#pragma once

#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>

#include <string>

#define PKV_UCX_FUNCTIONS(X)    \
  X(ucs_status_string)          \
  X(ucp_request_free)           \
  X(ucp_request_check_status)   \
  X(ucp_worker_progress)        \
  X(ucp_mem_unmap)              \
  X(ucp_ep_create)              \
  X(ucp_config_release)         \
  X(ucp_worker_release_address) \
  X(ucp_worker_get_address)     \
  X(ucp_worker_destroy)         \
  X(ucp_worker_create)          \
  X(ucp_rkey_pack)              \
  X(ucp_rkey_destroy)           \
  X(ucp_rkey_buffer_release)    \
  X(ucp_mem_map)                \
  X(ucp_init_version)           \
  X(ucp_get_nbx)                \
  X(ucp_ep_rkey_unpack)         \
  X(ucp_ep_flush_nbx)           \
  X(ucp_worker_flush_nbx)       \
  X(ucp_ep_close_nbx)           \
  X(ucp_config_read)            \
  X(ucp_config_modify)          \
  X(ucp_cleanup)

namespace pagedkv {
namespace ucxdl {

struct Api {
#define PKV_UCX_POINTER(name) decltype(&::name) name = nullptr;
  PKV_UCX_FUNCTIONS(PKV_UCX_POINTER)
#undef PKV_UCX_POINTER
  ucs_global_opts_t* global_opts = nullptr;
};

// Loads libucp.so.0 once. Null when it cannot, with the reason in *why.
const Api* load(std::string* why);

// The loaded API; only valid after load() returned non-null.
const Api& api();

}  // namespace ucxdl
}  // namespace pagedkv
