// Helper for crosscheck.py: reads hashing cases from stdin, one per line,
// and answers each with one line computed by the library. Strings travel as
// "x" + hex so that empty ones stay visible.
//   R algo seed                          -> cbor digest
//   B algo parent n t.. k (u v | s str | m str rel)..  -> cbor digest
//   P algo bs seed lora lora_name salt m (off len hash).. n t..  -> digest,digest,..
//   T algo bs seed lora lora_name lora_path salt m (off len hash).. n t..
//     -> the same with vLLM 0.33's tagged keys (HashContext::tagged)
// The answer is "ERR <message>" if the library throws.
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "error.h"
#include "hash/block_hash.h"
#include "hex.h"

namespace {

using namespace pagedkv;

std::string unhex(const std::string& f) {
  std::string out;
  for (size_t i = 1; i + 1 < f.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(f.substr(i, 2), nullptr, 16)));
  return out;
}

using test::hex;

std::string read_str(std::istream& in) {
  std::string f;
  in >> f;
  return unhex(f);
}

std::vector<int32_t> read_tokens(std::istream& in) {
  size_t n = 0;
  in >> n;
  std::vector<int32_t> t(n);
  for (int32_t& v : t) in >> v;
  return t;
}

std::string answer(const std::string& line) {
  std::istringstream in(line);
  std::string kind;
  uint32_t algo_id = 0;
  in >> kind >> algo_id;
  const HashAlgo algo = static_cast<HashAlgo>(algo_id);
  if (kind == "R") {
    const std::string seed = read_str(in);
    const std::vector<uint8_t> bytes = encode_seed_cbor(seed);
    return hex(bytes.data(), bytes.size()) + " " + hex(hash_root(algo, seed));
  }
  if (kind == "B") {
    const std::string parent_raw = read_str(in);
    BlockHash parent;
    std::copy(parent_raw.begin(), parent_raw.end(), parent.bytes.begin());
    parent.size = static_cast<uint8_t>(parent_raw.size());
    const std::vector<int32_t> tokens = read_tokens(in);
    size_t k = 0;
    in >> k;
    std::vector<ExtraKey> extra;
    for (size_t i = 0; i < k; ++i) {
      std::string tag;
      in >> tag;
      if (tag == "u") {
        uint64_t v = 0;
        in >> v;
        extra.push_back(ExtraKey::uint(v));
      } else if (tag == "m") {
        const std::string h = read_str(in);
        int64_t rel = 0;
        in >> rel;
        extra.push_back(ExtraKey::mm(h, rel));
      } else {
        extra.push_back(ExtraKey::str(read_str(in)));
      }
    }
    const std::vector<uint8_t> bytes =
        encode_block_cbor(parent, tokens.data(), tokens.size(), extra);
    return hex(bytes.data(), bytes.size()) + " " +
           hex(hash_block(algo, parent, tokens.data(), tokens.size(), extra));
  }
  if (kind == "P" || kind == "T") {
    HashContext ctx;
    ctx.algo = algo;
    in >> ctx.block_size;
    const std::string seed = read_str(in);
    in >> ctx.lora_id;
    ctx.lora_name = read_str(in);
    if (kind == "T") {
      ctx.tagged = true;
      ctx.lora_path = read_str(in);
    }
    ctx.cache_salt = read_str(in);
    size_t m = 0;
    in >> m;
    for (size_t i = 0; i < m; ++i) {
      MmItem item;
      in >> item.offset >> item.length;
      item.hash = read_str(in);
      ctx.mm_items.push_back(item);
    }
    const std::vector<int32_t> tokens = read_tokens(in);
    const std::vector<BlockHash> hashes =
        hash_prefix(ctx, hash_root(algo, seed), tokens.data(), tokens.size());
    std::string out = hashes.empty() ? "-" : "";
    for (size_t i = 0; i < hashes.size(); ++i) out += (i ? "," : "") + hex(hashes[i]);
    return out;
  }
  return "ERR unknown case kind " + kind;
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    try {
      std::cout << answer(line) << '\n';
    } catch (const std::exception& e) {
      std::cout << "ERR " << e.what() << '\n';
    }
  }
  return 0;
}
