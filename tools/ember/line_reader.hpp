// `ember chat`'s input: lines from standard input. On a terminal the kernel's canonical mode
// keeps at most 4095 bytes of a line and drops the rest of a long paste without a word, so a
// line is read byte by byte (non-canonical mode, while the reader lives) with the editing a user
// expects: backspace over whole UTF-8 characters, Ctrl-U erases the line, Ctrl-D on an empty line
// ends the input, Ctrl-C interrupts (the caller's SIGINT handler runs). Bracketed paste (the
// terminal marks a paste) makes a pasted text, newlines included, one piece of the line, which
// Enter then sends. Anywhere else (a pipe, a file) std::getline, of any length.
#pragma once
#include <memory>
#include <string>

namespace ember::cli {

class LineReader {
 public:
  LineReader();
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Prints `prompt` and reads one line into `line` (without its end; pasted newlines kept).
  // False at the end of the input, or when a signal interrupted the read (Ctrl-C).
  bool read(const char* prompt, std::string& line);
  bool terminal() const { return tty_; }

 private:
  bool read_tty(const char* prompt, std::string& line);
  struct Terminal;
  bool tty_ = false;
  std::unique_ptr<Terminal> term_;
};

}  // namespace ember::cli
