// Undo and history (ui/history.h), the status line, the clipboard of the text fields and the words for screen readers:
// the History class alone, then the app headless, driven by keys as a backend sends them.
#include <catch2/catch.hpp>
#include <imgui.h>

#include <regex>
#include <string>
#include <vector>

#include "core/serialize.h"
#include "headless.h"
#include "ui/app.h"
#include "ui/clipboard.h"
#include "ui/history.h"
#include "ui/status_line.h"

using namespace memsim;
using ui::History;

namespace {

Config with_micro_batch(int64_t n) {
  Config c;
  c.training.micro_batch_size = n;
  return c;
}

}  // namespace

TEST_CASE("history: undo and redo walk the setups back and forth, a new change clears redo", "[ui][history]") {
  History h(with_micro_batch(1));
  CHECK(!h.can_undo());
  CHECK(!h.can_redo());
  CHECK(h.record(with_micro_batch(1)) == History::Recorded::Nothing);  // the present setup: no entry
  CHECK(h.record(with_micro_batch(2)) == History::Recorded::NewEntry);
  CHECK(h.record(with_micro_batch(3)) == History::Recorded::NewEntry);
  CHECK(h.undo_depth() == 2);
  CHECK(h.undo() == with_micro_batch(2));
  CHECK(h.undo() == with_micro_batch(1));
  CHECK(!h.can_undo());
  CHECK(h.redo_depth() == 2);
  CHECK(h.redo() == with_micro_batch(2));
  CHECK(h.present() == with_micro_batch(2));
  CHECK(h.record(with_micro_batch(9)) == History::Recorded::NewEntry);
  CHECK(!h.can_redo());  // the undone 3 is gone
  CHECK(h.undo() == with_micro_batch(2));
  CHECK(h.redo() == with_micro_batch(9));
}

TEST_CASE("history: bounded, the oldest entries go", "[ui][history]") {
  History h(with_micro_batch(0), 100);
  for (int64_t i = 1; i <= 150; ++i) h.record(with_micro_batch(i));
  CHECK(h.undo_depth() == 100);
  while (h.can_undo()) h.undo();
  CHECK(h.present() == with_micro_batch(50));  // 150 changes, the last 100 undone
  CHECK(h.redo_depth() == 100);
  CHECK(History(Config{}).capacity() == History::kDefaultCapacity);
}

TEST_CASE("history: a continuous edit of one control is one entry", "[ui][history]") {
  History h(with_micro_batch(4));
  // Typing 1, 2, 8 into the field (control 7): three changes, one entry.
  CHECK(h.record(with_micro_batch(1), 7) == History::Recorded::NewEntry);
  CHECK(h.record(with_micro_batch(12), 7) == History::Recorded::Merged);
  CHECK(h.record(with_micro_batch(128), 7) == History::Recorded::Merged);
  CHECK(h.undo_depth() == 1);
  // Another control, or a change of its own, starts an entry of its own.
  CHECK(h.record(with_micro_batch(64), 8) == History::Recorded::NewEntry);
  CHECK(h.record(with_micro_batch(32)) == History::Recorded::NewEntry);
  CHECK(h.record(with_micro_batch(16)) == History::Recorded::NewEntry);  // 0 never merges
  // The same control again once its edit ended: a new entry.
  CHECK(h.record(with_micro_batch(17), 7) == History::Recorded::NewEntry);
  h.end_group();
  CHECK(h.group() == 0);
  CHECK(h.record(with_micro_batch(18), 7) == History::Recorded::NewEntry);
  CHECK(h.undo_depth() == 6);
  CHECK(h.undo() == with_micro_batch(17));
  CHECK(h.undo() == with_micro_batch(16));
  CHECK(h.undo() == with_micro_batch(32));
  CHECK(h.undo() == with_micro_batch(64));
  CHECK(h.undo() == with_micro_batch(128));
  CHECK(h.undo() == with_micro_batch(4));
}

TEST_CASE("history: an edit that comes back to where it began leaves no entry", "[ui][history]") {
  History h(with_micro_batch(4));
  CHECK(h.record(with_micro_batch(2), 7) == History::Recorded::NewEntry);
  CHECK(h.record(with_micro_batch(4), 7) == History::Recorded::Merged);  // Escape: the field's text is back
  CHECK(!h.can_undo());
  CHECK(h.present() == with_micro_batch(4));
  CHECK(h.record(with_micro_batch(6), 7) == History::Recorded::NewEntry);  // typing on: an entry again
  CHECK(h.undo() == with_micro_batch(4));
}

namespace {

// The app headless, keys pressed as a backend sends them (one frame down, the next up), with what it published.
struct Page {
  HeadlessImGui gui{1280, 720};
  std::vector<std::string> pushed, replaced, copied;
  ui::App app;

  explicit Page(bool copy_reports_later = false) : app(hooks(copy_reports_later)) {
    ImGuiIO& io = ImGui::GetIO();
    io.ConfigFlags |= ImGuiConfigFlags_NavEnableKeyboard;
    for (int k = 0; k < ImGuiKey_COUNT; ++k) io.KeyMap[k] = k;  // key indices as a backend maps them
    frames(2);
  }
  ui::PlatformHooks hooks(bool copy_reports_later) {
    ui::PlatformHooks h;
    h.publish_fragment = [this](const std::string& f) { replaced.push_back(f); };
    h.push_fragment = [this](const std::string& f) { pushed.push_back(f); };
    h.copy_text = [this](const std::string& s) { copied.push_back(s); };
    h.copy_reports_later = copy_reports_later;
    return h;
  }
  void frames(int n) {
    for (int i = 0; i < n; ++i) gui.frame(app);
  }
  void press(int key, bool shift = false, bool ctrl = false) {
    ImGuiIO& io = ImGui::GetIO();
    io.KeyShift = shift;
    io.KeyCtrl = ctrl;
    io.KeysDown[key] = true;
    gui.frame(app);
    io.KeysDown[key] = false;
    io.KeyShift = io.KeyCtrl = false;
    gui.frame(app);
  }
  void type(const char* text) {
    ImGui::GetIO().AddInputCharactersUTF8(text);
    frames(2);
  }
  const std::string& focus() const { return app.focus_announcement(); }
  bool tab_to(const std::string& prefix, int limit = 400) {
    for (int i = 0; i < limit; ++i) {
      press(ImGuiKey_Tab);
      if (focus().rfind(prefix, 0) == 0) return true;
    }
    return false;
  }
  int64_t micro_batch() const { return app.config().training.micro_batch_size; }
  bool said(const std::string& words) const {
    for (const auto& m : app.messages())
      if (m.text.find(words) != std::string::npos) return true;
    return false;
  }
};

}  // namespace

TEST_CASE("app: a number typed digit by digit is one undo entry and one browser history entry, Ctrl+Z and Ctrl+Shift+Z",
          "[ui][history]") {
  Page p;
  const std::string opened = config_to_fragment(Config{});
  CHECK(p.pushed.empty());  // the setup it opens on replaces the address, it is no new entry
  REQUIRE(p.tab_to("micro_batch_size: 4"));
  p.type("1");
  p.type("2");
  p.type("8");
  p.press(ImGuiKey_Enter);
  REQUIRE(p.micro_batch() == 128);
  CHECK(p.app.history().undo_depth() == 1);
  REQUIRE(p.pushed.size() == 1);  // the first digit's setup, a new entry; the others replaced it
  CHECK(p.pushed[0].find("&micro_batch_size=1&") != std::string::npos);
  CHECK(p.replaced.back().find("&micro_batch_size=128&") != std::string::npos);
  p.press(ImGuiKey_Z, false, true);  // Ctrl+Z
  CHECK(p.micro_batch() == 4);
  CHECK(p.pushed.back() == opened);  // undone: a new entry, so Back returns to the setup before it
  p.press(ImGuiKey_Z, true, true);  // Ctrl+Shift+Z
  CHECK(p.micro_batch() == 128);
  p.press(ImGuiKey_Z, false, true);
  CHECK(p.micro_batch() == 4);
  p.press(ImGuiKey_Y, false, true);  // Ctrl+Y
  CHECK(p.micro_batch() == 128);
  p.press(ImGuiKey_Z);  // Z alone is no undo
  CHECK(p.micro_batch() == 128);
  CHECK(p.said("Undone"));
}

TEST_CASE("app: Ctrl+Z in a field being typed into undoes the typing, not the setup before", "[ui][history]") {
  Page p;
  Config c = with_micro_batch(2);
  p.app.set_config(c);
  p.frames(2);
  REQUIRE(p.app.history().undo_depth() == 1);
  REQUIRE(p.tab_to("hidden_size: 5120"));
  p.type("4096");
  CHECK(p.app.config().model.hidden_size == 4096);
  CHECK(p.app.history().undo_depth() == 2);
  p.press(ImGuiKey_Z, false, true);  // the field's own undo: its last typed character goes
  CHECK(p.app.config().model.hidden_size == 409);
  CHECK(p.micro_batch() == 2);  // the setup before is kept
  CHECK(!p.said("Undone"));
  CHECK(p.app.history().undo_depth() == 2);
  p.press(ImGuiKey_Escape);  // the field's text as it was: the edit came back to its start and leaves no entry
  CHECK(p.app.config().model.hidden_size == 5120);
  CHECK(p.app.history().undo_depth() == 1);
  p.press(ImGuiKey_Z, false, true);  // no longer editing: the app's undo
  CHECK(p.micro_batch() == 4);
}

TEST_CASE("app: separate presses of a + button are separate entries, a held one is one", "[ui][history]") {
  Page p;
  REQUIRE(p.tab_to("micro_batch_size: 4"));
  p.press(ImGuiKey_Tab);
  p.press(ImGuiKey_Tab);  // the + button
  p.press(ImGuiKey_Space);
  p.press(ImGuiKey_Space);
  CHECK(p.micro_batch() == 6);
  CHECK(p.app.history().undo_depth() == 2);
  ImGui::GetIO().KeysDown[ImGuiKey_Space] = true;  // held for a second: it repeats
  p.frames(60);
  ImGui::GetIO().KeysDown[ImGuiKey_Space] = false;
  p.frames(2);
  CHECK(p.micro_batch() > 8);
  CHECK(p.app.history().undo_depth() == 3);
  CHECK(p.app.undo());
  CHECK(p.micro_batch() == 6);
}

TEST_CASE("app: Reset brings back the defaults, and is undone like any change", "[ui][history]") {
  Page p;
  p.app.set_config(with_micro_batch(2));
  p.frames(2);
  REQUIRE(p.tab_to("Reset, button: "));
  p.press(ImGuiKey_Enter);
  CHECK(p.app.config() == Config{});
  CHECK(p.focus().rfind("Reset, button, unavailable", 0) == 0);  // nothing left to reset
  p.press(ImGuiKey_Z, false, true);
  CHECK(p.micro_batch() == 2);
  CHECK(p.app.reset());
  CHECK(!p.app.reset());  // already the defaults
}

TEST_CASE("app: a pasted link is a new browser history entry, one the browser went to is not", "[ui][history]") {
  Page p;
  p.app.load_fragment("#" + config_to_fragment(with_micro_batch(2)));
  p.frames(2);
  REQUIRE(p.pushed.size() == 1);
  CHECK(p.pushed[0] == config_to_fragment(with_micro_batch(2)));
  p.app.load_fragment("#" + config_to_fragment(Config{}), true);  // Back
  p.frames(2);
  CHECK(p.pushed.size() == 1);
  CHECK(p.replaced.back() == config_to_fragment(Config{}));
  CHECK(p.app.config() == Config{});
  CHECK(p.app.history().undo_depth() == 2);  // and Ctrl+Z undoes the Back
  CHECK(p.app.undo());
  CHECK(p.micro_batch() == 2);
}

TEST_CASE("app: messages go to the status line and never move the panels, an import's notes fold into the log", "[ui][status]") {
  Page p;
  const float scroll_max = p.app.inputs_scroll().max;  // the inputs panel's height shows in how far it scrolls
  for (int i = 0; i < 6; ++i) {
    p.app.load_fragment("#garbage");  // an error message each, the setup kept
    p.frames(2);
    CHECK(p.app.inputs_scroll().max == scroll_max);
  }
  REQUIRE(p.app.load_text(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                              "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}})", "ds.json"));
  p.frames(2);
  const ui::Message& import = p.app.messages().back();
  CHECK(import.text.find("DeepSpeed config") != std::string::npos);
  CHECK(!import.details.empty());  // what it read and assumed, in the log
  CHECK(import.full().find(import.details[0]) != std::string::npos);
  for (int i = 0; i < 60; ++i) p.app.load_fragment("#garbage");
  CHECK(p.app.messages().size() == 50);  // the log keeps the last 50
  // The status line's text is one line, cut to fit.
  std::string line(400, 'w');
  CHECK(ui::fit_one_line(line, 200.0f));
  CHECK(ImGui::CalcTextSize(line.c_str()).x <= 200.0f);
  CHECK(line.substr(line.size() - 3) == "...");
  std::string short_line = "two\nlines";
  CHECK(!ui::fit_one_line(short_line, 500.0f));
  CHECK(short_line == "two lines");
}

TEST_CASE("app: \"copied\" only once the platform says so, else the link is shown to copy by hand", "[ui][clipboard]") {
  Page p(true);
  REQUIRE(p.tab_to("Copy link"));
  p.press(ImGuiKey_Enter);
  REQUIRE(p.copied.size() == 1);
  CHECK(!p.said("copied"));  // not yet known
  p.app.copy_finished(false);
  p.frames(3);
  CHECK(!p.said("Link copied"));
  CHECK(p.app.messages().back().text.find("NOT copied") != std::string::npos);
  // The box under the toolbar: the link in a read-only field, selected, so that Ctrl+C copies it.
  CHECK(p.focus().rfind("The link to copy by hand", 0) == 0);
  CHECK(ui::editing_text());
  std::string text;
  REQUIRE(ui::text_field_copy(text));
  CHECK(text == p.copied[0]);
  p.press(ImGuiKey_Escape);
  p.press(ImGuiKey_Escape);
  REQUIRE(p.tab_to("Copy link"));
  p.press(ImGuiKey_Enter);
  p.app.copy_finished(true);
  CHECK(p.app.messages().back().text.rfind("Link copied", 0) == 0);
}

TEST_CASE("app: a paste into a field (ImGui's Ctrl+V, as the page's bridge presses it) and a copy from it", "[ui][clipboard]") {
  Page p;
  static std::string clipboard;
  ImGui::GetIO().GetClipboardTextFn = [](void*) { return clipboard.c_str(); };
  ImGui::GetIO().SetClipboardTextFn = [](void*, const char* t) { clipboard = t; };
  CHECK(!ui::editing_text());
  std::string text;
  CHECK(!ui::text_field_copy(text));
  REQUIRE(p.tab_to("micro_batch_size: 4"));  // Tab starts editing, its text selected
  CHECK(ui::editing_text());
  REQUIRE(ui::text_field_copy(text));
  CHECK(text == "4");
  clipboard = "16";
  p.press(ImGuiKey_V, false, true);
  p.press(ImGuiKey_Enter);
  CHECK(p.micro_batch() == 16);
  CHECK(!ui::editing_text());
}

TEST_CASE("screen readers: the - and + buttons say decrease and increase, the verdict is read out when settled", "[ui][a11y]") {
  Page p;
  REQUIRE(p.tab_to("micro_batch_size: 4"));
  p.press(ImGuiKey_Tab);
  CHECK(p.focus() == "decrease micro_batch_size, button: 4");
  p.press(ImGuiKey_Tab);
  CHECK(p.focus() == "increase micro_batch_size, button: 4");
  p.press(ImGuiKey_Tab);
  CHECK(p.focus().rfind("sequence_length: ", 0) == 0);

  const std::regex verdict(R"(^(Fits|Borderline|Does not fit|Out of memory): \d+\.\d GiB of \d+\.\d GiB usable$)");
  const std::string before = p.app.verdict_announcement();
  CHECK(std::regex_match(before, verdict));
  CHECK(before == ui::verdict_sentence(p.app.result(), Unit::GiB));
  REQUIRE(p.tab_to("micro_batch_size: 4"));
  p.type("64");  // far beyond the GPU: does not fit, but not read out while typed
  CHECK(p.micro_batch() == 64);
  CHECK(p.app.verdict_announcement() == before);
  p.press(ImGuiKey_Enter);
  CHECK(p.app.verdict_announcement() != before);
  CHECK(p.app.verdict_announcement().rfind("Fits", 0) != 0);
  CHECK(std::regex_match(p.app.verdict_announcement(), verdict));

  Result bad;
  bad.errors.push_back({"training.micro_batch_size", "training.micro_batch_size must be at least 1"});
  CHECK(ui::verdict_sentence(bad, Unit::GiB) == "No verdict: training.micro_batch_size must be at least 1");
}
