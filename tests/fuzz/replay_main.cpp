// Replays fuzz inputs through the harness without libFuzzer, so the seed
// corpus runs in every build (plain, ASan+UBSan) as an ordinary test, and a
// crash file from a long fuzz run can be reproduced under a debugger.
// Usage: fuzz_replay FILE_OR_DIR...
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ops_harness.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "fuzz_replay: %s is neither a file nor a directory\n", argv[i]);
      return 2;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "fuzz_replay: no inputs\n");
    return 2;
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    pkv_fuzz::run_one(bytes.data(), bytes.size());
  }
  const pkv_fuzz::Counters& c = pkv_fuzz::counters();
  std::printf(
      "fuzz_replay: %llu inputs, %llu operations, %llu expected error statuses, %llu validates, "
      "%llu attention rows checked against the reference, %llu plans over unwritten context "
      "refused: all passed\n",
      (unsigned long long)c.inputs, (unsigned long long)c.ops, (unsigned long long)c.failed_calls,
      (unsigned long long)c.validates, (unsigned long long)c.attention_checked,
      (unsigned long long)c.unwritten_refused);
  return 0;
}
