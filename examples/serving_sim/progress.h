// One updating status line on stderr while the simulation runs; off when
// stderr is not a terminal or with --quiet.
#pragma once

#include <chrono>
#include <string>

namespace sim {

class Progress {
 public:
  explicit Progress(bool quiet);
  ~Progress() { finish(); }
  // Redraws at most ten times a second unless force.
  void update(const std::string& line, bool force = false);
  // Clears the line.
  void finish();

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace sim
