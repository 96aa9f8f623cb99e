// Desktop main loop: GLFW + OpenGL 3.3 core. Platform layer: the only place with GLFW/GL on the desktop.
//   memsim [FILE.json | LINK-or-#fragment] [--frames N] [--screenshot OUT.ppm] [--size WxH]
// [x] config file or link on the command line   [x] drag and drop of files   [x] clipboard (GLFW)
// [x] --frames/--screenshot for the headless smoke test under Xvfb
#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "imgui_setup.h"
#include "ui/app.h"

namespace {

memsim::ui::App* g_app = nullptr;
GLFWwindow* g_window = nullptr;

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

void open_argument(const std::string& arg) {
  const auto hash = arg.find('#');
  if (hash != std::string::npos) {  // a shared link or a bare fragment
    g_app->load_fragment(arg.substr(hash));
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

}  // namespace

int main(int argc, char** argv) {
  int frames = -1, width = 1280, height = 800;
  std::string screenshot, open;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--frames" && i + 1 < argc) frames = std::atoi(argv[++i]);
    else if (a == "--screenshot" && i + 1 < argc) screenshot = argv[++i];
    else if (a == "--size" && i + 1 < argc) std::sscanf(argv[++i], "%dx%d", &width, &height);
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
  glfwSwapInterval(frames > 0 ? 0 : 1);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  float sx = 1.0f, sy = 1.0f;
  glfwGetWindowContentScale(g_window, &sx, &sy);
  memsim::platform::setup_imgui("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", sx);
  ImGui_ImplGlfw_InitForOpenGL(g_window, true);
  ImGui_ImplOpenGL3_Init("#version 330");

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

  int frame = 0;
  while (!glfwWindowShouldClose(g_window)) {
    if (frames > 0) glfwPollEvents();
    else glfwWaitEventsTimeout(0.5);  // idle without spinning the CPU
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    ImGui::NewFrame();
    app.frame();
    ImGui::Render();
    int fw, fh;
    glfwGetFramebufferSize(g_window, &fw, &fh);
    glViewport(0, 0, fw, fh);
    glClearColor(0.08f, 0.08f, 0.09f, 1.0f);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    ++frame;
    if (frames > 0 && frame >= frames) {
      if (!screenshot.empty() && !write_screenshot(screenshot, fw, fh)) {
        std::fprintf(stderr, "memsim: cannot write %s\n", screenshot.c_str());
        return 1;
      }
      break;
    }
    glfwSwapBuffers(g_window);
  }
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(g_window);
  glfwTerminate();
  return 0;
}
