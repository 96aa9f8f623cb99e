// The frozen data of links, embedded at build time from tests/golden/ (CMakeLists.txt writes link_data.cpp):
//   vN.defaults.json  what a field that a schema-N link leaves out means (a config JSON of schema N)
//   vN.presets.json   what a schema-N link's model=ID means: each catalogue id's model fields that differ from
//                     vN.defaults.json
// Like the golden links beside them they never change once shipped, so that a link keeps its meaning when the
// code's defaults or the catalogue change later (serialize.cpp reads them; README "Links").
#pragma once
#include <string_view>
#include <vector>

namespace memsim {

struct LinkDataFile {
  int schema;             // N of vN.*.json
  std::string_view kind;  // "defaults" or "presets"
  std::string_view text;  // the file's JSON
};

const std::vector<LinkDataFile>& link_data_files();

}  // namespace memsim
