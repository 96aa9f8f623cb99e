// Browser main loop: Emscripten's GLFW + WebGL2. Platform layer: the only place with Emscripten headers.
// [x] URL fragment read on load and kept current: an applied change is a new history entry (history.pushState), the
//     rest of its edit replaces it (history.replaceState); Back and Forward (popstate, hashchange) open their setup
// [x] hashchange (a pasted link) reloads the state
// [x] clipboard via navigator.clipboard, its outcome told to the app (App::copy_finished: "copied" only once it is)
// [x] Ctrl+C, Ctrl+X and Ctrl+V in text fields: the browser's copy, cut and paste events bridged to ImGui
//     (web/memsim-page.js; Emscripten 3.1.6's GLFW has no clipboard)
// [x] the verdict read out by a live region of its own (#verdict) when it changes
// [x] file drop and paste (web/memsim-page.js -> memsim_load_text): configs, and files of sample lengths
// [x] a run of varying shapes simulated a part per frame; window.memsim.state().simulation says how far
// [x] HiDPI: canvas backing store = CSS size x devicePixelRatio
// [x] download (Blob) and upload (file picker) of configs
// [x] window.memsim.estimate(configJson) (memsim_estimate_json), for scripting and the e2e tests
// [x] charts drawn by the WebGL2 chart renderer (shaders/), or by ImGui's draw list if it cannot be built;
//     window.memsim.state().charts says which, and how many charts it has drawn
// [x] keyboard: one key event per frame (key_queue.h); the focused control read out by a live region (#focus)
// [x] the wheel and one finger by the app's own rules (ui/pointer.h), not GLFW's: a notch scrolls three rows, a swipe
//     scrolls and never drags a number, a tap clicks
// [x] idle means idle: frames are drawn on input, while work is left (a run's replay, What helps, the Fit explorer)
//     and for a few frames after; otherwise the main loop sleeps until web/memsim-page.js wakes it
#include <algorithm>
#include <GLFW/glfw3.h>
#include <emscripten/emscripten.h>
#include <emscripten/html5.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>

#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/serialize.h"
#include "core/simulate.h"
#include "gl_chart_renderer.h"
#include "imgui_setup.h"
#include "key_queue.h"
#include "ui/app.h"
#include "ui/clipboard.h"
#include "ui/pointer.h"

// clang-format off
EM_JS(char*, js_location_hash, (), {
  var s = window.location.hash || "";
  var n = lengthBytesUTF8(s) + 1;
  var p = _malloc(n);
  stringToUTF8(s, p, n);
  return p;
});
EM_JS(char*, js_page_url, (), {
  var s = window.location.origin + window.location.pathname;
  var n = lengthBytesUTF8(s) + 1;
  var p = _malloc(n);
  stringToUTF8(s, p, n);
  return p;
});
// window.memsimHash is the fragment the app put in the address bar: web/memsim-page.js opens a popstate's or a
// hashchange's fragment only when it is another one.
EM_JS(void, js_replace_hash, (const char* frag), {
  window.memsimHash = "#" + UTF8ToString(frag);
  history.replaceState(null, "", window.memsimHash);
});
EM_JS(void, js_push_hash, (const char* frag), {
  window.memsimHash = "#" + UTF8ToString(frag);
  history.pushState(null, "", window.memsimHash);
});
// The first frame is on the screen once the browser starts the next animation frame (it has composited this one).
EM_JS(void, js_note_first_frame_presented, (), {
  requestAnimationFrame(function() { window.memsimFirstFramePresented = performance.now(); });
});
EM_JS(bool, js_first_frame_presented, (), { return typeof window.memsimFirstFramePresented === "number"; });
// The focused control in words, for screen readers: a live region reads out each new text (textContent only).
EM_JS(void, js_announce, (const char* text), {
  var el = document.getElementById("focus");
  if (el) el.textContent = UTF8ToString(text);
});
// The verdict, in a polite live region of its own, so that it and the focus do not cut each other off.
EM_JS(void, js_announce_verdict, (const char* text), {
  var el = document.getElementById("verdict");
  if (el) el.textContent = UTF8ToString(text);
});
// The clipboard API exists only in a secure context (HTTPS, localhost), and may refuse: the app hears which.
EM_JS(void, js_copy_text, (const char* text), {
  var s = UTF8ToString(text);
  window.memsimLastCopied = s;  // what the app asked to copy, copied or not: read by the e2e tests
  var told = false;
  function tell(ok) {
    if (told) return;
    told = true;
    window.memsimCopyResult = ok;
    Module._memsim_copy_finished(ok ? 1 : 0);
  }
  try {
    if (navigator.clipboard && navigator.clipboard.writeText)
      navigator.clipboard.writeText(s).then(function() { tell(true); }, function() { tell(false); });
    else setTimeout(function() { tell(false); }, 0);
  } catch (e) {
    setTimeout(function() { tell(false); }, 0);
  }
});
EM_JS(void, js_download, (const char* name, const char* text), {
  var blob = new Blob([UTF8ToString(text)], {type: "application/json"});
  var a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = UTF8ToString(name);
  document.body.appendChild(a);
  a.click();
  setTimeout(function() { URL.revokeObjectURL(a.href); a.remove(); }, 0);
});
EM_JS(void, js_open_file, (), {
  var input = document.createElement("input");
  input.type = "file";
  input.accept = ".json,.yaml,.yml,.txt,application/json,text/plain";
  input.onchange = function() {
    var file = input.files && input.files[0];
    if (file && file.size > 256 * 1024 * 1024) window.memsim.loadText("", "\"" + file.name + "\" (over 256 MiB, not read)");
    else if (file) file.text().then(function(t) { window.memsim.loadText(t, "\"" + file.name + "\""); });
  };
  input.click();
});
// clang-format on

namespace {

GLFWwindow* g_window = nullptr;
memsim::ui::App* g_app = nullptr;
memsim::platform::GlChartRenderer* g_charts = nullptr;  // null when its shaders did not build
float g_ratio = 1.0f;
memsim::ui::PointerInput g_pointer;
// ImGui's clipboard on the page: the text of the last browser paste (and of ImGui's own copies). The browser's
// clipboard is reached through its events only (web/memsim-page.js).
std::string g_clipboard;

// Idle means idle. A frame is drawn when input came (web/memsim-page.js calls memsim_wake for every event that can
// change the page, and the API's calls wake it too), while the app has work of its own (App::wants_frames), while a
// key or a mouse button is held (imgui_setup.h input_held), and for kSettleFrames after the last of these: ImGui lays
// out a popup or a resized window over a frame or two. Otherwise the main loop pauses (emscripten_pause_main_loop), so
// that a static page asks the browser for no animation frames at all, until the next wake resumes it.
constexpr int kSettleFrames = 3;
int g_settle = kSettleFrames;
bool g_woken = true;   // something happened since the last frame
bool g_paused = false;
long g_frames_drawn = 0;
// How many frames the last simulation was still running at the end of (0: it finished in the frame it started):
// window.memsim.state().simulation.frames, for the test that a long run fills in over frames. The current one's so far.
long g_simulation_frames = 0, g_simulation_frames_last = 0;
uint64_t g_result_version_seen = 0;

void wake() {
  g_woken = true;
  if (g_paused) {
    g_paused = false;
    emscripten_resume_main_loop();
  }
}

// Where the page's first second goes, in ms since navigation (performance.now()): reported by
// window.memsim.state().timings and printed by the first-frame e2e test.
struct StartupTimings {
  double main = 0, context = 0, imgui = 0, app = 0;                               // main()'s steps, each when done
  double first_frame_start = 0, first_frame_device = 0, first_frame_ui = 0, first_frame_end = 0;
  bool first_frame_result = false;  // the first frame showed a verdict, breakdown and timeline
  double chart_renderer_ms = 0;     // building the chart renderer, once the first frame is on the screen
} g_t;

std::string take_js_string(char* p) {
  std::string s = p ? p : "";
  std::free(p);
  return s;
}

// A JSON string literal of `text` (control characters become spaces).
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\', out += ch;
    else if (static_cast<unsigned char>(ch) < 0x20) out += ' ';
    else out += ch;
  }
  return out + "\"";
}

char* new_c_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

// The chart renderer compiles two more shader programs, which a software GL (SwiftShader) also has to translate
// at their first draw: that work waits until the first frame is on the screen. Until then the charts go through
// ImGui's draw list, which draws the same pixels (docs/renderer.md).
void start_chart_renderer() {
  const double start = emscripten_get_now();
  static memsim::platform::GlChartRenderer charts;
  if (charts.init()) {
    g_charts = &charts;
    memsim::ui::set_chart_renderer(&charts);
    emscripten_log(EM_LOG_CONSOLE, "memsim: charts: WebGL2 renderer");
  } else {
    emscripten_log(EM_LOG_CONSOLE | EM_LOG_WARN, "memsim: charts: draw list, because the WebGL2 renderer could not be built: %s",
                   charts.error().c_str());
  }
  g_t.chart_renderer_ms = emscripten_get_now() - start;
}

void frame() {
  static bool charts_started = false;
  if (!charts_started && js_first_frame_presented()) {
    charts_started = true;
    start_chart_renderer();
  }
  // Size the canvas backing store to its CSS box times the device pixel ratio, every frame (resizes, zoom). Only the
  // canvas: Emscripten's glfwSetWindowSize requests fullscreen when the size equals the screen's (library_glfw.js
  // setWindowSize), as a phone's page does, and a request outside a user gesture was refused with an uncaught
  // "TypeError: Permissions check failed". The UI's size comes from here (io.DisplaySize below), not from GLFW's.
  double css_w = 0, css_h = 0;
  emscripten_get_element_css_size("#canvas", &css_w, &css_h);
  const double ratio = emscripten_get_device_pixel_ratio();
  const int px_w = static_cast<int>(css_w * ratio), px_h = static_cast<int>(css_h * ratio);
  int cur_w = 0, cur_h = 0;
  emscripten_get_canvas_element_size("#canvas", &cur_w, &cur_h);
  bool resized = false;
  if (cur_w != px_w || cur_h != px_h) {
    emscripten_set_canvas_element_size("#canvas", px_w, px_h);
    resized = true;
  }
  if (static_cast<float>(ratio) != g_ratio) {  // moved to another screen or zoomed: re-rasterise the font
    g_ratio = static_cast<float>(ratio);
    ImGui_ImplOpenGL3_DestroyFontsTexture();
    memsim::platform::setup_imgui("/fonts/DejaVuSans.ttf", g_ratio);
    resized = true;
  }
  // Draw this frame, or sleep until woken (see kSettleFrames). A resized canvas is cleared by the browser: redraw it.
  if (g_woken || resized || memsim::platform::KeyQueue::pending() || g_pointer.pending()) g_settle = kSettleFrames;
  g_woken = false;
  const bool work = !charts_started || g_app->wants_frames() || memsim::platform::input_held();
  if (!work && g_settle == 0) {
    g_paused = true;
    emscripten_pause_main_loop();
    return;
  }
  if (g_settle > 0) --g_settle;
  ++g_frames_drawn;
  const bool first = g_t.first_frame_start == 0;
  if (first) g_t.first_frame_start = emscripten_get_now();
  ImGui_ImplOpenGL3_NewFrame();  // the first one builds the font atlas and the backend's shaders
  if (first) g_t.first_frame_device = emscripten_get_now();
  memsim::platform::KeyQueue::feed();
  ImGui_ImplGlfw_NewFrame();
  ImGuiIO& io = ImGui::GetIO();
  // A frame slower than ImGui's key-repeat delay (0.275 s: a loaded machine, or the first frame after an idle wait)
  // would turn one press held across it into a repeat; a step of at most 0.1 s needs three such frames for one.
  io.DeltaTime = std::min(io.DeltaTime, 0.1f);
  // Emscripten's GLFW reports the cursor in backing-store pixels (library_browser.js calculateMouseEvent scales
  // by canvas.width / rect.width), while the UI lays out in CSS pixels: bring the mouse back to CSS pixels.
  if (ratio > 0 && ratio != 1.0 && io.MousePos.x > -FLT_MAX / 2)
    io.MousePos = ImVec2(io.MousePos.x / static_cast<float>(ratio), io.MousePos.y / static_cast<float>(ratio));
  io.DisplaySize = ImVec2(static_cast<float>(css_w), static_cast<float>(css_h));
  io.DisplayFramebufferScale = ImVec2(static_cast<float>(ratio), static_cast<float>(ratio));
  g_pointer.before_new_frame(io);  // the wheel and a finger, in CSS pixels like the mouse above
  ImGui::NewFrame();
  g_pointer.after_new_frame();
  g_app->frame();
  if (g_app->simulating()) {
    ++g_simulation_frames;
  } else {
    if (g_simulation_frames > 0 || g_app->result_version() != g_result_version_seen)
      g_simulation_frames_last = g_simulation_frames;
    g_simulation_frames = 0;
  }
  g_result_version_seen = g_app->result_version();
  static std::string announced, verdict;
  if (g_app->focus_announcement() != announced) {
    announced = g_app->focus_announcement();
    js_announce(announced.c_str());
  }
  if (g_app->verdict_announcement() != verdict) {
    verdict = g_app->verdict_announcement();
    js_announce_verdict(verdict.c_str());
  }
  ImGui::Render();
  if (first) g_t.first_frame_ui = emscripten_get_now();
  glViewport(0, 0, px_w, px_h);
  const ImVec4 clear = memsim::platform::clear_color();
  glClearColor(clear.x, clear.y, clear.z, clear.w);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  if (first) {
    g_t.first_frame_end = emscripten_get_now();
    g_t.first_frame_result = g_app->result().ok && !g_app->result().devices.empty();
    js_note_first_frame_presented();
  }
}

}  // namespace

extern "C" {

// window.memsim.estimate: config JSON in, result JSON out (caller frees). Never throws.
EMSCRIPTEN_KEEPALIVE char* memsim_estimate_json(const char* config_json) {
  memsim::Parsed p = memsim::config_from_json(config_json ? config_json : "");
  memsim::Result r;
  if (p.ok) r = memsim::simulate(p.config);
  else r.errors = p.errors;
  return new_c_string(memsim::result_to_json(r, false, -1));
}

// A link pasted onto the page (window.memsim.openFragment): an applied change, a new history entry.
EMSCRIPTEN_KEEPALIVE void memsim_set_fragment(const char* fragment) {
  if (g_app) g_app->load_fragment(fragment ? fragment : "");
  wake();
}

// The browser went to another entry of its history (Back, Forward) or the address's fragment was edited: its setup
// opens without a new entry.
EMSCRIPTEN_KEEPALIVE void memsim_navigate(const char* fragment) {
  if (g_app) g_app->load_fragment(fragment ? fragment : "", true);
  wake();
}

// The outcome of js_copy_text's navigator.clipboard.writeText.
EMSCRIPTEN_KEEPALIVE void memsim_copy_finished(int copied) {
  if (g_app) g_app->copy_finished(copied != 0);
  wake();
}

// The clipboard bridge of the text fields (web/memsim-page.js). Whether a text field is being edited: a paste, copy
// or cut is for it.
EMSCRIPTEN_KEEPALIVE int memsim_editing_text() { return memsim::ui::editing_text() ? 1 : 0; }

// What a copy or a cut in the edited field puts on the clipboard (caller frees), or null when it puts nothing.
EMSCRIPTEN_KEEPALIVE char* memsim_text_field_copy() {
  std::string text;
  return memsim::ui::text_field_copy(text) ? new_c_string(text) : nullptr;
}

// Presses Ctrl+`key` for ImGui: V pastes g_clipboard, X deletes what a cut copied. The browser's own Ctrl+V and Ctrl+X
// never reach GLFW (web/memsim-page.js stops them), so that each happens once, after the browser's event. Where
// Control is not held (a paste from the browser's menu, Cmd on a Mac keyboard), Control is pressed around it.
static void press_with_control(int key, bool control_held) {
  using memsim::platform::KeyQueue;
  if (!control_held) KeyQueue::push(GLFW_KEY_LEFT_CONTROL, GLFW_PRESS, GLFW_MOD_CONTROL);
  KeyQueue::push(key, GLFW_PRESS, GLFW_MOD_CONTROL);
  KeyQueue::push(key, GLFW_RELEASE, GLFW_MOD_CONTROL);
  if (!control_held) KeyQueue::push(GLFW_KEY_LEFT_CONTROL, GLFW_RELEASE);
  wake();
}

// The browser's paste event, for the edited text field: the text becomes ImGui's clipboard, and Ctrl+V pastes it.
EMSCRIPTEN_KEEPALIVE void memsim_paste(const char* text, int control_held) {
  g_clipboard = text ? text : "";
  press_with_control(GLFW_KEY_V, control_held != 0);
}

// The browser's cut event, once it has the text (memsim_text_field_copy): Ctrl+X takes it out of the field.
EMSCRIPTEN_KEEPALIVE void memsim_cut(int control_held) { press_with_control(GLFW_KEY_X, control_held != 0); }

EMSCRIPTEN_KEEPALIVE void memsim_load_text(const char* text, const char* origin) {
  if (g_app) g_app->load_text(text ? text : "", origin ? origin : "the file");
  wake();
}

// Something happened that may change the page (web/memsim-page.js: a key, the mouse, a resize, focus): draw again.
EMSCRIPTEN_KEEPALIVE void memsim_wake() { wake(); }

// The mouse moved or was pressed: it is the pointer again after a touch.
EMSCRIPTEN_KEEPALIVE void memsim_mouse() {
  g_pointer.mouse_used();
  wake();
}

// A WheelEvent's deltaX, deltaY and deltaMode, as the DOM gives them (ui/pointer.h normalises them).
EMSCRIPTEN_KEEPALIVE void memsim_wheel(double dx, double dy, int mode) {
  g_pointer.wheel(dx, dy, mode);
  wake();
}

// One finger's touch: phase 0 start, 1 move, 2 end, 3 cancel; the position in CSS pixels from the canvas's corner.
EMSCRIPTEN_KEEPALIVE void memsim_touch(int phase, double x, double y) {
  const float fx = static_cast<float>(x), fy = static_cast<float>(y);
  if (phase == 0) g_pointer.touch_start(fx, fy);
  else if (phase == 1) g_pointer.touch_move(fx, fy);
  else if (phase == 2) g_pointer.touch_end(fx, fy);
  else g_pointer.touch_cancel();
  wake();
}

// The interface's current state, for tests: {"config": ..., "fragment": "...", "messages": [...], "verdict": "...",
// "history": {...}, "text_field": {...}, "focus": "...", "charts": {...}, "timings": {...}, "simulation": {...},
// "result": {...}, "frames": {...}, "scroll": {...}}. "verdict" is what the page's #verdict live region reads out,
// "history" how many undo and redo entries there are, "text_field" whether a text field is being edited and what
// Ctrl+C would copy from it.
// "simulation" says whether the setup is still being simulated and how far its run is; "result" whether it is ok, its
// first error's field, and its run; "frames" how many frames were drawn and whether the loop sleeps now; "scroll" the
// inputs panel's scroll position, its largest and a row's height, in CSS pixels.
EMSCRIPTEN_KEEPALIVE char* memsim_state_json() {
  if (!g_app) return new_c_string("{}");
  std::string msgs = "[";
  for (const auto& m : g_app->messages()) msgs += std::string(msgs.size() > 1 ? "," : "") + json_string(m.full());
  msgs += "]";
  // timeline_draws counts every quad chart (the timeline and the breakdown bars), as it did when the timeline was the only one.
  const std::string charts = g_charts ? "{\"renderer\":\"webgl2\",\"timeline_draws\":" + std::to_string(g_charts->quad_draws()) +
                                            ",\"timeline_uploads\":" + std::to_string(g_charts->quad_uploads()) +
                                            ",\"heatmap_draws\":" + std::to_string(g_charts->heatmap_draws()) + "}"
                                      : "{\"renderer\":\"draw list\"}";
  char timings[400];
  std::snprintf(timings, sizeof timings,
                "{\"main\":%.1f,\"context\":%.1f,\"imgui\":%.1f,\"app\":%.1f,\"first_frame_start\":%.1f,"
                "\"first_frame_device\":%.1f,\"first_frame_ui\":%.1f,\"first_frame_end\":%.1f,\"first_frame_result\":%s,"
                "\"chart_renderer_ms\":%.1f}",
                g_t.main, g_t.context, g_t.imgui, g_t.app, g_t.first_frame_start, g_t.first_frame_device, g_t.first_frame_ui,
                g_t.first_frame_end, g_t.first_frame_result ? "true" : "false", g_t.chart_renderer_ms);
  const memsim::Simulation::RunProgress p = g_app->simulation_progress();
  const std::string simulation = std::string("{\"running\":") + (g_app->simulating() ? "true" : "false") +
                                 ",\"step\":" + std::to_string(p.step) + ",\"steps\":" + std::to_string(p.steps) +
                                 ",\"pass\":" + std::to_string(p.pass) + ",\"order\":" + std::to_string(p.order) +
                                 ",\"orders\":" + std::to_string(p.orders) + ",\"frames\":" +
                                 std::to_string(g_app->simulating() ? g_simulation_frames : g_simulation_frames_last) + "}";
  const memsim::Result& r = g_app->result();
  const memsim::RunTrace* run = r.ok && !r.devices.empty() ? &r.devices[0].run : nullptr;
  const std::string result = std::string("{\"ok\":") + (r.ok ? "true" : "false") + ",\"error_field\":" +
                             json_string(r.errors.empty() ? "" : r.errors[0].field) + ",\"run_steps\":" +
                             std::to_string(run ? run->steps : 0) + ",\"allocated_peak_step\":" +
                             std::to_string(run ? run->allocated_peak_step : 0) + ",\"view\":\"" +
                             (g_app->run_view() ? "run" : "step") + "\"}";
  const memsim::ui::App::Scroll& sc = g_app->inputs_scroll();
  char scroll[160];
  std::snprintf(scroll, sizeof scroll, "{\"inputs\":%.1f,\"inputs_max\":%.1f,\"row\":%.1f}", sc.y, sc.max, sc.row);
  const std::string frames = "{\"drawn\":" + std::to_string(g_frames_drawn) + ",\"idle\":" + (g_paused ? "true" : "false") + "}";
  using memsim::platform::KeyQueue;
  const std::string keys = "{\"received\":" + std::to_string(KeyQueue::presses_received()) +
                           ",\"fed\":" + std::to_string(KeyQueue::presses_fed()) +
                           ",\"pending\":" + (KeyQueue::pending() ? "true" : "false") +
                           ",\"frames_since\":" + std::to_string(KeyQueue::frames_since_last_event()) + "}";
  std::string copy;  // the text field being edited: what Ctrl+C would copy (its selection, or all of a one-line field)
  const bool copies = memsim::ui::text_field_copy(copy);
  const std::string text_field = std::string("{\"editing\":") + (memsim::ui::editing_text() ? "true" : "false") +
                                 ",\"copy\":" + (copies ? json_string(copy) : "null") + "}";
  const std::string history = "{\"undo\":" + std::to_string(g_app->history().undo_depth()) +
                              ",\"redo\":" + std::to_string(g_app->history().redo_depth()) + "}";
  return new_c_string("{\"config\":" + memsim::config_to_json(g_app->config(), -1) + ",\"fragment\":\"" +
                      memsim::config_to_fragment(g_app->config()) + "\",\"messages\":" + msgs +
                      ",\"verdict\":" + json_string(g_app->verdict_announcement()) + ",\"history\":" + history +
                      ",\"text_field\":" + text_field +
                      ",\"focus\":" + json_string(g_app->focus_announcement()) + ",\"charts\":" + charts +
                      ",\"timings\":" + timings + ",\"simulation\":" + simulation + ",\"result\":" + result +
                      ",\"frames\":" + frames + ",\"keys\":" + keys + ",\"scroll\":" + scroll + "}");
}
}

int main() {
  g_t.main = emscripten_get_now();
  if (!glfwInit()) return 1;
  glfwWindowHint(GLFW_CLIENT_API, GLFW_OPENGL_ES_API);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 0);
  // ImGui and the charts need colour only: no depth or stencil buffer, and an opaque canvas, which the browser
  // composites without blending. web/memsim-page.js creates the context early with these same attributes.
  glfwWindowHint(GLFW_ALPHA_BITS, 0);
  glfwWindowHint(GLFW_DEPTH_BITS, 0);
  glfwWindowHint(GLFW_STENCIL_BITS, 0);
  double css_w = 1280, css_h = 720;
  emscripten_get_element_css_size("#canvas", &css_w, &css_h);
  g_window = glfwCreateWindow(static_cast<int>(css_w), static_cast<int>(css_h), "memsim", nullptr, nullptr);
  if (!g_window) return 1;
  glfwMakeContextCurrent(g_window);
  g_t.context = emscripten_get_now();

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  g_ratio = static_cast<float>(emscripten_get_device_pixel_ratio());
  memsim::platform::setup_imgui("/fonts/DejaVuSans.ttf", g_ratio);
  ImGui_ImplGlfw_InitForOpenGL(g_window, true);
  ImGuiIO& io = ImGui::GetIO();  // Emscripten's glfw{Get,Set}ClipboardString do nothing
  io.GetClipboardTextFn = [](void*) { return g_clipboard.c_str(); };
  io.SetClipboardTextFn = [](void*, const char* text) { g_clipboard = text ? text : ""; };
  memsim::platform::KeyQueue::install(g_window);
  ImGui_ImplOpenGL3_Init("#version 300 es");
  g_t.imgui = emscripten_get_now();
  memsim::ui::PlatformHooks hooks;
  hooks.publish_fragment = [](const std::string& f) { js_replace_hash(f.c_str()); };
  hooks.push_fragment = [](const std::string& f) { js_push_hash(f.c_str()); };
  hooks.copy_text = [](const std::string& s) { js_copy_text(s.c_str()); };
  hooks.copy_reports_later = true;
  hooks.save_text = [](const std::string& name, const std::string& text) -> std::string {
    js_download(name.c_str(), text.c_str());
    return "Downloaded " + name + ".";
  };
  hooks.open_file = [] { js_open_file(); };
  hooks.page_url = take_js_string(js_page_url());
  // The link's setup, simulated once; the defaults when there is none (or, with a message, when it is broken).
  static memsim::ui::App app(hooks, take_js_string(js_location_hash()));
  g_app = &app;
  g_t.app = emscripten_get_now();
  emscripten_set_main_loop(frame, 0, false);
  return 0;
}
