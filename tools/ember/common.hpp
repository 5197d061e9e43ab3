// Flags shared by the subcommands that run a model, and helpers they share.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.hpp"
#include "engine/session.hpp"
#include "model/model.hpp"
#include "model/repack.hpp"
#include "sparse/predictor_train.hpp"
#include "sparse/profile.hpp"

namespace ember::cli {

struct EngineFlags {
  std::string model_path;
  int threads = 0;
  int64_t ctx = 4096;
  int64_t batch = 512;
  std::string kv_type = "f16";  // KV cache values: f16 (llama.cpp's default) or f32
  bool verbose = false;
  // auto: input for a model with input thresholds (`ember sparsify`), predictor for one with
  // activation predictors (a ReLU model through `ember sparsify`, or --predictor), else dense
  std::string sparse_mode = "auto";
  float sparse_threshold = 0.0f;
  std::string sparse_profile;  // threshold mode: calibrate per-layer thresholds from this profile
  float sparsity = 0.5f;       // ... at this target sparsity
  std::string vram_budget;  // hybrid GPU-CPU FFN (engine/hybrid_executor.hpp): a size, or auto
  std::string vram_reserve;  // the device runtime's own share of the budget (empty: the device's figure)
  std::string plan_path;
  std::string plan_method = "ilp";  // how a plan computed at load places (sparse/plan.hpp)
  std::string hybrid_device = "auto";
  std::string predictor_path;  // --predictor: attached to the model at load
  std::string sparse_down = "auto";  // type of the neuron-major copies (cpu::NeuronMajorType; auto: default_copy_type)
  bool no_repack = false;  // keep every matrix in the file's layout (model/repack.hpp)
  bool mmap = false;  // keep the matrices that are not repacked in the file's map (ResidentWeights::in_file)
  std::string mem_budget = "auto";  // the memory tier (model/expert_cache.hpp): auto, off, or a size
  std::string read_ahead = "auto";  // the memory tier's read-ahead of experts: auto, always, off

  void add_to(CLI::App* app, bool model_required = true);
  std::string input_allocation = "greedy";  // input mode: how --sparsity is spread (sparse/input_allocation.hpp)
  std::string input_copies = "auto";  // input mode: auto (a copy where it reads faster) or all (every site, every token)
  // --sparse-mode with auto resolved for this model.
  std::string resolved_sparse_mode(const Model& model) const;
  // The session's settings; the model is what input sparsity's thresholds are allocated over.
  SessionParams session_params(const Model& model) const;
};

// The sampling flags of `generate` and `chat`. Those not given take the model's recommended
// values where its family is known (recommended_sampling), else llama.cpp's defaults.
struct SamplingFlags {
  SamplerParams sampling;
  int64_t seed = -1;  // -1: random
  void add_to(CLI::App* app);
  // The parameters for this model, the seed resolved; logs where recommended values were used.
  SamplerParams resolve(const Model& model) const;

 private:
  CLI::Option *temp_ = nullptr, *top_k_ = nullptr, *top_p_ = nullptr, *min_p_ = nullptr;
};

// Loads the model named by the flags, logging what it is and how long it took, and repacks its
// matrices for the dense kernels: the FFN too when it runs dense (no sparse mode, no hybrid) and
// `max_scope` allows (tools that read FFN rows one by one pass attention_output). Unless --mmap,
// the other per-token matrices are copied into the same huge-page buffer (model/repack.hpp).
// The memory tier (model/expert_cache.hpp) for a mixture whose experts do not fit --mem-budget:
// attaches the expert cache before anything is repacked (the cache repacks its experts itself
// where `repack`); refuses the sparse modes. Nothing for a dense model or one that fits.
// Where a dense model does not fit: the budget, and the bytes its session will take besides the
// weights (KV cache and working buffers); zeros where no budget binds a dense model.
struct DenseMemoryTier {
  size_t budget = 0, session_bytes = 0;
};
DenseMemoryTier attach_memory_tier(const EngineFlags& flags, Model& model, FfnMode mode, bool repack);
std::unique_ptr<Model> load_model_logged(const EngineFlags& flags, double* load_seconds,
                                         RepackScope max_scope = RepackScope::all);

// Logs the FFN sparsity the session measured (oracle mode; nothing in dense mode): the total
// at info level, per layer at debug level (-v).
void log_ffn_sparsity(Session& session);

// The tokens of a text file (BOS first where the model adds one); the error names
// scripts/get_corpus.sh for the project's corpus.
std::vector<int32_t> read_corpus_tokens(const Model& model, const std::string& path);

// Runs `ember profile`'s measurement over the tokens through the (dense) session, with progress
// in the log; opts.n_ctx is capped at the session's context.
Profile profile_corpus(Session& session, const std::vector<int32_t>& tokens, ProfileOptions& opts,
                       FfnSampleRecorder* samples = nullptr);

// The table of trained predictors (rank, held-out recall and precision, sparsity, bytes) on
// stdout; returns their bytes.
size_t print_predictor_table(const std::vector<LayerPredictor>& layers);

// Peak resident memory of this process, in bytes.
size_t peak_rss_bytes();

}  // namespace ember::cli
