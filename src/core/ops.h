// The op vocabulary of model programs (architecture.h): for each op, its name in a program, the keys it takes,
// the shape it makes, the parameters it owns and the source of each rule. What autograd saves for an op, and the
// gradients of its backward, are in program_step.cpp, one case per op, next to nothing else.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "architecture.h"

namespace memsim {

struct OpKey {
  const char* name;
  enum Kind { Tensor, Tensors, Dim, Probability, Flag, Choice } kind;
  bool required;
};

struct OpSpec {
  OpKind kind;
  const char* name;
  std::vector<OpKey> keys;  // besides "op" and "out"
  bool has_params;          // needs "name" (its module path)
  const char* source;       // where its shape and parameters come from
};

const std::vector<OpSpec>& op_specs();
const OpSpec* find_op(std::string_view name);
const char* op_name(OpKind kind);  // its name in a program
std::string op_names();  // "parameter, conv2d, ..." for error lines
std::string dims_text(const std::vector<int64_t>& shape);  // "[4, 64, 64]"

// The output shape of `op` over its inputs (per sample), or an error sentence.
bool op_shape(const ArchOp& op, const std::vector<const ArchTensor*>& in, const std::vector<int64_t>& param_shape,
              std::vector<int64_t>& out, std::string& error);
// The parameter tensors `op` owns, in the order its module registers them.
void op_params(const ArchOp& op, const std::vector<const ArchTensor*>& in, const std::vector<int64_t>& param_shape,
               std::vector<ParamTensor>& params);

}  // namespace memsim
