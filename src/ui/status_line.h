// What the status line and the page's screen-reader line say (ui/status_line.cpp).
#pragma once
#include <string>

#include "core/format.h"
#include "core/result.h"

namespace memsim::ui {

// The fit verdict in one short sentence, for a screen reader: "Fits: 61.2 GiB of 72.0 GiB usable". Where the devices
// differ (pipeline stages), the one nearest to its limit, named: "Does not fit on stage 3 (x8): ...". A setup that
// does not simulate: "No verdict: " and its first problem.
std::string verdict_sentence(const Result& result, Unit unit);

// `text` on one line (line breaks become spaces), cut at `width` pixels of the current font with "..." when it is
// wider. True when it was cut.
bool fit_one_line(std::string& text, float width);

}  // namespace memsim::ui
