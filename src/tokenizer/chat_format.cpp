#include "tokenizer/chat_format.hpp"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/json.hpp"
#include "core/log.hpp"
#include "gguf/reader.hpp"
#include "jinja/json.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember {

namespace {

bool is_style_name(const std::string& s) {
  for (const char* n : {"", "chatml", "llama3", "llama2", "gemma", "phi3", "mistral-v1", "mistral-v3",
                        "mistral-v3-tekken", "mistral-v7"})
    if (s == n) return true;
  return false;
}

}  // namespace

jinja::Value messages_value(const std::vector<ChatMessage>& messages) {
  jinja::Value::Array list;
  for (const ChatMessage& m : messages) {
    jinja::Value v = jinja::Value::object();
    jinja::Value::Object& o = v.as_object();
    o.set("role", jinja::Value(m.role));
    o.set("content", jinja::Value(m.content));
    if (!m.tool_calls.empty()) {
      jinja::Value::Array calls;
      for (const ToolCall& c : m.tool_calls) {
        jinja::Value fn = jinja::Value::object();
        fn.as_object().set("name", jinja::Value(c.name));
        const auto args = parse_json<nlohmann::ordered_json>(c.arguments);
        fn.as_object().set("arguments", args.is_discarded() ? jinja::Value(c.arguments) : jinja::from_json(args));
        jinja::Value call = jinja::Value::object();
        call.as_object().set("id", jinja::Value(c.id));
        call.as_object().set("type", jinja::Value("function"));
        call.as_object().set("function", fn);
        calls.push_back(call);
      }
      o.set("tool_calls", jinja::Value::array(std::move(calls)));
    }
    if (!m.tool_call_id.empty()) o.set("tool_call_id", jinja::Value(m.tool_call_id));
    if (!m.name.empty()) o.set("name", jinja::Value(m.name));
    list.push_back(v);
  }
  return jinja::Value::array(std::move(list));
}

ChatFormatter::ChatFormatter(std::string source, std::string bos_token, std::string eos_token, bool strip_bos,
                             bool strip_eos)
    : source_(std::move(source)),
      bos_(std::move(bos_token)),
      eos_(std::move(eos_token)),
      strip_bos_(strip_bos),
      strip_eos_(strip_eos) {
  std::string style_error;
  try {
    style_ = std::make_unique<ChatTemplate>(parse_chat_template(source_));
  } catch (const Error& e) {
    style_error = e.what();
  }
  if (is_style_name(source_)) return;
  try {
    auto t = std::make_shared<jinja::Template>(source_);
    // A trial conversation: what the template cannot render shows now, not at the first request.
    const std::vector<ChatMessage> trial = {{"user", "Hello"}, {"assistant", "Hi!"}, {"user", "How are you?"}};
    jinja_ = t;
    try {
      render_jinja(trial, true, {});
    } catch (const jinja::Raised&) {  // it refused this conversation: it renders, though
    }
  } catch (const jinja::Raised&) {
  } catch (const Error& e) {
    jinja_.reset();
    fallback_ = e.what();
  }
  EMBER_CHECK(jinja_ || style_, "the chat template cannot be rendered ({}) and matches no built-in style ({})",
              fallback_, style_error);
}

std::string ChatFormatter::style_name() const { return style_ ? chat_style_name(style_->style) : ""; }

std::string ChatFormatter::render_style(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  EMBER_CHECK(style_, "the chat template matches no built-in style");
  return render_chat(*style_, messages, add_generation_prompt);
}

namespace {

ChatMessage marked(ChatMessage m, const ChatFormatter::TextMarker& mark) {
  for (std::string* s : {&m.content, &m.tool_call_id, &m.name}) *s = mark(*s);
  for (ToolCall& c : m.tool_calls)
    for (std::string* s : {&c.id, &c.name, &c.arguments}) *s = mark(*s);
  return m;
}

jinja::Value marked(const jinja::Value& v, const ChatFormatter::TextMarker& mark) {
  if (v.is_string()) return jinja::Value(mark(v.as_string()));
  if (v.is_array()) {
    jinja::Value::Array out;
    for (const jinja::Value& x : v.as_array()) out.push_back(marked(x, mark));
    return jinja::Value::array(std::move(out));
  }
  if (v.is_object()) {
    jinja::Value out = jinja::Value::object();
    for (const auto& [k, x] : v.as_object().items()) out.as_object().set(mark(k), marked(x, mark));
    return out;
  }
  return v;
}

}  // namespace

std::string ChatFormatter::render(const std::vector<ChatMessage>& given, bool add_generation_prompt,
                                  const jinja::Value& given_tools, const jinja::Limits& limits) const {
  std::vector<ChatMessage> messages;
  for (const ChatMessage& m : given) messages.push_back(mark_ ? marked(m, mark_) : m);
  const jinja::Value tools = mark_ ? marked(given_tools, mark_) : given_tools;
  if (!jinja_) return render_style(messages, add_generation_prompt);
  try {
    return render_jinja(messages, add_generation_prompt, tools, limits);
  } catch (const jinja::Unsupported& e) {  // this conversation needs what the engine lacks
    if (!style_) throw;
    log_warn("the chat template cannot render this conversation ({}); using the built-in {} style", e.what(),
             style_name());
    return render_style(messages, add_generation_prompt);
  }
}

std::string ChatFormatter::render_jinja(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                        const jinja::Value& tools, const jinja::Limits& limits) const {
  jinja::Value vars = jinja::Value::object();
  jinja::Value::Object& v = vars.as_object();
  v.set("messages", messages_value(messages));
  v.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  v.set("bos_token", jinja::Value(bos_));
  v.set("eos_token", jinja::Value(eos_));
  if (tools.is_array() && !tools.as_array().empty()) v.set("tools", tools);
  std::string out = jinja_->render(vars, limits);
  if (strip_bos_ && !bos_.empty() && out.starts_with(bos_)) out.erase(0, bos_.size());
  if (strip_eos_ && !eos_.empty() && out.ends_with(eos_)) out.resize(out.size() - eos_.size());
  return out;
}

ChatFormatter chat_formatter_for(std::string source, const Tokenizer& tok, const std::string& what) {
  const auto piece = [&](int32_t id) { return id >= 0 && id < tok.n_vocab() ? tok.token_to_piece(id, true) : std::string(); };
  ChatFormatter f(std::move(source), piece(tok.bos()), piece(tok.eos()), tok.vocab().add_bos, tok.vocab().add_eos);
  f.set_text_marker([&tok](std::string_view text) { return tok.mark_as_text(text); });
  if (!f.fallback_reason().empty())
    log_warn("{}: the chat template is rendered in the built-in {} style: {}", what, f.style_name(), f.fallback_reason());
  return f;
}

ChatFormatter model_chat_formatter(const gguf::Reader& file, const char* fallback_style, const Tokenizer& tok,
                                   const std::string& override_file) {
  if (override_file.empty()) return chat_formatter_for(model_chat_template(file, fallback_style), tok, file.path());
  std::ifstream in(override_file, std::ios::binary);
  EMBER_CHECK(in.good(), "cannot read the chat template file {}", override_file);
  // At most one byte past the bound (a device such as /dev/zero never ends).
  std::string source(jinja::kMaxTemplateBytes + 1, '\0');
  in.read(source.data(), static_cast<std::streamsize>(source.size()));
  EMBER_CHECK(!in.bad(), "cannot read the chat template file {}", override_file);
  source.resize(static_cast<size_t>(in.gcount()));
  EMBER_CHECK(source.size() <= jinja::kMaxTemplateBytes, "the chat template file {} is larger than {} bytes: a chat "
              "template is a few KB", override_file, jinja::kMaxTemplateBytes);
  return chat_formatter_for(std::move(source), tok, override_file);
}

}  // namespace ember
