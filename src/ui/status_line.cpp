// The status line at the bottom of the window: the last message on one line of fixed height, so that a message never
// moves the controls under the pointer, and a Log button whose popover lists every message with its details (what an
// import read, assumed and ignored). And the verdict in words for screen readers.
#include "status_line.h"

#include <imgui.h>

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "app.h"
#include "keyboard.h"

namespace memsim::ui {

std::string verdict_sentence(const Result& r, Unit unit) {
  if (!r.ok) return "No verdict: " + (r.errors.empty() ? std::string("the setup does not simulate.") : r.errors[0].message);
  if (r.devices.empty()) return "";
  // The device nearest to its limit: the worst verdict, then the largest share of its usable memory.
  auto share = [](const DeviceResult& d) {
    return static_cast<double>(d.peak.device_bytes) / static_cast<double>(std::max<int64_t>(1, d.usable_bytes));
  };
  const DeviceResult* worst = &r.devices[0];
  for (const auto& d : r.devices)
    if (d.verdict > worst->verdict || (d.verdict == worst->verdict && !d.fixed_share && share(d) > share(*worst))) worst = &d;
  std::string words = verdict_words(worst->verdict);  // "DOES NOT FIT" -> "Does not fit"
  for (size_t i = 1; i < words.size(); ++i) words[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(words[i])));
  if (r.devices.size() > 1) words += " on " + worst->role + " (x" + std::to_string(worst->device_count) + ")";
  return words + ": " + format_bytes(worst->peak.device_bytes, unit, 1) + " of " + format_bytes(worst->usable_bytes, unit, 1) +
         " usable" + (worst->refusal.empty() ? "" : "; " + worst->refusal);
}

bool fit_one_line(std::string& text, float width) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  if (ImGui::CalcTextSize(text.c_str()).x <= width) return false;
  const float room = std::max(0.0f, width - ImGui::CalcTextSize("...").x);
  const char* end = text.c_str();
  ImGui::GetFont()->CalcTextSizeA(ImGui::GetFontSize(), room, 0.0f, text.c_str(), text.c_str() + text.size(), &end);
  text.resize(static_cast<size_t>(end - text.c_str()));
  text += "...";
  return true;
}

std::string Message::full() const {
  std::string s = text;
  for (const auto& d : details) s += " " + d + ".";
  return s;
}

void App::message(Message::Kind kind, std::string text, std::vector<std::string> details) {
  constexpr size_t kLogLength = 50;  // the log keeps the last 50 messages
  messages_.push_back({kind, std::move(text), std::move(details)});
  if (messages_.size() > kLogLength) {
    messages_.erase(messages_.begin());
    messages_seen_ = messages_seen_ > 0 ? messages_seen_ - 1 : 0;
  }
}

namespace {

ImVec4 message_color(Message::Kind kind) {
  return kind == Message::Kind::Error ? ImVec4(1.0f, 0.45f, 0.45f, 1) : ImVec4(0.55f, 0.8f, 1.0f, 1);
}

}  // namespace

void App::draw_status_line() {
  const ImGuiStyle& st = ImGui::GetStyle();
  const float top = ImGui::GetCursorScreenPos().y;
  const size_t n = messages_.size();
  // The log: every message, the newest first, above the status line.
  const std::string log_label = "Log (" + std::to_string(n) + ")###log";
  ImGui::BeginDisabled(n == 0);
  {
    const TabSkip skip(n == 0, ImGui::GetID(log_label.c_str()));  // greyed out: Tab passes it (ui/keyboard.h)
    if (ImGui::Button(log_label.c_str())) ImGui::OpenPopup("message log");
  }
  ImGui::EndDisabled();
  announce_focus(n == 0 ? std::string("Message log, button, unavailable: no messages yet")
                        : "Message log, button: shows the " + std::to_string(n) + " messages so far, the newest first");
  ImGui::SameLine();
  if (messages_seen_ < n) {
    const Message& m = messages_.back();
    std::string line = m.text;
    if (!m.details.empty())  // an import's report: its notes fold away into the log
      line += " (" + std::to_string(m.details.size()) + (m.details.size() == 1 ? " note" : " notes") + " in the log)";
    const float dismiss_w = ImGui::CalcTextSize("x").x + st.FramePadding.x * 2;
    const float room = ImGui::GetContentRegionAvail().x - dismiss_w - st.ItemSpacing.x;
    fit_one_line(line, room);
    ImGui::AlignTextToFramePadding();
    ImGui::TextColored(message_color(m.kind), "%s", line.c_str());
    if (ImGui::IsItemHovered()) {
      ImGui::BeginTooltip();
      ImGui::PushTextWrapPos(ImGui::GetFontSize() * 40.0f);
      ImGui::TextUnformatted(m.full().c_str());
      ImGui::PopTextWrapPos();
      ImGui::EndTooltip();
    }
    ImGui::SameLine(ImGui::GetWindowContentRegionMax().x - dismiss_w);
    if (ImGui::Button("x")) messages_seen_ = n;
    announce_focus("Dismiss the message, button: " + m.full());
  } else {
    ImGui::AlignTextToFramePadding();
    std::string hint = "Ctrl+Z undoes a change and Ctrl+Shift+Z redoes it; the browser's Back returns to the setup before.";
    fit_one_line(hint, ImGui::GetContentRegionAvail().x);
    ImGui::TextDisabled("%s", hint.c_str());
  }
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  const float width = std::min(vp->WorkSize.x - 20.0f, 760.0f);
  ImGui::SetNextWindowPos(ImVec2(ImGui::GetWindowPos().x + st.WindowPadding.x, top - st.ItemSpacing.y), ImGuiCond_Always,
                          ImVec2(0, 1));
  ImGui::SetNextWindowSizeConstraints(ImVec2(width, 0), ImVec2(width, vp->WorkSize.y * 0.6f));
  if (ImGui::BeginPopup("message log")) {
    ImGui::PushTextWrapPos(0.0f);
    for (size_t i = n; i-- > 0;) {
      const Message& m = messages_[i];
      ImGui::TextColored(message_color(m.kind), "%s", m.text.c_str());
      for (const auto& d : m.details) {
        ImGui::Bullet();  // stays on the line, and the note wraps beside it
        ImGui::TextUnformatted(d.c_str());
      }
      if (i > 0) ImGui::Separator();
    }
    ImGui::PopTextWrapPos();
    ImGui::EndPopup();
  }
}

}  // namespace memsim::ui
