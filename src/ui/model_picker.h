// The model picker: the catalogue's presets in a combo with a search box (by name or Hugging Face id).
#pragma once
#include "core/config.h"

namespace memsim::ui {

// Draws the picker; picking a preset replaces `m` with it. Returns true when `m` changed.
bool model_picker(ModelConfig& m);

}  // namespace memsim::ui
