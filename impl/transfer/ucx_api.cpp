#include "transfer/ucx_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace pagedkv {
namespace ucxdl {
namespace {

Api g_api;
const Api* g_loaded = nullptr;
std::string g_why;

void load_once() {
  // UCX reads its environment in libucs's constructor, i.e. inside dlopen:
  // without this, loading it would install UCX's handlers for crash signals
  // over the host's. A user who sets UCX_HANDLE_ERRORS keeps that choice.
  setenv("UCX_HANDLE_ERRORS", "none", 0);
  void* h = dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    g_why = std::string("the UCX runtime (libucp.so.0) could not be loaded: ") +
            (e ? e : "unknown error") + " (install libucx0)";
    return;
  }
  bool ok = true;
#define PKV_UCX_RESOLVE(name)                                                     \
  g_api.name = reinterpret_cast<decltype(g_api.name)>(dlsym(h, #name));           \
  if (!g_api.name) {                                                              \
    ok = false;                                                                   \
    g_why = "the UCX runtime has no symbol " #name " (UCX 1.13 or newer needed)"; \
  }
  PKV_UCX_FUNCTIONS(PKV_UCX_RESOLVE)
#undef PKV_UCX_RESOLVE
  g_api.global_opts = static_cast<ucs_global_opts_t*>(dlsym(h, "ucs_global_opts"));
  if (!g_api.global_opts) {
    ok = false;
    g_why = "the UCX runtime has no symbol ucs_global_opts";
  }
  // The handle stays open for the life of the process: UCX does not
  // support being unloaded and reloaded.
  if (ok) g_loaded = &g_api;
}

}  // namespace

const Api* load(std::string* why) {
  static std::once_flag once;
  std::call_once(once, load_once);
  if (!g_loaded && why) *why = g_why;
  return g_loaded;
}

const Api& api() { return g_api; }

}  // namespace ucxdl
}  // namespace pagedkv
