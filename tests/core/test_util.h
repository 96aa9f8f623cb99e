#pragma once
#include <fstream>
#include <sstream>
#include <string>

#include "core/step.h"

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
inline std::string source_path(const std::string& rel) { return std::string(MEMSIM_SOURCE_DIR) + "/" + rel; }

// Bytes requested by the live tensors of one component just before the first phase whose name starts with
// `prefix` (e.g. what a forward leaves saved for backward).
inline int64_t live_bytes_before_phase(const memsim::StepProgram& p, const std::string& prefix, memsim::Component c) {
  uint32_t end = 0;
  for (const auto& ph : p.phases)
    if (ph.name.rfind(prefix, 0) == 0) {
      end = ph.first_event;
      break;
    }
  int64_t live = 0;
  for (uint32_t i = 0; i < end; ++i)
    if (p.events[i].component == c)
      live += (p.events[i].op == memsim::Event::Op::Alloc ? 1 : -1) * p.tensors[p.events[i].tensor].bytes;
  return live;
}
