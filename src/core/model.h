// Parameter tensors of a dense decoder-only transformer, as the framework allocates them. The exact
// parameter count is their sum; the step simulator allocates them one by one (allocator rounding is per
// tensor).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace memsim {

enum class ParamKind {
  Matmul,     // weight of a linear layer: cast by autocast, saved for backward, quantizable
  Embedding,  // token or position embedding table
  Norm,       // norm scale or shift
  Bias,
};

struct ParamTensor {
  std::string name;
  int64_t numel = 0;
  ParamKind kind = ParamKind::Matmul;
  int64_t rows = 0;  // first dimension (out_features of a linear, vocab of an embedding); numel for vectors
};

struct ModelShape {
  std::vector<ParamTensor> pre;    // embeddings, before the first layer
  std::vector<ParamTensor> layer;  // one transformer layer; every layer is identical in a dense model
  int64_t num_layers = 0;
  std::vector<ParamTensor> post;   // final norm and untied output head
  int64_t params_per_layer = 0;
  int64_t params_total = 0;
};

// Requires a validated config (validate.h); throws RangeError if a count leaves int64.
ModelShape build_model_shape(const ModelConfig& m);

int64_t sum_numel(const std::vector<ParamTensor>& tensors);

}  // namespace memsim
