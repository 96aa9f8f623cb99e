// The uncertainty band (core/band.h) in the results panel: a line under the verdict, a whisker on the device bar,
// and a tooltip that names the published cases the band comes from. Kept apart from panel_results.cpp, which calls
// these three functions.
#pragma once
#include <imgui.h>

#include <string>

#include "core/format.h"
#include "core/result.h"

namespace memsim::ui {

// The verdict's colour: green fits, amber borderline, red otherwise.
ImVec4 verdict_color(Verdict v);
// After the verdict's headroom line: the device band, and the headroom it asks for in place of the rule of thumb's
// 10-15%. Hovering it shows where the band comes from.
void band_line(const DeviceResult& d, Unit unit);
// The band of the device peak over the stacked bar, whose x runs from 0 to scale_to bytes: a shaded range with a
// whisker. Returns the words that describe it (for the keyboard focus), and adds them to an open tooltip when
// `hovered` and the mouse, at bar fraction mouse_x, is over the range.
std::string band_whisker(ImDrawList* dl, const DeviceResult& d, ImVec2 p0, float width, float height, double scale_to,
                         Unit unit, bool hovered, float mouse_x);

}  // namespace memsim::ui
