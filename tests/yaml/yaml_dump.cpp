// memsim_yaml_dump FILE: what the YAML subset reader (core/yaml_subset.h) makes of FILE, as one line of JSON, or
// "refused: <message>". Used by yaml_differential.py only.
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/yaml_subset.h"

int main(int argc, char** argv) {
  if (argc != 2) return std::cerr << "usage: memsim_yaml_dump FILE\n", 2;
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) return std::cerr << "cannot read " << argv[1] << "\n", 2;
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc;
  memsim::FieldError error;
  if (memsim::yaml_subset::parse(text.str(), "the document", doc, error)) std::cout << doc.dump() << "\n";
  else std::cout << "refused: " << error.message << "\n";
  return 0;
}
