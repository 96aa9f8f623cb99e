// One function per panel; each lives in its own file.
#pragma once
#include "core/config.h"
#include "core/format.h"
#include "core/result.h"

namespace memsim::ui {

// Inputs grouped as model, training, parallelism, hardware. Returns true when the config changed.
bool draw_inputs_panel(Config& config, const Result& result);
// Fit verdict per device, stacked bar by component and the exact table.
void draw_results_panel(const Config& config, const Result& result, Unit unit);
// Allocated and reserved memory over the events of the step, phases and peak marked; hover shows the event.
void draw_timeline_panel(const Result& result, Unit unit);

// Shared widgets.
void help_marker(const char* text);
std::string bytes_text(int64_t bytes, Unit unit);

}  // namespace memsim::ui
