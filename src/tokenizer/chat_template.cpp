#include "tokenizer/chat_template.hpp"

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "gguf/reader.hpp"

namespace ember {

namespace {

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

// Jinja string literals may spell a newline as backslash-n.
std::string unescape_literal(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Finds a system message written literally in a ChatML template, such as SmolLM2's
// '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n'
// inside "{% if loop.first and messages[0]['role'] != 'system' %}". A block that splices in a
// variable (quotes, +, {{ }}) is not a default and is skipped.
std::string find_default_system(const std::string& src) {
  for (const char* open : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    size_t pos = 0;
    while ((pos = src.find(open, pos)) != std::string::npos) {
      const size_t begin = pos + std::string_view(open).size();
      const size_t end = src.find("<|im_end|>", begin);
      if (end == std::string::npos) break;
      const std::string text = src.substr(begin, end - begin);
      const bool literal = !text.empty() && text.find_first_of("'\"+{}") == std::string::npos;
      if (literal) return unescape_literal(text);
      pos = begin;
    }
  }
  return {};
}

}  // namespace

namespace {
constexpr EnumName<ChatStyle> kChatStyles[] = {{ChatStyle::ChatML, "chatml"}, {ChatStyle::Llama3, "llama3"},
                                               {ChatStyle::Llama2, "llama2"}, {ChatStyle::Gemma, "gemma"},
                                               {ChatStyle::Phi3, "phi3"},     {ChatStyle::Mistral, "mistral"}};
}  // namespace

const char* chat_style_name(ChatStyle style) { return enum_name(kChatStyles, style); }

ChatTemplate parse_chat_template(const std::string& src) {
  ChatTemplate t;
  if (src.empty()) return t;
  if (const auto style = find_enum(kChatStyles, src); style && *style != ChatStyle::Mistral) {
    t.style = *style;  // (Mistral's styles are named by version below)
    return t;
  }
  for (const auto& [name, v] : {std::pair{"mistral-v1", MistralVersion::v1}, std::pair{"mistral-v3", MistralVersion::v3},
                                std::pair{"mistral-v3-tekken", MistralVersion::v3_tekken},
                                std::pair{"mistral-v7", MistralVersion::v7}})
    if (src == name) {
      t.style = ChatStyle::Mistral;
      t.mistral = v;
      return t;
    }
  // Same order of tests as llama.cpp's llm_chat_detect_template.
  if (contains(src, "<|im_start|>")) {
    t.style = ChatStyle::ChatML;
    t.default_system = find_default_system(src);
    return t;
  }
  if (contains(src, "[INST]") && contains(src, "[SYSTEM_PROMPT]")) {
    t.style = ChatStyle::Mistral;
    t.mistral = MistralVersion::v7;
    return t;
  }
  if (contains(src, "[INST]") && (contains(src, "' [INST] ' + system_message") || contains(src, "[AVAILABLE_TOOLS]"))) {
    t.style = ChatStyle::Mistral;  // the official v1 / v3 / v3-tekken templates
    t.mistral = contains(src, " [INST]")       ? MistralVersion::v1
                : contains(src, "\"[INST]\"") ? MistralVersion::v3_tekken
                                               : MistralVersion::v3;
    return t;
  }
  if (contains(src, "[INST]")) {
    t.style = ChatStyle::Llama2;
    t.llama2_strip = contains(src, "content.strip()");
    t.llama2_bos_in_history = contains(src, "bos_token + '[INST]");
    t.llama2_system = contains(src, "<<SYS>>") || t.llama2_strip || t.llama2_bos_in_history;
    return t;
  }
  if (contains(src, "<|assistant|>") && contains(src, "<|end|>")) {
    t.style = ChatStyle::Phi3;
    return t;
  }
  if (contains(src, "<start_of_turn>")) {
    t.style = ChatStyle::Gemma;
    return t;
  }
  if (contains(src, "<|start_header_id|>") && contains(src, "<|end_header_id|>")) {
    t.style = ChatStyle::Llama3;
    return t;
  }
  fail("chat template not recognized (supported styles: chatml '<|im_start|>', llama3 '<|start_header_id|>', "
       "llama2 '[INST]', mistral '[INST]' official v1/v3/v7, gemma '<start_of_turn>', phi3 '<|end|>'); template "
       "starts with: {}",
       src.substr(0, 120));
}

std::string render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  switch (t.style) {
    case ChatStyle::ChatML: {
      if (!t.default_system.empty() && (messages.empty() || messages[0].role != "system")) {
        // SmolLM2's template adds it inside the loop, so only when there is a first message.
        if (!messages.empty()) out += "<|im_start|>system\n" + t.default_system + "<|im_end|>\n";
      }
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    }
    case ChatStyle::Llama3: {
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case ChatStyle::Llama2: {
      bool inside_turn = true;  // the first [INST] follows BOS, which the tokenizer adds
      out += "[INST] ";
      for (const auto& m : messages) {
        const std::string content = t.llama2_strip ? trim(m.content) : m.content;
        if (!inside_turn) {
          inside_turn = true;
          out += t.llama2_bos_in_history ? "<s>[INST] " : "[INST] ";
        }
        if (m.role == "system") {
          if (t.llama2_system) out += "<<SYS>>\n" + content + "\n<</SYS>>\n\n";
          else out += content + "\n";
        } else if (m.role == "user") {
          out += content + " [/INST]";
        } else {
          out += content + "</s>";
          inside_turn = false;
        }
      }
      break;
    }
    case ChatStyle::Gemma: {
      std::string system;
      for (const auto& m : messages) {
        if (m.role == "system") {  // Gemma has no system turn: prepend it to the next user turn
          system = trim(m.content);
          continue;
        }
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<start_of_turn>" + role + "\n";
        if (!system.empty() && role != "model") {
          out += system + "\n\n";
          system.clear();
        }
        out += trim(m.content) + "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    }
    case ChatStyle::Mistral: {
      if (t.mistral == MistralVersion::v7) {  // [SYSTEM_PROMPT] s[/SYSTEM_PROMPT][INST] u[/INST] a</s>
        for (const auto& m : messages) {
          if (m.role == "system") out += "[SYSTEM_PROMPT] " + m.content + "[/SYSTEM_PROMPT]";
          else if (m.role == "user") out += "[INST] " + m.content + "[/INST]";
          else out += " " + m.content + "</s>";
        }
        break;
      }
      // v1: " [INST] s\n\nu [/INST] a</s>"; v3: "[INST] s\n\nu[/INST] a</s>" (assistant trimmed);
      // v3-tekken: "[INST]s\n\nu[/INST]a</s>". The system text opens the next [INST].
      const std::string lead = t.mistral == MistralVersion::v1 ? " " : "";
      const std::string trail = t.mistral == MistralVersion::v3_tekken ? "" : " ";
      bool inside_turn = false;
      for (const auto& m : messages) {
        if (!inside_turn) {
          out += lead + "[INST]" + trail;
          inside_turn = true;
        }
        if (m.role == "system") {
          out += m.content + "\n\n";
        } else if (m.role == "user") {
          out += m.content + lead + "[/INST]";
        } else {
          out += trail + (t.mistral == MistralVersion::v3 ? trim(m.content) : m.content) + "</s>";
          inside_turn = false;
        }
      }
      break;
    }
    case ChatStyle::Phi3: {
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
      if (add_generation_prompt) out += "<|assistant|>\n";
      break;
    }
  }
  return out;
}

std::string model_chat_template(const gguf::Reader& file, const char* fallback_style) {
  if (auto t = file.opt_string("tokenizer.chat_template"); t && !t->empty()) return *t;
  return fallback_style ? fallback_style : "";
}

std::string apply_chat_template(const std::string& template_source, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  return render_chat(parse_chat_template(template_source), messages, add_generation_prompt);
}

}  // namespace ember
