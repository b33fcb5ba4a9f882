// Generates the bad-input table of docs/errors.md from the same case list the
// test runs (bad_input_cases.cpp), and checks that the committed table is
// current.
//   errors_table                 print the generated section
//   errors_table --write FILE    replace the section between the markers
//                                (appended if FILE has none)
//   errors_table --check FILE    exit 1 if FILE's section differs
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "bad_input_cases.h"

namespace {

const char* kBegin = "<!-- BEGIN GENERATED: bad-input table (tests/reliability/errors_table) -->";
const char* kEnd = "<!-- END GENERATED: bad-input table -->";

std::string escape(const char* s) {
  std::string o;
  for (; *s; ++s) o += *s == '|' ? std::string("\\|") : std::string(1, *s);
  return o;
}

std::string section() {
  const auto& cases = pkv_rel::bad_input_cases();
  std::set<std::string> fns;
  std::map<std::string, int> per_class;
  for (const auto& c : cases) {
    fns.insert(c.fn);
    ++per_class[c.cls];
  }
  std::ostringstream o;
  o << kBegin << "\n";
  o << "<!-- Do not edit by hand: run `build/tests/reliability/errors_table --write "
       "docs/errors.md`."
       " The ctest check reliability.errors_doc_current fails when this table is stale. -->\n\n";
  o << "### What each function returns for bad input\n\n";
  o << cases.size() << " cases over " << fns.size()
    << " functions, each run by the CTest test `reliability.bad_input_matrix` (label `capi`): the "
       "call"
       " returns the status below, `pkv_last_error_message()` names the argument, and the pools"
       " are exactly as before (`pkv_pool_validate` clean; stats, sequence infos, block tables and"
       " hashes equal). Functions without a status (init/destroy/size helpers) show what they do"
       " instead. `pkv_version_*`, `pkv_abi_version`, `pkv_features`, `pkv_last_error_message` and"
       " `pkv_cuda_device_count` take no argument that can be wrong.\n\n";
  o << "| Function | Bad argument | Class | Result |\n|---|---|---|---|\n";
  for (const auto& c : cases) {
    std::string result;
    if (c.result) {
      result = c.result;
    } else {
      result = std::string("`") + pkv_rel::status_name(c.want) + "`";
      if (c.want_alt != 1)
        result += std::string(" (no CUDA in the build) or `") + pkv_rel::status_name(c.want_alt) +
                  "` (no such device)";
    }
    o << "| `" << c.fn << "` | " << escape(c.what) << " | " << c.cls << " | "
      << escape(result.c_str()) << " |\n";
  }
  o << "\nCases per class:";
  for (const auto& kv : per_class) o << " " << kv.first << " " << kv.second << ";";
  o << "\n" << kEnd << "\n";
  return o.str();
}

bool read(const char* path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

// The current section of text (markers included), or "" if it has none.
std::string current(const std::string& text, size_t* b, size_t* e) {
  *b = text.find(kBegin);
  if (*b == std::string::npos) return "";
  *e = text.find(kEnd, *b);
  if (*e == std::string::npos) return "";
  *e += std::strlen(kEnd);
  if (*e < text.size() && text[*e] == '\n') ++*e;
  return text.substr(*b, *e - *b);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string gen = section();
  if (argc == 1) {
    std::fputs(gen.c_str(), stdout);
    return 0;
  }
  if (argc != 3 || (std::strcmp(argv[1], "--write") != 0 && std::strcmp(argv[1], "--check") != 0)) {
    std::fprintf(stderr, "usage: %s [--write|--check FILE]\n", argv[0]);
    return 2;
  }
  std::string text;
  const bool exists = read(argv[2], &text);
  size_t b = 0, e = 0;
  const std::string cur = exists ? current(text, &b, &e) : "";
  if (std::strcmp(argv[1], "--check") == 0) {
    if (cur == gen) return 0;
    std::fprintf(stderr,
                 "%s: the generated bad-input table is %s; regenerate it with\n"
                 "  errors_table --write %s\n",
                 argv[2], cur.empty() ? "missing" : "out of date", argv[2]);
    return 1;
  }
  if (cur.empty())
    text += (text.empty() || text.back() == '\n' ? "\n" : "\n\n") + gen;
  else
    text.replace(b, e - b, gen);
  std::ofstream out(argv[2], std::ios::binary | std::ios::trunc);
  out << text;
  return out ? 0 : 1;
}
