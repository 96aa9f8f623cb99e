// For the desktop's --bench-timeline: a synthetic step of any size, and a frame that shows only its timeline.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/result.h"

namespace memsim::ui {

// A step of `events` allocations and frees whose live bytes random-walk; the same for the same size.
Result synthetic_step(size_t events);

// One frame: the timeline panel of `r` filling the display. `version` names r's content (App::result_version(), or
// 0); every_event: one column per event (see panels.h).
void draw_timeline_bench(const Result& r, uint64_t version, bool every_event);

}  // namespace memsim::ui
