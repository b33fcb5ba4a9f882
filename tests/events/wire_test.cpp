// The batch encoding, decoded with msgpack-c and compared field by field
// with the layout of vLLM's KVEventBatch (impl/events/wire.h).
#include <gtest/gtest.h>

#include <map>
#include <msgpack.hpp>
#include <random>
#include <string>
#include <vector>

#include "events/wire.h"

namespace pagedkv::events {
namespace {

BlockHash random_hash(std::mt19937_64& rng, uint8_t size) {
  BlockHash h;
  h.size = size;
  for (uint8_t i = 0; i < size; ++i) h.bytes[i] = uint8_t(rng());
  return h;
}

uint64_t last8(const BlockHash& h) {
  uint64_t v = 0;
  for (size_t i = h.size - 8; i < h.size; ++i) v = (v << 8) | h.bytes[i];
  return v;
}

std::map<std::string, msgpack::object> as_map(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::MAP);
  std::map<std::string, msgpack::object> m;
  for (uint32_t i = 0; i < o.via.map.size; ++i)
    m[o.via.map.ptr[i].key.as<std::string>()] = o.via.map.ptr[i].val;
  return m;
}

struct Fixture {
  std::vector<Event> events;
  std::vector<int32_t> tokens;
};

// A chain of 3 stored blocks, a stored block of another chain, 2 removed,
// a priority event (no vLLM counterpart), a removed block of the host tier,
// and a cleared cache.
Fixture make(std::mt19937_64& rng, uint32_t bs, uint8_t hsize) {
  Fixture f;
  auto stored = [&](const BlockHash* parent, uint64_t lora) {
    Event e;
    e.type = EventType::kStored;
    e.block_hash = random_hash(rng, hsize);
    if (parent) e.parent_hash = *parent;
    e.num_tokens = bs;
    e.lora_id = lora;
    e.has_tokens = true;
    f.events.push_back(e);
  };
  stored(nullptr, 0);
  for (int i = 0; i < 2; ++i) stored(&f.events.back().block_hash, 0);
  BlockHash other = random_hash(rng, hsize);
  stored(&other, 7);
  for (int i = 0; i < 2; ++i) {
    Event e;
    e.type = EventType::kRemoved;
    e.block_hash = random_hash(rng, hsize);
    f.events.push_back(e);
  }
  Event p;
  p.type = EventType::kPriority;
  f.events.push_back(p);
  Event host;
  host.type = EventType::kRemoved;
  host.block_hash = random_hash(rng, hsize);
  host.medium = 1;
  f.events.push_back(host);
  Event c;
  c.type = EventType::kAllCleared;
  f.events.push_back(c);
  f.tokens.resize(f.events.size() * bs);
  for (auto& t : f.tokens) t = int32_t(rng() % 200000);
  return f;
}

class WireTest : public ::testing::TestWithParam<std::tuple<bool, bool, uint8_t>> {};

TEST_P(WireTest, DecodesAsVllmLayout) {
  // Not a structured binding: C++17 lambdas (clang 14) cannot capture one.
  const bool map = std::get<0>(GetParam());
  const bool ints = std::get<1>(GetParam());
  const auto hsize = std::get<2>(GetParam());
  std::mt19937_64 rng(42 + map * 2 + ints + hsize);
  const uint32_t bs = 4;
  Fixture f = make(rng, bs, hsize);
  WireOptions o;
  o.map_events = map;
  o.int_hashes = ints;
  o.medium[0] = "GPU";
  std::string out = "prefix";  // appended to, never overwritten
  const size_t n =
      encode_batch(f.events.data(), f.events.size(), f.tokens.data(), bs, 1234.5, 3, o, &out);
  ASSERT_EQ(n, 5u);  // chain, lone stored, 2 device removals, host removal, cleared
  ASSERT_EQ(out.substr(0, 6), "prefix");
  msgpack::object_handle oh = msgpack::unpack(out.data() + 6, out.size() - 6);
  const msgpack::object& batch = oh.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
  EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 1234.5);
  EXPECT_EQ(batch.via.array.ptr[2].as<uint32_t>(), 3u);
  const msgpack::object& evs = batch.via.array.ptr[1];
  ASSERT_EQ(evs.via.array.size, 5u);

  auto hash_ok = [&](const msgpack::object& v, const BlockHash& h) {
    if (ints) {
      EXPECT_EQ(v.type, msgpack::type::POSITIVE_INTEGER);
      EXPECT_EQ(v.as<uint64_t>(), last8(h));
    } else {
      ASSERT_EQ(v.type, msgpack::type::BIN);
      ASSERT_EQ(v.via.bin.size, h.size);
      EXPECT_EQ(std::memcmp(v.via.bin.ptr, h.bytes.data(), h.size), 0);
    }
  };
  // Fields by name (map) or by vLLM's declaration order (array).
  const std::vector<std::string> stored_fields = {"type",      "block_hashes", "parent_block_hash",
                                                  "token_ids", "block_size",   "lora_id",
                                                  "medium",    "lora_name"};
  const std::vector<std::string> removed_fields = {"type", "block_hashes", "medium"};
  auto fields = [&](const msgpack::object& e, const std::vector<std::string>& names) {
    std::map<std::string, msgpack::object> m;
    if (map) {
      m = as_map(e);
      EXPECT_EQ(m.size(), names.size());
    } else {
      EXPECT_EQ(e.type, msgpack::type::ARRAY);
      EXPECT_EQ(e.via.array.size, names.size());
      for (size_t i = 0; i < names.size() && i < e.via.array.size; ++i)
        m[names[i]] = e.via.array.ptr[i];
    }
    return m;
  };

  // The chain: one BlockStored with 3 hashes, no parent, 12 token ids.
  auto s = fields(evs.via.array.ptr[0], stored_fields);
  EXPECT_EQ(s["type"].as<std::string>(), "BlockStored");
  ASSERT_EQ(s["block_hashes"].via.array.size, 3u);
  for (size_t i = 0; i < 3; ++i)
    hash_ok(s["block_hashes"].via.array.ptr[i], f.events[i].block_hash);
  EXPECT_TRUE(s["parent_block_hash"].is_nil());
  EXPECT_EQ(s["token_ids"].as<std::vector<int32_t>>(),
            std::vector<int32_t>(f.tokens.begin(), f.tokens.begin() + 3 * bs));
  EXPECT_EQ(s["block_size"].as<uint32_t>(), bs);
  EXPECT_TRUE(s["lora_id"].is_nil());
  EXPECT_EQ(s["medium"].as<std::string>(), "GPU");
  EXPECT_TRUE(s["lora_name"].is_nil());
  // The other chain: its parent, its LoRA.
  s = fields(evs.via.array.ptr[1], stored_fields);
  ASSERT_EQ(s["block_hashes"].via.array.size, 1u);
  hash_ok(s["block_hashes"].via.array.ptr[0], f.events[3].block_hash);
  hash_ok(s["parent_block_hash"], f.events[3].parent_hash);
  EXPECT_EQ(s["token_ids"].as<std::vector<int32_t>>(),
            std::vector<int32_t>(f.tokens.begin() + 3 * bs, f.tokens.begin() + 4 * bs));
  EXPECT_EQ(s["lora_id"].as<uint64_t>(), 7u);
  // Device removals in one BlockRemoved; the host tier's apart, "CPU".
  auto r = fields(evs.via.array.ptr[2], removed_fields);
  EXPECT_EQ(r["type"].as<std::string>(), "BlockRemoved");
  ASSERT_EQ(r["block_hashes"].via.array.size, 2u);
  hash_ok(r["block_hashes"].via.array.ptr[0], f.events[4].block_hash);
  hash_ok(r["block_hashes"].via.array.ptr[1], f.events[5].block_hash);
  EXPECT_EQ(r["medium"].as<std::string>(), "GPU");
  r = fields(evs.via.array.ptr[3], removed_fields);
  ASSERT_EQ(r["block_hashes"].via.array.size, 1u);
  hash_ok(r["block_hashes"].via.array.ptr[0], f.events[7].block_hash);
  EXPECT_EQ(r["medium"].as<std::string>(), "CPU");
  auto c = fields(evs.via.array.ptr[4], {"type"});
  EXPECT_EQ(c["type"].as<std::string>(), "AllBlocksCleared");
}

INSTANTIATE_TEST_SUITE_P(Encodings, WireTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(uint8_t(32), uint8_t(16))));

TEST(Wire, OnlyPriorityEventsMakeAnEmptyBatch) {
  Event p;
  p.type = EventType::kPriority;
  std::string out;
  EXPECT_EQ(encode_batch(&p, 1, nullptr, 16, 1.0, 0, WireOptions{}, &out), 0u);
  msgpack::object_handle oh = msgpack::unpack(out.data(), out.size());
  EXPECT_EQ(oh.get().via.array.ptr[1].via.array.size, 0u);
}

TEST(Wire, BrokenChainsStaySeparate) {
  std::mt19937_64 rng(7);
  std::vector<Event> ev(3);
  for (auto& e : ev) {
    e.type = EventType::kStored;
    e.block_hash = random_hash(rng, 32);
    e.has_tokens = true;
  }
  ev[1].parent_hash = ev[0].block_hash;  // chains
  ev[2].parent_hash = ev[0].block_hash;  // a sibling, not a child of ev[1]
  std::vector<int32_t> tokens(3 * 2, 5);
  std::string out;
  EXPECT_EQ(encode_batch(ev.data(), 3, tokens.data(), 2, 1.0, 0, WireOptions{}, &out), 2u);
}

}  // namespace
}  // namespace pagedkv::events
