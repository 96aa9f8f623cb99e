// Keys for Dear ImGui, one press or release of a key per frame. ImGui 1.86's GLFW backend only records whether a
// key is down when the frame starts, so a key pressed and released between two frames (a quick tap, a slow frame
// under a software renderer, a test's keyboard) never reaches the interface. The queue keeps GLFW's key and
// character events in order and hands them to the backend at the start of each frame, stopping before a second
// event of a key already seen in that frame: the press lands in one frame, its release in the next. Platform layer
// (GLFW); both main loops use it.
#pragma once
#include <GLFW/glfw3.h>
#include <imgui_impl_glfw.h>

#include <deque>
#include <vector>

namespace memsim::platform {

class KeyQueue {
 public:
  // After ImGui_ImplGlfw_InitForOpenGL(window, true): GLFW's key and character callbacks now go through the queue.
  static void install(GLFWwindow* window) {
    window_ = window;
    glfwSetKeyCallback(window, [](GLFWwindow*, int key, int scancode, int action, int mods) {
      if (action == GLFW_PRESS) ++presses_received_;
      events_.push_back({key, scancode, action, mods, 0});
    });
    glfwSetCharCallback(window, [](GLFWwindow*, unsigned int c) { events_.push_back({0, 0, kChar, 0, c}); });
  }

  // A key event that did not come from GLFW: the page's clipboard bridge presses Ctrl+V once the browser has handed it
  // the pasted text (web_main.cpp memsim_paste). It takes its turn after the events already queued.
  static void push(int key, int action, int mods = 0) { events_.push_back({key, 0, action, mods, 0}); }

  // Key presses GLFW reported (repeats not counted), and those handed to ImGui: the page reports both
  // (window.memsim.state().keys), so that a test that sees the focus move further than it pressed can tell whether
  // a press was doubled before ImGui or by it.
  static long presses_received() { return presses_received_; }
  static long presses_fed() { return presses_fed_; }
  // Events still queued, and the frames begun since the last one was handed over: a test waits for none queued and
  // two frames since (the focus a Tab moves is applied and read out a frame after the press) before it reads the
  // page's state. Counting the app's frames alone is not enough: frames drawn for an earlier key's settling, after
  // the test read the count and before this key came, would count too.
  static size_t pending_count() { return events_.size(); }
  static long frames_since_last_event() { return feeds_ - last_feed_; }

  // Whether events wait for the next frame: a loop that sleeps until the next event should not sleep now.
  static bool pending() { return !events_.empty(); }

  // Before ImGui_ImplGlfw_NewFrame(): the events of this frame reach the backend.
  static void feed() {
    ++feeds_;
    if (!events_.empty()) last_feed_ = feeds_;
    std::vector<int> seen;
    while (!events_.empty()) {
      const Event e = events_.front();
      if (e.action != kChar) {
        for (int k : seen)
          if (k == e.key) return;  // the rest waits for the next frame
        seen.push_back(e.key);
        if (e.action == GLFW_PRESS) ++presses_fed_;
        ImGui_ImplGlfw_KeyCallback(window_, e.key, e.scancode, e.action, e.mods);
      } else {
        ImGui_ImplGlfw_CharCallback(window_, e.codepoint);
      }
      events_.pop_front();
    }
  }

 private:
  static constexpr int kChar = -1;
  struct Event {
    int key, scancode, action, mods;
    unsigned int codepoint;
  };
  static inline GLFWwindow* window_ = nullptr;
  static inline std::deque<Event> events_;
  static inline long presses_received_ = 0, presses_fed_ = 0, feeds_ = 0, last_feed_ = 0;
};

}  // namespace memsim::platform
