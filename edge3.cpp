#include <cstdio>
#include "pagedkv/pagedkv.h"
#define T(x) do { pkv_status s_ = (x); printf("%-50s -> %d %s\n", #x, s_, s_ ? pkv_last_error_message() : ""); if (!s_ && p) { pkv_pool_destroy(p); p = nullptr; } } while (0)
int main() {
  pkv_kv_group_spec g; pkv_kv_group_spec_init(&g); g.num_kv_heads = 1; g.head_dim = 4;
  pkv_pool* p = nullptr;
  pkv_pool_options o;
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.enable_events = 1; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.enable_events = 2; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.enable_retention = 2; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.enable_partial_reuse = 7; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.max_pinned_blocks = 3; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.sliding_window = 3; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.num_layers = 3; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.hash_algo = 9; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.block_size = 0; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.block_size = 3000; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 1; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = (1ull<<31); T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.kv_layout = 1; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.device_type = 9; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.dtype = 99; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.num_kv_scales = 2; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.enable_prefix_caching = 0; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.max_events = 0; T(pkv_pool_create_groups(&o, &g, 1, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.max_pinned_blocks = 3; T(pkv_pool_create(&o, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.enable_partial_reuse = 7; T(pkv_pool_create(&o, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.enable_partial_reuse = 1; o.enable_prefix_caching = 0; T(pkv_pool_create(&o, &p));
  pkv_pool_options_init_sized(&o, sizeof o); o.num_blocks = 8; o.max_events = 0; o.enable_events = 1; T(pkv_pool_create(&o, &p));
}
