#include "bench.h"

#include <imgui.h>

#include <algorithm>
#include <string>
#include <vector>

#include "panels.h"

namespace memsim::ui {

Result synthetic_step(size_t events) {
  Result r;
  r.ok = true;
  DeviceResult d;
  d.role = "synthetic";
  StepProgram& p = d.program;
  const uint32_t label = p.label("synthetic block");
  std::vector<uint32_t> live;
  uint64_t rng = 0x9E3779B97F4A7C15ull;  // xorshift64: no <random>, so every platform draws the same step
  auto next = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int64_t allocated = 0, reserved = 0;
  const size_t per_phase = std::max<size_t>(1, events / 8);
  for (size_t i = 0; i < events; ++i) {
    if (i % per_phase == 0) p.phase("phase " + std::to_string(i / per_phase + 1));
    if (!live.empty() && next() % 100 < 48) {  // a little more allocating than freeing: the curve climbs
      const size_t k = next() % live.size();
      const uint32_t t = live[k];
      live[k] = live.back();
      live.pop_back();
      allocated -= p.tensors[t].bytes;
      p.free(t);
    } else {
      const int64_t bytes = static_cast<int64_t>(1 + next() % 64) << 20;
      live.push_back(p.alloc(static_cast<Component>(next() % kComponentCount), bytes, label));
      allocated += bytes;
    }
    reserved = std::max(reserved, (allocated + (int64_t{2} << 20) - 1) / (int64_t{2} << 20) * (int64_t{2} << 20));
    d.timeline.push_back({allocated, reserved});
    if (allocated > d.peak.allocated_bytes) d.peak.allocated_bytes = allocated, d.peak_event = static_cast<uint32_t>(i);
  }
  d.peak.reserved_bytes = d.peak.device_bytes = reserved;
  d.capacity_bytes = reserved + reserved / 8;
  d.usable_bytes = reserved;
  d.fits = true;
  r.devices.push_back(std::move(d));
  return r;
}

void draw_timeline_bench(const Result& r, uint64_t version, bool every_event) {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->WorkPos);
  ImGui::SetNextWindowSize(vp->WorkSize);
  // Without a background, as the app's own window: the platform clears the frame in its colour.
  ImGui::Begin("timeline bench", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoSavedSettings | ImGuiWindowFlags_NoBackground);
  draw_timeline_panel(r, Unit::GiB, version, every_event);
  ImGui::End();
}

}  // namespace memsim::ui
