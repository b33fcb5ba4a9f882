#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>

namespace sim {

Progress::Progress(bool quiet) : enabled_(!quiet && isatty(STDERR_FILENO)) {}

void Progress::update(const std::string& line, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  // A line wider than the terminal would wrap and \r could not redraw it.
  std::string shown = line;
  winsize ws{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && shown.size() >= ws.ws_col)
    shown.resize(ws.ws_col - 1);
  // \r back to the start, \x1b[K clears what a longer previous line left.
  std::fprintf(stderr, "\r%s\x1b[K", shown.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (!enabled_ || !drawn_) return;
  std::fprintf(stderr, "\r\x1b[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace sim
