#include "line_reader.hpp"

#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>

namespace ember::cli {

namespace {

// One byte from standard input: 1, 0 at its end, -1 when interrupted or on an error.
int get_byte(unsigned char& c) {
  const ssize_t n = ::read(STDIN_FILENO, &c, 1);
  return n == 1 ? 1 : n == 0 ? 0 : -1;
}

void put(const char* s, size_t n) {
  if (n > 0 && ::write(STDOUT_FILENO, s, n) < 0) {
  }
}
void put(const std::string& s) { put(s.data(), s.size()); }

}  // namespace

// The terminal stays in non-canonical mode without echo (this reader echoes) while the reader
// lives, not only while it reads: keys typed during a reply (Ctrl-D among them) wait as bytes for
// the next read, where canonical mode would take them as lines and EOFs that the switch loses.
// Signals are kept (Ctrl-C raises SIGINT); bracketed paste is asked for. Restored after.
struct LineReader::Terminal {
  termios saved{};
  bool raw = false;
  Terminal() {
    if (tcgetattr(STDIN_FILENO, &saved) != 0) return;
    termios t = saved;
    t.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    t.c_cc[VMIN] = 1;
    t.c_cc[VTIME] = 0;
    raw = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
    if (raw) put("\x1b[?2004h");
  }
  ~Terminal() {
    if (!raw) return;
    put("\x1b[?2004l");
    tcsetattr(STDIN_FILENO, TCSANOW, &saved);
  }
};

LineReader::LineReader() : tty_(isatty(STDIN_FILENO) == 1) {
  if (tty_) term_ = std::make_unique<Terminal>();
}
LineReader::~LineReader() = default;

bool LineReader::read(const char* prompt, std::string& line) {
  line.clear();
  std::fputs(prompt, stdout);
  std::fflush(stdout);
  if (!tty_) return static_cast<bool>(std::getline(std::cin, line));
  return read_tty(prompt, line);
}

bool LineReader::read_tty(const char* prompt, std::string& line) {
  if (!term_->raw) return static_cast<bool>(std::getline(std::cin, line));
  bool pasting = false;
  for (;;) {
    unsigned char c = 0;
    const int r = get_byte(c);
    if (r <= 0) return false;  // the input's end, or a signal (Ctrl-C)
    if (c == 0x1b) {  // an escape sequence: the paste marks, else ignored (arrow keys, ...)
      std::string seq;
      unsigned char d = 0;
      if (get_byte(d) <= 0) return false;
      if (d != '[' && d != 'O') continue;
      for (;;) {
        if (get_byte(d) <= 0) return false;
        seq += static_cast<char>(d);
        if (d >= 0x40 && d <= 0x7e) break;
      }
      if (seq == "200~") pasting = true;
      if (seq == "201~") pasting = false;
      continue;
    }
    if (pasting) {  // everything as it comes, newlines and tabs included
      if (c == '\r') c = '\n';
      line += static_cast<char>(c);
      put(reinterpret_cast<const char*>(&c), 1);
      continue;
    }
    if (c == '\r' || c == '\n') {
      put("\n");
      return true;
    }
    if (c == 0x04) {  // Ctrl-D: the end on an empty line
      if (line.empty()) return false;
      continue;
    }
    if (c == 0x7f || c == 0x08) {  // backspace: one whole UTF-8 character
      if (line.empty()) continue;
      while (!line.empty() && (static_cast<unsigned char>(line.back()) & 0xc0) == 0x80) line.pop_back();
      const char gone = line.back();
      line.pop_back();
      if (gone != '\n') put("\b \b");
      continue;
    }
    if (c == 0x15) {  // Ctrl-U: the whole line
      line.clear();
      put(std::string("\r\x1b[K") + prompt);
      continue;
    }
    if (c < 0x20 && c != '\t') continue;  // other control characters
    line += static_cast<char>(c);
    put(reinterpret_cast<const char*>(&c), 1);
  }
}

}  // namespace ember::cli
