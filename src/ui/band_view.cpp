#include "band_view.h"

#include <algorithm>
#include <cstdio>

#include "panels.h"

namespace memsim::ui {

namespace {

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * fraction);
  return buf;
}

// Where the device band comes from: its range of errors and the nearest cases, each with its error.
void band_sources(const DeviceResult& d, Unit unit) {
  const StatisticBand& b = d.band.of(BandStatistic::Device);
  ImGui::Text("nvidia-smi peak %s; a measurement is expected from %s to %s.", bytes_text(d.peak.device_bytes, unit).c_str(),
              bytes_text(b.low_bytes, unit).c_str(), bytes_text(b.high_bytes, unit).c_str());
  ImGui::Text("Keep %.1f%% of the GPU free above the peak (the band's top), rather than the rule of thumb's 10-15%%.",
              100 * keep_free_fraction(d));
  ImGui::TextDisabled("measured = predicted / (1 + error); errors from %s to %s (at least the %.1f%% two machines",
                      percent(b.error_low).c_str(), percent(b.error_high).c_str(), 100 * (kNoiseFloorRatio - 1));
  ImGui::TextDisabled("gave one command), over the %zu published cases nearest to this setup:", b.neighbours.size());
  for (const auto& n : b.neighbours)
    ImGui::BulletText("%s: %s %s%s", n.id.c_str(), band_statistic_id(n.statistic), percent(n.relative_error).c_str(),
                      n.excluded ? " (a finding the model cannot explain)" : "");
  if (d.run.shuffles > 1)
    ImGui::TextDisabled("The band includes the run replayed in %lld orders of the data: %s to %s reserved%s.",
                        static_cast<long long>(d.run.shuffles), bytes_text(d.run.shuffle_reserved_low_bytes, unit).c_str(),
                        bytes_text(d.run.shuffle_reserved_high_bytes, unit).c_str(),
                        d.band.data_run_oom ? "; one order runs out of memory (see the note below)" : "");
  else if (d.band.data_run_reserved_bytes > 0)
    ImGui::TextDisabled("The top includes a short run of varying lengths: %s reserved%s (see the note below).",
                        bytes_text(d.band.data_run_reserved_bytes, unit).c_str(), d.band.data_run_oom ? ", out of memory" : "");
}

}  // namespace

ImVec4 verdict_color(Verdict v) {
  switch (v) {
    case Verdict::Fits: return ImVec4(0.35f, 0.85f, 0.45f, 1);
    case Verdict::Borderline: return ImVec4(0.95f, 0.8f, 0.3f, 1);
    default: return ImVec4(1.0f, 0.35f, 0.35f, 1);
  }
}

void band_line(const DeviceResult& d, Unit unit) {
  if (!d.band.valid) return;
  if (d.fixed_share) {  // core/result.h: the engine claims this share by design, so no published cases set a band
    ImGui::SameLine();
    ImGui::TextDisabled("| vLLM's claimed share");
    return;
  }
  const StatisticBand& b = d.band.of(BandStatistic::Device);
  // On the line of the headroom it replaces, so that the panel keeps its height, where the rest of that line holds
  // it; else on a line of its own (a phone-sized panel, where the wrapped headroom line leaves a sliver).
  char text[160];
  std::snprintf(text, sizeof text, "| band %s - %s: keep %.1f%% free", bytes_text(b.low_bytes, unit).c_str(),
                bytes_text(b.high_bytes, unit).c_str(), 100 * keep_free_fraction(d));
  ImGui::SameLine();
  if (ImGui::GetContentRegionAvail().x < ImGui::CalcTextSize(text).x) ImGui::NewLine();
  ImGui::TextDisabled("%s", text);
  if (ImGui::IsItemHovered()) {
    ImGui::BeginTooltip();
    band_sources(d, unit);
    ImGui::EndTooltip();
  }
}

std::string band_whisker(ImDrawList* dl, const DeviceResult& d, ImVec2 p0, float width, float height, double scale_to,
                         Unit unit, bool hovered, float mouse_x) {
  if (!d.band.valid || d.fixed_share || scale_to <= 0) return {};
  const StatisticBand& b = d.band.of(BandStatistic::Device);
  const float lo = static_cast<float>(std::min(1.0, static_cast<double>(b.low_bytes) / scale_to));
  const float hi = static_cast<float>(std::min(1.0, static_cast<double>(b.high_bytes) / scale_to));
  const float x0 = p0.x + lo * width, x1 = p0.x + hi * width;
  const float mid = p0.y + height * 0.5f;
  // A light veil over the range, then the whisker and its caps in the text colour so that it reads on any segment.
  dl->AddRectFilled(ImVec2(x0, p0.y + height * 0.2f), ImVec2(x1, p0.y + height * 0.8f), IM_COL32(255, 255, 255, 60));
  const ImU32 ink = ImGui::GetColorU32(ImGuiCol_Text);
  dl->AddLine(ImVec2(x0, mid), ImVec2(x1, mid), ink, 1.5f);
  dl->AddLine(ImVec2(x0, p0.y + height * 0.2f), ImVec2(x0, p0.y + height * 0.8f), ink, 1.5f);
  dl->AddLine(ImVec2(x1, p0.y + height * 0.2f), ImVec2(x1, p0.y + height * 0.8f), ink, 1.5f);
  if (hovered && mouse_x >= lo && mouse_x <= hi) {
    ImGui::BeginTooltip();  // joins the segment's tooltip of this frame
    ImGui::Separator();
    band_sources(d, unit);
    ImGui::EndTooltip();
  }
  return "Band of the device peak: " + bytes_text(b.low_bytes, unit) + " to " + bytes_text(b.high_bytes, unit) +
         ", verdict " + verdict_words(d.verdict) + ".";
}

}  // namespace memsim::ui
