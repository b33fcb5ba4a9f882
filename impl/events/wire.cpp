#include "wire.h"

#include <msgpack.hpp>

namespace pagedkv::events {

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(Packer& pk, const std::string& s) {
  pk.pack_str(uint32_t(s.size()));
  pk.pack_str_body(s.data(), uint32_t(s.size()));
}

void pack_hash(Packer& pk, const BlockHash& h, bool as_int) {
  if (as_int) {
    uint64_t v = 0;
    for (size_t i = h.size >= 8 ? h.size - 8 : 0; i < h.size; ++i) v = (v << 8) | h.bytes[i];
    pk.pack_uint64(v);
  } else {
    pk.pack_bin(h.size);
    pk.pack_bin_body(reinterpret_cast<const char*>(h.bytes.data()), h.size);
  }
}

// msgspec writes a struct's fields in declaration order, the tag first; in
// map form under the key "type". Fields without a default are always
// written (None as nil); those with one (extra_keys, group_idx...) are
// omitted when unset (omit_defaults=True), so both forms decode with
// vLLM's classes.
void begin(Packer& pk, bool map, const char* tag, uint32_t num_fields) {
  if (map) {
    pk.pack_map(num_fields + 1);
    pack_str(pk, "type");
  } else {
    pk.pack_array(num_fields + 1);
  }
  pack_str(pk, tag);
}

void key(Packer& pk, bool map, const char* k) {
  if (map) pack_str(pk, k);
}

bool chains(const Event& prev, const Event& e) {
  return e.type == EventType::kStored && prev.type == EventType::kStored && e.has_tokens &&
         prev.has_tokens && e.parent_hash == prev.block_hash && e.lora_id == prev.lora_id &&
         e.medium == prev.medium;
}

bool joins(const Event& prev, const Event& e) {
  return e.type == EventType::kRemoved && prev.type == EventType::kRemoved &&
         e.medium == prev.medium;
}

const std::string& medium_of(const WireOptions& o, uint32_t m) { return o.medium[m < 3 ? m : 0]; }

}  // namespace

size_t encode_batch(const Event* ev, size_t n, const int32_t* tokens, uint32_t block_size,
                    double ts, uint32_t dp_rank, const WireOptions& o, std::string* out) {
  // Group first: the batch's array header needs the event count.
  struct Run {
    size_t begin, end;
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < n; ++i) {
    if (ev[i].type == EventType::kPriority) continue;
    if (!runs.empty() && runs.back().end == i &&
        (chains(ev[i - 1], ev[i]) || joins(ev[i - 1], ev[i]))) {
      runs.back().end = i + 1;
    } else {
      runs.push_back({i, i + 1});
    }
  }
  msgpack::sbuffer buf;
  Packer pk(buf);
  const bool map = o.map_events;
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(uint32_t(runs.size()));
  for (const Run& r : runs) {
    const Event& first = ev[r.begin];
    switch (first.type) {
      case EventType::kStored: {
        begin(pk, map, "BlockStored", 7);
        key(pk, map, "block_hashes");
        pk.pack_array(uint32_t(r.end - r.begin));
        for (size_t i = r.begin; i < r.end; ++i) pack_hash(pk, ev[i].block_hash, o.int_hashes);
        key(pk, map, "parent_block_hash");
        if (first.parent_hash.empty())
          pk.pack_nil();
        else
          pack_hash(pk, first.parent_hash, o.int_hashes);
        key(pk, map, "token_ids");
        if (first.has_tokens) {
          pk.pack_array(uint32_t((r.end - r.begin) * block_size));
          for (size_t i = r.begin; i < r.end; ++i)
            for (uint32_t t = 0; t < block_size; ++t) pk.pack_int32(tokens[i * block_size + t]);
        } else {
          pk.pack_array(0);
        }
        key(pk, map, "block_size");
        pk.pack_uint32(block_size);
        key(pk, map, "lora_id");
        if (first.lora_id)
          pk.pack_uint64(first.lora_id);
        else
          pk.pack_nil();
        key(pk, map, "medium");
        pack_str(pk, medium_of(o, first.medium));
        key(pk, map, "lora_name");
        pk.pack_nil();
        break;
      }
      case EventType::kRemoved:
        begin(pk, map, "BlockRemoved", 2);
        key(pk, map, "block_hashes");
        pk.pack_array(uint32_t(r.end - r.begin));
        for (size_t i = r.begin; i < r.end; ++i) pack_hash(pk, ev[i].block_hash, o.int_hashes);
        key(pk, map, "medium");
        pack_str(pk, medium_of(o, first.medium));
        break;
      default:  // kAllCleared
        begin(pk, map, "AllBlocksCleared", 0);
        break;
    }
  }
  pk.pack_uint32(dp_rank);
  out->append(buf.data(), buf.size());
  return runs.size();
}

}  // namespace pagedkv::events
