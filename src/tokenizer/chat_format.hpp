// A model's chat format: its own Jinja template (tokenizer.chat_template), rendered by Ember's
// Jinja engine (jinja/) the way Hugging Face and llama.cpp's --jinja render it, with the
// conversation (tool calls and tool results included), the tools on offer, bos_token and
// eos_token; the family style (chat_template.hpp) where the file has no template or its template
// uses something the engine does not render (a warning says what, once).
//
// As llama.cpp does, a bos_token the template writes first is taken off the text where the
// tokenizer adds BOS itself (tokenizer.ggml.add_bos_token), and an eos_token it writes last where
// the tokenizer adds EOS: no token twice. (SmolLM2's BOS is <|im_start|>, which its tokenizer does
// not add: there it stays.)
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/jinja.hpp"
#include "tokenizer/chat_template.hpp"

namespace ember {

class Tokenizer;

class ChatFormatter {
 public:
  // source: the template (Jinja, or a style name, or "" for ChatML); bos / eos: the text of the
  // model's BOS and EOS tokens (the template's bos_token, eos_token). Throws ember::Error when
  // the template neither renders nor matches a family style.
  // strip_bos / strip_eos: the tokenizer adds BOS / EOS itself, so the template's are taken off.
  ChatFormatter(std::string source, std::string bos_token, std::string eos_token, bool strip_bos = false,
                bool strip_eos = false);

  // The prompt for `messages`; `tools` (a list of {"type": "function", "function": {...}}, or
  // undefined) goes to the template as `tools`. Throws jinja::Raised where the template refuses
  // the conversation (its raise_exception), ember::Error where it fails to render it or breaks
  // `limits` (jinja::Limits: steps, time, memory; its cancel flag).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const jinja::Value& tools = {}, const jinja::Limits& limits = {}) const;

  // The client's text (every string of the messages and tools) goes through `mark` before it
  // is rendered: Tokenizer::mark_as_text, so that a control token's text typed by a user (an
  // "<|im_end|>" closing its turn, a forged system turn) stays text and only the template's own
  // markup makes control tokens. chat_formatter_for sets it.
  using TextMarker = std::function<std::string(std::string_view)>;
  void set_text_marker(TextMarker mark) { mark_ = std::move(mark); }

  bool uses_jinja() const { return jinja_ != nullptr; }
  // Why the file's template is not rendered as Jinja ("" when it is, or when it is a style name).
  const std::string& fallback_reason() const { return fallback_; }
  const std::string& source() const { return source_; }
  // The family style ("" when the template matches none: then only Jinja renders it).
  std::string style_name() const;

 private:
  std::string render_style(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  std::string render_jinja(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                           const jinja::Value& tools, const jinja::Limits& limits = {}) const;

  std::string source_, bos_, eos_, fallback_;
  TextMarker mark_;
  bool strip_bos_ = false, strip_eos_ = false;
  std::shared_ptr<const jinja::Template> jinja_;
  std::unique_ptr<ChatTemplate> style_;
};

// The formatter of a template source for a tokenizer (which must outlive it): its BOS and EOS
// texts, whether it adds them, and its marker of the client's text (set_text_marker). Logs a warning when the template falls back to its family style (`what` names it).
ChatFormatter chat_formatter_for(std::string source, const Tokenizer& tok, const std::string& what);
// The formatter of a model's own template (model_chat_template with its architecture's
// `fallback_style`), or of a template file given instead (`override_file`, non-empty:
// --chat-template-file).
ChatFormatter model_chat_formatter(const gguf::Reader& file, const char* fallback_style, const Tokenizer& tok,
                                   const std::string& override_file = "");

// The conversation as the template reads it: a list of {"role", "content", "tool_calls": [{"id",
// "type": "function", "function": {"name", "arguments"}}], "tool_call_id", "name"}, arguments
// as a JSON object where they parse (as Hugging Face's templates expect), else as text.
jinja::Value messages_value(const std::vector<ChatMessage>& messages);

}  // namespace ember
