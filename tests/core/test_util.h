#pragma once
#include <fstream>
#include <sstream>
#include <string>

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
inline std::string source_path(const std::string& rel) { return std::string(MEMSIM_SOURCE_DIR) + "/" + rel; }
