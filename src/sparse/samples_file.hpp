// Predictor training samples on disk (`ember profile --samples`, read by `ember train-predictor
// --from-samples`): per layer, the FFN inputs of the kept tokens and the neurons that fired for
// each, with their activation mass (sparse/predictor_train.hpp, LayerSamples). Format in
// docs/sparse_formats.md ("Training samples").
#pragma once
#include <string>
#include <vector>

#include "model/model.hpp"
#include "sparse/predictor_train.hpp"

namespace ember {

void write_samples_file(const std::string& path, const std::string& model_name, const std::vector<LayerSamples>& layers);

// Reads and validates a samples file; its shapes must be the model's (n_layer, n_embd, n_ff).
std::vector<LayerSamples> read_samples_file(const std::string& path, const Hparams& hp);

}  // namespace ember
