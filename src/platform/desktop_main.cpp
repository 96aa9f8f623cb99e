// Desktop main loop: GLFW + OpenGL 3.3 core. Platform layer: the only place with GLFW/GL on the desktop.
//   memsim [FILE.json | LINK-or-#fragment] [--frames N] [--screenshot OUT.ppm] [--size WxH]
//          [--view breakdown|explorer|advice|run] [--no-gl-charts] [--bench-timeline EVENTS]
// [x] config file or link on the command line   [x] drag and drop of files   [x] clipboard (GLFW)
// [x] a file of sample lengths, dropped or on the command line, as a config is (App::load_text tells them apart)
// [x] idle means idle: frames are drawn on input, while the app has work (a run's replay, What helps, the Fit
//     explorer filling in), while a mouse button is held, and for a few frames after; otherwise it waits for events
// [x] --frames/--screenshot for the headless smoke test under Xvfb
// [x] charts drawn by the GL chart renderer (shaders/), or by ImGui's draw list if it cannot be built
// [x] --bench-timeline: frames per second of the timeline with a synthetic step of that many events
// [x] keyboard: one key event per frame (key_queue.h), so a quick tap is never lost
#include <algorithm>
#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/heap.h"
#include "gl_chart_renderer.h"
#include "imgui_setup.h"
#include "key_queue.h"
#include "ui/app.h"
#include "ui/bench.h"

namespace {

memsim::ui::App* g_app = nullptr;
GLFWwindow* g_window = nullptr;

// Idle means idle: the loop waits for GLFW's events and draws a frame when one came, while the app has work of its
// own (App::wants_frames), while a key or a mouse button is held (imgui_setup.h input_held), and for kSettleFrames
// after the last of these (ImGui lays out a popup or a resized window over a frame or two). g_events counts the events
// that can change the window; keys and characters wait in the KeyQueue.
constexpr int kSettleFrames = 3;
constexpr double kIdleWaitSeconds = 5.0;  // how long the loop sleeps at a stretch; waking without an event draws nothing
long g_events = 0;

// Before ImGui_ImplGlfw_InitForOpenGL, which keeps these as the previous callbacks and calls them after its own.
void count_events(GLFWwindow* w) {
  glfwSetCursorPosCallback(w, [](GLFWwindow*, double, double) { ++g_events; });
  glfwSetMouseButtonCallback(w, [](GLFWwindow*, int, int, int) { ++g_events; });
  glfwSetScrollCallback(w, [](GLFWwindow*, double, double) { ++g_events; });
  glfwSetWindowFocusCallback(w, [](GLFWwindow*, int) { ++g_events; });
  glfwSetCursorEnterCallback(w, [](GLFWwindow*, int) { ++g_events; });
  glfwSetFramebufferSizeCallback(w, [](GLFWwindow*, int, int) { ++g_events; });
  glfwSetWindowRefreshCallback(w, [](GLFWwindow*) { ++g_events; });  // uncovered: its pixels are to be drawn again
  glfwSetWindowContentScaleCallback(w, [](GLFWwindow*, float, float) { ++g_events; });
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

void open_argument(const std::string& arg) {
  // A shared link, or a fragment with or without its '#' (memsim=3&... as memsim-cli config --format fragment prints it).
  if (arg.find('#') != std::string::npos || arg.rfind("memsim=", 0) == 0 || arg.rfind("schema=", 0) == 0) {
    g_app->load_fragment(arg);
    return;
  }
  std::string text;
  if (!read_file(arg, text)) {
    g_app->load_text("", "\"" + arg + "\" (file could not be read)");
    return;
  }
  g_app->load_text(text, "\"" + arg + "\"");
}

void on_drop(GLFWwindow*, int count, const char** paths) {
  ++g_events;
  for (int i = 0; i < count; ++i) open_argument(paths[i]);
}

// Writes the front buffer as a binary PPM; the smoke test converts and inspects it.
bool write_screenshot(const std::string& path, int w, int h) {
  std::vector<unsigned char> px(static_cast<size_t>(w) * h * 3);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadPixels(0, 0, w, h, GL_RGB, GL_UNSIGNED_BYTE, px.data());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  std::fprintf(f, "P6\n%d %d\n255\n", w, h);
  for (int y = h - 1; y >= 0; --y) std::fwrite(&px[static_cast<size_t>(y) * w * 3], 1, static_cast<size_t>(w) * 3, f);
  return std::fclose(f) == 0;
}

void render(int& fw, int& fh) {
  glfwGetFramebufferSize(g_window, &fw, &fh);
  glViewport(0, 0, fw, fh);
  const ImVec4 clear = memsim::platform::clear_color();
  glClearColor(clear.x, clear.y, clear.z, clear.w);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
}

// CPU time of all the process's threads: llvmpipe rasterises on threads of its own.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Rate {
  double fps, cpu_ms;
};

// Frames per second of drawing a frame with `draw`, over `seconds` after a short warm-up, and the CPU time per
// frame: on a machine shared with other work the frame rate swings, the CPU time much less. The mouse rests at
// `mouse`, on the timeline, so the hover tooltip's replay of the step is part of every frame.
Rate measure(const std::function<void()>& draw, ImVec2 mouse, double seconds) {
  auto frame = [&] {
    glfwPollEvents();
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    ImGui::GetIO().MousePos = mouse;
    ImGui::NewFrame();
    draw();
    ImGui::Render();
    int fw, fh;
    render(fw, fh);
    glfwSwapBuffers(g_window);
  };
  for (int i = 0; i < 5; ++i) frame();
  glFinish();
  const double start = glfwGetTime(), cpu_start = cpu_seconds();
  int frames = 0;
  while (glfwGetTime() - start < seconds) frame(), ++frames;
  glFinish();
  return {frames / (glfwGetTime() - start), (cpu_seconds() - cpu_start) * 1e3 / frames};
}

void print_rate(const char* what, const char* path, Rate r) {
  std::printf("  %-36s %6.1f fps  %6.2f ms CPU per frame  %s\n", what, r.fps, r.cpu_ms, path);
  std::fflush(stdout);
}

// Prints frames per second of three layouts, each drawn by the GL renderer and by the draw list: the app as it
// opens with the synthetic step in its timeline (a chart of about 780 x 250 pixels at 1280 x 800), the timeline
// alone filling the window, and the same with one column per event instead of per pixel (2 quads per event).
void bench_timeline(size_t events, memsim::platform::GlChartRenderer* gl, memsim::ui::App& app) {
  app.show_result(memsim::ui::synthetic_step(events));
  const memsim::Result& step = app.result();
  int w, h;
  glfwGetWindowSize(g_window, &w, &h);
  std::printf("timeline bench: %zu events, %dx%d window, %s\n", events, w, h, reinterpret_cast<const char*>(glGetString(GL_RENDERER)));
  const ImVec2 on_app_timeline(w * 0.8f, h * 0.85f), centre(w * 0.5f, h * 0.5f);
  // The floor: the window with nothing but a line of text (ImGui, clear, swap), which no renderer can beat.
  print_rate("empty window", "", measure([] { memsim::ui::draw_timeline_bench(memsim::Result{}, 0, false); }, centre, 3.0));
  const struct {
    const char* what;
    std::function<void()> draw;
    ImVec2 mouse;
  } layouts[] = {
      {"app, a timeline column per pixel", [&] { app.frame(); }, on_app_timeline},
      {"timeline alone, a column per pixel", [&] { memsim::ui::draw_timeline_bench(step, app.result_version(), false); }, centre},
      {"timeline alone, a column per event", [&] { memsim::ui::draw_timeline_bench(step, app.result_version(), true); }, centre},
  };
  for (const auto& l : layouts) {
    if (gl) {
      memsim::ui::set_chart_renderer(gl);
      print_rate(l.what, "GL renderer", measure(l.draw, l.mouse, 3.0));
    }
    memsim::ui::set_chart_renderer(nullptr);
    print_rate(l.what, "draw list", measure(l.draw, l.mouse, 3.0));
  }
}

}  // namespace

int main(int argc, char** argv) {
  memsim::keep_freed_heap_memory();  // the app simulates again on every edit
  int frames = -1, width = 1280, height = 800;
  long bench_events = 0;
  bool gl_charts = true;
  std::string screenshot, open, view;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--frames" && i + 1 < argc) frames = std::atoi(argv[++i]);
    else if (a == "--screenshot" && i + 1 < argc) screenshot = argv[++i];
    else if (a == "--size" && i + 1 < argc) std::sscanf(argv[++i], "%dx%d", &width, &height);
    else if (a == "--view" && i + 1 < argc) view = argv[++i];
    else if (a == "--no-gl-charts") gl_charts = false;
    else if (a == "--bench-timeline" && i + 1 < argc) bench_events = std::atol(argv[++i]);
    else open = a;
  }
  if (!glfwInit()) {
    std::fprintf(stderr, "memsim: cannot initialise GLFW (no display?)\n");
    return 1;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GL_TRUE);
  g_window = glfwCreateWindow(width, height, "memsim - training memory simulator", nullptr, nullptr);
  if (!g_window) {
    std::fprintf(stderr, "memsim: cannot create an OpenGL 3.3 window\n");
    glfwTerminate();
    return 1;
  }
  glfwMakeContextCurrent(g_window);
  glfwSwapInterval(frames > 0 || bench_events > 0 ? 0 : 1);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  float sx = 1.0f, sy = 1.0f;
  glfwGetWindowContentScale(g_window, &sx, &sy);
  memsim::platform::setup_imgui("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", sx);
  count_events(g_window);
  ImGui_ImplGlfw_InitForOpenGL(g_window, true);
  memsim::platform::KeyQueue::install(g_window);
  ImGui_ImplOpenGL3_Init("#version 330");

  // The smoke test reads these lines: they say which path draws the charts on this machine.
  auto charts = std::make_unique<memsim::platform::GlChartRenderer>();
  if (!gl_charts) {
    std::printf("memsim: charts: draw list (--no-gl-charts)\n");
  } else if (charts->init()) {
    memsim::ui::set_chart_renderer(charts.get());
    std::printf("memsim: charts: %s renderer\n", charts->api());
  } else {
    std::printf("memsim: charts: draw list, because the GL renderer could not be built: %s\n", charts->error().c_str());
  }
  std::fflush(stdout);

  memsim::ui::PlatformHooks hooks;
  hooks.copy_text = [](const std::string& s) { glfwSetClipboardString(g_window, s.c_str()); };
  if (const char* url = std::getenv("MEMSIM_PAGE_URL")) hooks.page_url = url;
  hooks.save_text = [](const std::string& name, const std::string& text) -> std::string {
    std::ofstream f(name, std::ios::binary);
    f << text;
    return f ? "Saved " + name + " in the current folder." : "Could not write " + name + ".";
  };
  memsim::ui::App app(hooks);
  g_app = &app;
  glfwSetDropCallback(g_window, on_drop);
  if (!open.empty()) open_argument(open);
  if (!view.empty() && !app.show_view(view)) std::fprintf(stderr, "memsim: no view \"%s\"; keeping the breakdown\n", view.c_str());
  if (bench_events > 0) bench_timeline(static_cast<size_t>(bench_events), memsim::ui::chart_renderer() ? charts.get() : nullptr, app);

  int frame = 0, settle = kSettleFrames;
  while (bench_events <= 0 && !glfwWindowShouldClose(g_window)) {
    // --frames N draws N frames back to back, for the smoke test.
    const bool busy = frames > 0 || settle > 0 || memsim::platform::KeyQueue::pending() || app.wants_frames() ||
                      memsim::platform::input_held();
    const long events = g_events;
    if (busy) glfwPollEvents();
    else glfwWaitEventsTimeout(kIdleWaitSeconds);
    if (g_events != events || memsim::platform::KeyQueue::pending()) settle = kSettleFrames;
    else if (!busy) continue;  // the wait ran out with nothing to draw
    if (settle > 0) --settle;
    ImGui_ImplOpenGL3_NewFrame();
    memsim::platform::KeyQueue::feed();
    ImGui_ImplGlfw_NewFrame();
    // A frame slower than ImGui's key-repeat delay (0.275 s: a loaded machine, or the first frame after an idle
    // wait) would turn one press held across it into a repeat; a step of at most 0.1 s needs three such frames.
    ImGui::GetIO().DeltaTime = std::min(ImGui::GetIO().DeltaTime, 0.1f);
    ImGui::NewFrame();
    app.frame();
    ImGui::Render();
    int fw, fh;
    render(fw, fh);
    ++frame;
    if (frames > 0 && frame >= frames) {
      if (!screenshot.empty() && !write_screenshot(screenshot, fw, fh)) {
        std::fprintf(stderr, "memsim: cannot write %s\n", screenshot.c_str());
        return 1;
      }
      // "timeline" counts every quad chart (the timeline and the breakdown bars): tests/desktop/smoke.sh reads it.
      std::printf("memsim: charts drawn by the GL renderer: timeline %ld, heatmap %ld; quad uploads %ld\n",
                  charts->quad_draws(), charts->heatmap_draws(), charts->quad_uploads());
      break;
    }
    glfwSwapBuffers(g_window);
  }
  memsim::ui::set_chart_renderer(nullptr);
  charts.reset();  // while its context is current
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(g_window);
  glfwTerminate();
  return 0;
}
