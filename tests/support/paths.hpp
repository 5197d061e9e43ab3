// Where tests find the real models and their data.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace ember::test_support {

inline std::string source_dir() {
  if (const char* s = std::getenv("EMBER_SOURCE_DIR")) return s;
#ifdef EMBER_SOURCE_DIR
  return EMBER_SOURCE_DIR;
#else
  return ".";
#endif
}

inline std::string data_path(const std::string& name) { return source_dir() + "/tests/data/" + name; }

// A model file under EMBER_MODEL_DIR (default: <source>/models); empty when absent.
inline std::string model_path(const std::string& file) {
  std::string dir = std::getenv("EMBER_MODEL_DIR") ? std::getenv("EMBER_MODEL_DIR") : source_dir() + "/models";
  std::string p = dir + "/" + file;
  return std::filesystem::exists(p) ? p : std::string();
}

inline const char* kSmolLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline const char* kGemma3 = "gemma-3-270m-q4_k_m.gguf";

}  // namespace ember::test_support
